"""Schema versions: Alembic upgrade/downgrade/current, and the daemon's start-up check.

The migrations ship inside the package (``malleable/db/migrations``) and are
configured here in code, so no alembic.ini is needed at run time. Each
function takes an Engine from `malleable.db.engine.make_engine` (so every
SQLite pragma applies to the migration's connection) and runs in one
transaction.

What the daemon does at start (`prepare_schema`):

* empty database (no tables, or every revision downgraded): it creates the
  schema itself by upgrading to head, so a fresh installation needs no extra
  step;
* schema at this malleable's head: it starts;
* older schema: `SchemaTooOld` ("run `malleable db upgrade`"); the daemon never
  upgrades an existing database on its own, so the admin can back it up first;
* newer schema (a revision this malleable does not know): `SchemaTooNew`,
  naming the revision found and, when recorded, the malleable version that
  wrote it;
* tables but no Alembic version, or another application's Alembic revision (not four
  digits like malleable's): `NotMalleableDatabase`, naming a few of them.

`upgrade` (``malleable db upgrade``) refuses such a database too: it creates the
schema only in an empty database or upgrades malleable's own, and never writes
malleable's tables beside another application's (nor fails half-way on a table of
the same name, e.g. ``jobs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, inspect, select

from malleable import __version__
from malleable.db.engine import describe_url, is_malleable_revision, readonly_engine
from malleable.db.errors import (
    NotMalleableDatabase,
    SchemaMissing,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
)
from malleable.db.models import Setting

MIGRATIONS = "malleable.db:migrations"
WRITTEN_BY_KEY = "schema.written_by"
VERSION_TABLE = "alembic_version"


def alembic_config(connection: Connection | None = None) -> AlembicConfig:
    """An Alembic configuration for malleable's migrations, optionally bound to ``connection``."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", MIGRATIONS)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    """The migration scripts shipped with this malleable."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this malleable knows (e.g. "0001")."""
    head = script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships migrations
        raise StoreError("malleable ships no migrations (broken installation)")
    return head


def known_revisions() -> list[str]:
    """Every revision this malleable knows, oldest first."""
    return [s.revision for s in reversed(list(script_directory().walk_revisions()))]


def revision_notes() -> list[tuple[str, str]]:
    """Every revision this malleable knows, newest first, as (id, one-line description).

    The description is the first paragraph of the migration script's docstring on
    one line, e.g. ``("0001", "The first schema: every table of the state store.")``;
    read from the scripts on each call (what ``malleable db downgrade --help`` lists).
    """
    return [(s.revision, " ".join((s.doc or "").split()))
            for s in script_directory().walk_revisions()]


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands.

    Attributes:
        where: the database (path or URL without password).
        current: the revision found (None: no malleable schema).
        head: this malleable's newest revision.
        known: this malleable knows ``current`` (False: a newer malleable wrote it).
        empty: no tables at all (or only an empty version table).
        written_by: the malleable version that last upgraded it ("" unknown).
        tables: the names of its tables but the version table, sorted.
    """

    where: str
    current: str | None
    head: str
    known: bool
    empty: bool
    written_by: str = ""
    tables: tuple[str, ...] = ()

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def foreign(self) -> bool:
        """Another application's database: tables, and no schema version or one that is
        not of malleable's form (`malleable.db.engine.is_malleable_revision`)."""
        return bool(self.tables) and (self.current is None
                                      or not is_malleable_revision(self.current))


def _status(conn: Connection, where: str) -> SchemaStatus:
    tables = set(inspect(conn).get_table_names())
    current = MigrationContext.configure(conn).get_current_revision()
    written_by = ""
    if Setting.__tablename__ in tables:
        row = conn.execute(select(Setting.value).where(Setting.key == WRITTEN_BY_KEY)).first()
        written_by = str(row[0]) if row is not None else ""
    head = head_revision()
    known = current is None or current in known_revisions()
    empty = current is None and not (tables - {VERSION_TABLE})
    return SchemaStatus(where, current, head, known, empty, written_by,
                        tuple(sorted(tables - {VERSION_TABLE})))


def _not_malleable(st: SchemaStatus) -> NotMalleableDatabase:
    """The error for a database with tables but no malleable schema version, naming up
    to five of its tables."""
    shown = ", ".join(st.tables[:5]) + (f" and {len(st.tables) - 5} more"
                                        if len(st.tables) > 5 else "")
    version = (f"no malleable schema version ({VERSION_TABLE})" if st.current is None else
               f"its {VERSION_TABLE} holds revision {st.current!r}, not one of malleable's "
               f"(four digits, e.g. {st.head})")
    return NotMalleableDatabase(
        f"{st.where}: not a malleable database: it holds tables ({shown}) but {version}; "
        f"malleable writes its tables only into an empty database or its own: give a new "
        f"file or an empty database")


def schema_status(engine: Engine) -> SchemaStatus:
    """Read the schema revision of the database behind ``engine`` (read-only).

    Raises:
        DatabaseUnavailable: the database cannot be read.
    """
    with readonly_engine(engine).connect() as conn, conn.begin():
        return _status(conn, describe_url(engine.url))


def _too_new(st: SchemaStatus) -> SchemaTooNew:
    if st.written_by == __version__:
        # The same version number, other code (a development build): say so once.
        who = (f"was written by another build of malleable {__version__} (this one knows "
               f"revisions up to {st.head})")
    else:
        by = f" by malleable {st.written_by}" if st.written_by else ""
        who = (f"was written{by}, a newer malleable than this one ({__version__}, which "
               f"knows revisions up to {st.head})")
    return SchemaTooNew(
        f"{st.where}: schema revision {st.current} {who}; upgrade malleable, or "
        f"downgrade the database with the newer malleable",
        found=st.current or "", expected=st.head, written_by=st.written_by)


def check_schema(engine: Engine) -> str:
    """Refuse a database whose schema is not this malleable's head.

    Returns:
        The head revision (the database is at it).

    Raises:
        SchemaMissing: no malleable schema yet ("run `malleable db upgrade`").
        SchemaTooOld: an older revision ("run `malleable db upgrade`").
        SchemaTooNew: a revision this malleable does not know (written by a newer one).
        NotMalleableDatabase: tables but no malleable schema version (none, or another
            application's Alembic revision).
        DatabaseUnavailable: the database cannot be read.
    """
    st = schema_status(engine)
    if st.up_to_date:
        return st.head
    if st.empty:
        raise SchemaMissing(f"{st.where}: the database has no malleable schema; "
                            f"run `malleable db upgrade`")
    if st.foreign:
        raise _not_malleable(st)
    if not st.known:
        raise _too_new(st)
    raise SchemaTooOld(f"{st.where}: schema revision {st.current} is older than this malleable's "
                       f"{st.head}; run `malleable db upgrade`",
                       found=st.current, expected=st.head)


def prepare_schema(engine: Engine, *, create_if_empty: bool = True) -> str:
    """What the daemon calls at start: create the schema in an empty database, then check it.

    Args:
        engine: from `make_engine`.
        create_if_empty: upgrade an empty database to head (default); False raises
            `SchemaMissing` instead.

    Returns:
        The head revision.

    Raises:
        as `check_schema`.
    """
    if create_if_empty and schema_status(engine).empty:
        upgrade(engine)
    return check_schema(engine)


def _record_writer(conn: Connection) -> None:
    if Setting.__tablename__ not in inspect(conn).get_table_names():
        return
    now = datetime.now(UTC)
    table = Setting.__table__
    updated = conn.execute(table.update().where(table.c.key == WRITTEN_BY_KEY)
                           .values(value=__version__, updated_at=now)).rowcount
    if not updated:
        conn.execute(table.insert().values(key=WRITTEN_BY_KEY, value=__version__, updated_at=now))


def upgrade(engine: Engine, to: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the schema to revision ``to`` (default the newest), in one transaction.

    Returns:
        (revision before, revision after); None means no schema.

    Raises:
        NotMalleableDatabase: the database holds tables but no malleable schema version
            (another application's): nothing is written to it.
        SchemaTooNew: the database is at a revision this malleable does not know.
        StoreError: ``to`` is not a known revision or is older than the current one.
        DatabaseUnavailable: the database cannot be written (read-only, disk full, ...).
    """
    where = describe_url(engine.url)
    with engine.connect() as conn, conn.begin():
        st = _status(conn, where)
        if st.foreign:
            raise _not_malleable(st)
        if not st.known:
            raise _too_new(st)
        target = _resolve(to, where)
        if st.current is not None and target != st.current:
            sd = script_directory()
            if target is None or target in [r.revision for r in
                                            sd.iterate_revisions(st.current, "base")]:
                raise StoreError(f"{where}: revision {to} is older than the current "
                                 f"{st.current}; use `malleable db downgrade {to}`")
        before = st.current
        _run(command.upgrade, conn, to, where)
        _record_writer(conn)
        after = MigrationContext.configure(conn).get_current_revision()
    return before, after


def downgrade(engine: Engine, to: str) -> tuple[str | None, str | None]:
    """Downgrade the schema to revision ``to`` ("base" drops every table), in one transaction.

    Returns:
        (revision before, revision after).

    Raises:
        SchemaTooNew: the database is at a revision this malleable does not know.
        NotMalleableDatabase: another application's database (`SchemaStatus.foreign`).
        StoreError: ``to`` is not a known revision or is newer than the current one.
        DatabaseUnavailable: the database cannot be written.
    """
    where = describe_url(engine.url)
    with engine.connect() as conn, conn.begin():
        st = _status(conn, where)
        if st.foreign:
            raise _not_malleable(st)
        if not st.known:
            raise _too_new(st)
        target = _resolve(to, where)
        if st.current is None:
            if target is None:
                return None, None
            raise StoreError(f"{where}: the database has no schema to downgrade")
        if target is not None and target != st.current and target not in [
                r.revision for r in script_directory().iterate_revisions(st.current, "base")]:
            raise StoreError(f"{where}: revision {to} is newer than the current "
                             f"{st.current}; use `malleable db upgrade --to {to}`")
        before = st.current
        _run(command.downgrade, conn, to, where)
        after = MigrationContext.configure(conn).get_current_revision()
    return before, after


def _resolve(rev: str, where: str) -> str | None:
    """A revision name -> its id (None for "base"): "base", "head" or one of
    `known_revisions` exactly (not Alembic's other forms, e.g. "heads" or "0003@head");
    raises StoreError naming the value and the known ones for anything else."""
    if rev == "base":
        return None
    if rev == "head":
        return head_revision()
    if rev not in known_revisions():
        raise StoreError(f"{where}: unknown revision {rev!r} (known: "
                         f"{', '.join(known_revisions())}, head, base)")
    return rev


def _run(fn, conn: Connection, rev: str, where: str) -> None:
    try:
        fn(alembic_config(conn), rev)
    except CommandError as exc:
        raise StoreError(f"{where}: {exc}") from exc
