"""Engine and session setup: the one place that opens the database.

SQLite (the default, ``sqlite:////var/lib/malleable/malleable.db``): every
connection gets

* ``journal_mode=WAL``: readers (admin commands) never block the daemon's
  writes and the writer never blocks readers;
* ``busy_timeout`` (``[database] busy_timeout_ms``): a writer waits for the
  write lock instead of failing with "database is locked";
* ``foreign_keys=ON``: deleting a job deletes its children (ON DELETE CASCADE);
* ``synchronous=FULL``: a commit is on disk when it returns, even across a
  power loss. In WAL mode NORMAL would survive a process crash too, but a
  power loss could roll back the last commits; the daemon commits a few times
  a minute and writes each action to the database *before* it changes Slurm,
  so the price of FULL (one more fsync per commit) is negligible and losing
  the record of a requeue that did happen is not acceptable;
* ``journal_size_limit`` 64 MiB: the WAL file is truncated back after a
  checkpoint instead of keeping its largest size forever.

WAL mode is written into the file, so it is not set on another application's
database (tables but no Alembic version table, `foreign_sqlite`): the schema
layer refuses such a database (`NotMalleableDatabase`), and the file is left as
it was.

Transactions: sqlite3's own implicit BEGIN is turned off and the engine
emits ``BEGIN IMMEDIATE`` for every transaction of a read-write session (the
write lock is taken up front and waited for under ``busy_timeout``; a
transaction that reads and then writes can never fail with SQLITE_BUSY on
upgrade), and plain ``BEGIN`` with ``PRAGMA query_only`` for read-only
sessions (``session_factory(engine, readonly=True)``), which never take the
write lock.

The database file is created with mode 0600 (its WAL and shared-memory files
inherit the mode) and its parent directory with mode 0700 if missing.

Any other SQLAlchemy URL (PostgreSQL via ``postgresql+psycopg://``) is used
as it is, with ``pool_pre_ping``.

Errors: an unusable database (not a database, read-only, disk full, cannot be
opened, server unreachable) raises `DatabaseUnavailable` naming the path (or
the URL without its password) and the cause, from `make_engine` and from any
later statement; SQLAlchemy's exception is its ``__cause__``.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from malleable.config import Config, DatabaseConfig
from malleable.db.errors import DatabaseUnavailable

WAL_SIZE_LIMIT_BYTES = 64 << 20
# An SQLite I/O error on a file system with less free space than this is reported as "disk full".
_FULL_BELOW_BYTES = 1 << 20
_READONLY_OPTION = "malleable_readonly"
_QUERY_ONLY_KEY = "malleable_query_only"  # conn.info: the PRAGMA query_only value set last

# sqlite3 messages (lower case) -> the cause we report; anything else keeps SQLite's words.
_SQLITE_CAUSES = {
    "file is not a database": "not an SQLite database (file is not a database)",
    "database disk image is malformed": "database file is corrupt (disk image is malformed)",
    "database or disk is full": "disk full (database or disk is full)",
    "attempt to write a readonly database": "read-only (attempt to write a readonly database)",
    "unable to open database file": "cannot open the database file",
    "disk i/o error": "disk I/O error",
    "database is locked": "database is locked (another process held the write lock longer "
                          "than busy_timeout)",
}


def describe_url(url: str | URL) -> str:
    """Where a database is, for messages: the file path for SQLite, else the URL without password."""
    try:
        u = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return str(url)
    if u.get_backend_name() == "sqlite":
        return u.database or ":memory:"
    return u.render_as_string(hide_password=True)


def sqlite_path(url: str | URL) -> Path | None:
    """The database file of an SQLite URL, None for in-memory SQLite or another backend."""
    u = make_url(url) if isinstance(url, str) else url
    if u.get_backend_name() != "sqlite":
        return None
    db = u.database or ""
    if db in ("", ":memory:") or db.startswith("file:") or u.query.get("mode") == "memory":
        return None
    return Path(db)


def _free_bytes(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _cause_of(exc: BaseException, path: Path | None = None) -> str:
    """One line saying why ``exc`` happened; for SQLite I/O errors, whether the disk is full."""
    orig = getattr(exc, "orig", None) or exc
    msg = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if not isinstance(orig, sqlite3.Error):
        return msg
    cause = _SQLITE_CAUSES.get(msg.lower(), msg)
    if msg.lower() == "disk i/o error":
        name = getattr(orig, "sqlite_errorname", "")
        cause = f"disk I/O error ({name})" if name else cause
        free = _free_bytes(path)
        if free is not None and free < _FULL_BELOW_BYTES:
            cause = f"disk full ({free} bytes free; {cause})"
    return cause


def sqlite_cause(exc: BaseException, path: Path | None = None) -> str:
    """Why an SQLite error happened, in the words `make_engine`'s errors use ("not an
    SQLite database (...)", "disk full (N bytes free; ...)", ...), for an engine opened
    elsewhere (`malleable.ops.access.readonly_sqlite_engine`).

    Args:
        exc: the error (an ``sqlite3.Error``, or SQLAlchemy's wrapping one).
        path: the database file, to tell a full disk from another I/O error.
    """
    return _cause_of(exc, path)


def _is_unavailable(exc: BaseException) -> bool:
    """True for errors that mean the database itself is unusable (not a bug in a statement)."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, sqlite3.OperationalError | sqlite3.DatabaseError) and not isinstance(
            orig, sqlite3.IntegrityError | sqlite3.ProgrammingError):
        msg = str(orig).lower()
        return any(k in msg for k in _SQLITE_CAUSES) or "disk i/o" in msg
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    name = type(orig).__module__ if orig is not None else ""
    # psycopg: a failed connection attempt (server down, bad socket, auth refused)
    return name.startswith("psycopg") and type(orig).__name__ == "OperationalError"


def missing_dirs(path: Path) -> list[Path]:
    """The directories of ``path`` (itself included) that do not exist, outermost first."""
    out: list[Path] = []
    for d in [path, *path.parents]:
        if d.exists():
            break
        out.append(d)
    return out[::-1]


def _create_sqlite_file(path: Path) -> None:
    """Create the missing directories above the file, each 0700, and an empty database
    file (0600) if missing; through a symbolic link, the file it points to."""
    where = str(path)
    real = Path(os.path.realpath(path))
    try:
        for d in missing_dirs(real.parent):
            d.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(where, f"cannot create directory {exc.filename or d}: "
                                  f"{exc.strerror or exc}") from exc
    try:
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise DatabaseUnavailable(where, f"cannot create the database file: "
                                  f"{exc.strerror or exc}") from exc
    os.close(fd)


def check_readable_sqlite_file(path: Path) -> None:
    """Refuse an SQLite file that a command which only reads cannot use: missing (it is
    not created), a directory, unreadable, or empty. Unlike `make_engine`, a file the
    caller may not write passes.

    Raises:
        DatabaseUnavailable: naming the path and the cause, as `make_engine` words it.
    """
    _check_sqlite_file(path, create=False, write=False)


def _check_sqlite_file(path: Path, create: bool, write: bool = True) -> None:
    where = str(path)
    if path.is_dir():
        raise DatabaseUnavailable(where, "is a directory, not a database file")
    if not path.exists():
        if not create:
            raise DatabaseUnavailable(where, "no such database file (run `malleable db upgrade` "
                                      "to create it)")
        _create_sqlite_file(path)
        return
    if not os.access(path, os.R_OK):
        raise DatabaseUnavailable(where, "permission denied (cannot read the file)")
    if not create and _empty_sqlite_file(path):
        # SQLite would take it for an empty database and our connect hook would write
        # a header into it: a command that only reads must not change a file.
        raise DatabaseUnavailable(where, "an empty file, not a state store (run `malleable "
                                  "db upgrade` to create one)")
    if write and not os.access(path, os.W_OK):
        why = ("read-only file system" if _on_readonly_fs(path)
               else "read-only file (no write permission)")
        raise DatabaseUnavailable(where, why)


def _empty_sqlite_file(path: Path) -> bool:
    """A 0-byte file with no write-ahead log beside it (a store this package opened has
    its header: setting WAL mode writes it)."""
    try:
        if path.stat().st_size:
            return False
        wal = path.with_name(path.name + "-wal")
        return not (wal.exists() and wal.stat().st_size)
    except OSError:
        return False


def _on_readonly_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


# The version table of malleable's schema (malleable.db.schema.VERSION_TABLE, which
# imports this module).
_VERSION_TABLE = "alembic_version"


def foreign_sqlite(dbapi_conn: Any) -> bool:
    """Whether an SQLite database is another application's, which malleable must not
    write to (the schema layer refuses it): it holds tables but no schema version
    table, or a version table with a revision that is not malleable's (another
    application's Alembic).

    Args:
        dbapi_conn: an open sqlite3 connection.

    Returns:
        True if it has a table (SQLite's own ``sqlite_*`` aside) and either none is
        ``alembic_version`` or that holds a revision not of malleable's form
        (`MALLEABLE_REVISION`); False for an empty database or a malleable one.

    Raises:
        sqlite3.DatabaseError: the file is not a database (or cannot be read).
    """
    names = {row[0] for row in dbapi_conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
        "ESCAPE '\\'")}
    if not names:
        return False
    if _VERSION_TABLE not in names:
        return True
    return not all(is_malleable_revision(row[0]) for row in dbapi_conn.execute(
        f"SELECT version_num FROM {_VERSION_TABLE}"))


#: malleable's schema revisions are four digits ("0001", ...: malleable/db/migrations), so
#: a newer malleable's too; another application's Alembic revisions are hex ids.
MALLEABLE_REVISION = re.compile(r"\d{4}")


def is_malleable_revision(revision: object) -> bool:
    """Whether ``revision`` (an ``alembic_version.version_num``) has the form of
    malleable's revisions (`MALLEABLE_REVISION`), known to this malleable or not."""
    return isinstance(revision, str) and MALLEABLE_REVISION.fullmatch(revision) is not None


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Our own BEGIN (below) instead of sqlite3's implicit one.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            # (not in another application's database: the mode is written into the file)
            if not foreign_sqlite(dbapi_conn):
                mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode and str(mode[0]).lower() != "wal" and engine.url.database not in (
                        None, "", ":memory:"):
                    raise sqlite3.OperationalError(
                        f"cannot switch to WAL (journal_mode={mode[0]})")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute("PRAGMA synchronous = FULL")
            cur.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        readonly = bool(conn.get_execution_options().get(_READONLY_OPTION))
        # query_only is a property of the SQLite connection: set it only when it changes
        # (conn.info lives as long as the DBAPI connection; a new connection starts unset).
        if conn.info.get(_QUERY_ONLY_KEY) is not readonly:
            conn.exec_driver_sql(f"PRAGMA query_only = {'ON' if readonly else 'OFF'}")
            conn.info[_QUERY_ONLY_KEY] = readonly
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def _install_error_hook(engine: Engine, where: str, path: Path | None) -> None:
    @event.listens_for(engine, "handle_error")
    def _on_error(ctx: ExceptionContext) -> None:
        exc = ctx.sqlalchemy_exception
        conn = ctx.connection
        if (conn is not None and conn.get_execution_options().get(_READONLY_OPTION)
                and "readonly" in str(ctx.original_exception).lower()):
            return  # a write in a read-only session: the caller's bug, not the database's
        if exc is not None and _is_unavailable(exc):
            raise DatabaseUnavailable(where, _cause_of(exc, path)) from exc


def make_engine(url: str, *, busy_timeout_ms: int = 30000, create: bool = True,
                echo: bool = False) -> Engine:
    """Open the database at ``url`` and check that it can be used.

    Args:
        url: an SQLAlchemy URL: ``sqlite:////abs/path.db`` (``sqlite:///rel.db``
            is relative to the working directory; ``sqlite://`` is in memory)
            or e.g. ``postgresql+psycopg://user@host/db``.
        busy_timeout_ms: SQLite only: how long a writer waits for the write lock, ms.
        create: SQLite only: create a missing database file (mode 0600) and its
            directory; with False a missing file raises `DatabaseUnavailable`.
        echo: log every statement (debugging).

    Returns:
        An Engine, already connected once (so a bad database fails here, not later).

    Raises:
        DatabaseUnavailable: the URL is malformed or names an unknown driver, or the
            database cannot be created, opened, read or written (message names the
            path or URL and the cause).
    """
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise DatabaseUnavailable(str(url), "not a valid SQLAlchemy URL") from exc
    where = describe_url(u)
    path = sqlite_path(u)
    kwargs: dict[str, Any] = {"echo": echo}
    if u.get_backend_name() == "sqlite":
        if path is not None:
            _check_sqlite_file(path, create)
        # The pool hands a connection to one thread at a time (APScheduler runs jobs in threads).
        kwargs["connect_args"] = {"check_same_thread": False,
                                  "timeout": max(busy_timeout_ms, 0) / 1000.0}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(u, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        raise DatabaseUnavailable(where, f"no driver for {u.drivername} ({exc})") from exc
    if u.get_backend_name() == "sqlite":
        _install_sqlite_hooks(engine, busy_timeout_ms)
    _install_error_hook(engine, where, path)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            if path is not None:
                # Reading the schema makes SQLite read page 1: a non-database fails here.
                conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()
    except DatabaseUnavailable:
        engine.dispose()
        raise
    except DBAPIError as exc:
        engine.dispose()
        raise DatabaseUnavailable(where, _cause_of(exc, path)) from exc
    except OSError as exc:
        engine.dispose()
        cause = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise DatabaseUnavailable(where, cause) from exc
    return engine


def engine_from_config(config: Config | DatabaseConfig, *, url: str | None = None,
                       create: bool = True) -> Engine:
    """`make_engine` with the settings of ``[database]``.

    Args:
        config: the whole `Config` or its `DatabaseConfig`.
        url: overrides ``config.database.url`` (the ``--database-url`` option).
        create: as in `make_engine`.

    Raises:
        DatabaseUnavailable: as `make_engine`; or an in-memory SQLite URL: a state store
            that vanishes when the process exits and that no other command can read (the
            simulator opens its private in-memory store with `make_engine` itself).
    """
    db = config.database if isinstance(config, Config) else config
    target = url or db.url
    u = make_url(target)
    if u.get_backend_name() == "sqlite" and sqlite_path(u) is None:
        key = "--database-url" if url else "database.url"
        raise DatabaseUnavailable(f"{key} = {target!r}", "an in-memory SQLite database: the state "
                                  "would vanish at exit and no other command could read it; "
                                  "give a file, sqlite:////ABS/PATH.db")
    return make_engine(target, busy_timeout_ms=db.busy_timeout_ms, create=create)


def session_factory(engine: Engine, *, readonly: bool = False) -> sessionmaker[Session]:
    """A sessionmaker bound to ``engine``.

    Args:
        engine: from `make_engine`.
        readonly: on SQLite, sessions start with plain ``BEGIN`` and
            ``PRAGMA query_only`` (never take the write lock; a write raises
            an error); otherwise every transaction starts with ``BEGIN
            IMMEDIATE``. Ignored on other backends.

    Returns:
        A sessionmaker; ``expire_on_commit=False`` so objects stay readable after commit.

    Usage::

        with session_factory(engine)() as s, s.begin():
            store.upsert_jobs(s, jobs, now)
    """
    bind = engine.execution_options(**{_READONLY_OPTION: True}) if readonly else engine
    return sessionmaker(bind=bind, expire_on_commit=False)


def readonly_engine(engine: Engine) -> Engine:
    """A view of ``engine`` whose transactions are read-only (see `session_factory`)."""
    return engine.execution_options(**{_READONLY_OPTION: True})
