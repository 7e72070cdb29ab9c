"""``malleable db``: create, upgrade, inspect and downgrade the state store's schema.

Commands::

    malleable db upgrade [--to REV]   create or upgrade the schema (default: newest)
    malleable db current              print the schema revision and whether it is current
    malleable db downgrade REV        downgrade to REV ("base" drops every table)

Each takes ``--config PATH`` (the TOML file) and ``--database-url URL``
(overrides ``[database] url``). A database that cannot be used (not SQLite,
read-only, disk full, unreachable), a bad configuration, a schema from a
newer malleable or, for ``upgrade``, another application's database (tables but
no malleable schema version: `schema.upgrade` refuses to write beside them)
prints one line ``malleable db CMD: error: WHERE: CAUSE`` on stderr and exits
with 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from sqlalchemy import Engine

from malleable.config import (
    Config,
    ConfigError,
    check_database_url,
    load_config,
)
from malleable.db import schema
from malleable.db.engine import (
    check_readable_sqlite_file,
    describe_url,
    engine_from_config,
    missing_dirs,
    sqlite_path,
)
from malleable.db.errors import StoreError


def store_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--config PATH`` and ``--database-url URL``: how every command that opens
    the state store finds it (``malleable db`` and the admin commands)."""
    fn = click.option("--database-url", "database_url", metavar="URL", default=None,
                      help="SQLAlchemy URL of the database (overrides [database] url).")(fn)
    fn = click.option("--config", "config_path", metavar="PATH", default=None,
                      type=click.Path(dir_okay=False),
                      help="configuration file (default $MALLEABLE_CONFIG or "
                           "/etc/malleable/malleable.toml).")(fn)
    return fn


_CONFIG_KEY = "malleable.config"   # ctx.meta: the configuration the command runs with


def _fail(ctx: click.Context, message: str) -> None:
    click.echo(f"malleable db {ctx.info_name}: error: {message}", err=True)
    ctx.exit(2)


def _readonly_engine(config: Config, database_url: str | None) -> Engine:
    """An engine that only reads the database (``db current``): an SQLite file through
    SQLite's read-only mode (`malleable.ops.access.readonly_sqlite_engine`: no switch
    to WAL, no -wal or -shm file created, works without write permission), another
    database as `engine_from_config` opens it (`schema.schema_status` reads it in a
    read-only transaction).

    Raises:
        DatabaseUnavailable: missing, unreadable, not a database, or in memory.
    """
    url = database_url or config.database.url
    path = sqlite_path(url)
    if path is None:   # not SQLite, or in memory (which engine_from_config refuses)
        return engine_from_config(config, url=database_url, create=False)
    check_readable_sqlite_file(path)
    # (the admin commands' read-only opening; imported here: malleable.ops imports this module)
    from malleable.ops.access import readonly_sqlite_engine

    return readonly_sqlite_engine(path, config.database.busy_timeout_ms, no_new_files=True)


def _with_engine(create: bool, readonly: bool = False
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Open the database from the options, pass the engine on, turn store errors into exit 2.

    ``readonly``: open it only to read (`_readonly_engine`), for a command that never
    writes; ``create`` must then be False.
    """

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(config_path: str | None, database_url: str | None, **kw: Any) -> None:
            ctx = click.get_current_context()
            engine: Engine | None = None
            new_file: Path | None = None   # an SQLite file this command creates
            new_dirs: list[Path] = []       # and the directories above it it creates
            done = False
            try:
                config = load_config(config_path)
                if database_url is not None:   # checked as [database] url is ('' included)
                    check_database_url("--database-url", database_url)
                if create:
                    new_file = _missing_sqlite_file(database_url or config.database.url)
                    new_dirs = missing_dirs(new_file.parent) if new_file is not None else []
                engine = (_readonly_engine(config, database_url) if readonly else
                          engine_from_config(config, url=database_url, create=create))
                ctx.meta[_CONFIG_KEY] = config
                fn(engine, **kw)
                done = True
                for d in new_dirs:
                    click.echo(f"created directory {d} (mode {_mode(d)})")
                if new_file is not None:
                    click.echo(f"created {new_file} (mode {_mode(new_file)})")
            except (StoreError, ConfigError) as exc:
                _fail(ctx, str(exc))
            except OSError as exc:   # e.g. another user's 0600 database file
                where = f"{exc.filename}: " if exc.filename else ""
                _fail(ctx, f"{where}{exc.strerror or exc}")
            finally:
                if engine is not None:
                    engine.dispose()
                if not done and new_file is not None:
                    _remove_sqlite_file(new_file)
                    for d in reversed(new_dirs):   # only if still empty
                        with contextlib.suppress(OSError):
                            d.rmdir()

        return wrapper

    return deco


def _missing_sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL if it does not exist yet (else, or not SQLite: None)."""
    try:
        path = sqlite_path(url)
    except Exception:   # a malformed URL: make_engine names it
        return None
    if path is None or path.exists():
        return None
    return Path(os.path.realpath(path))   # through a symbolic link: the file it names


def _mode(path: Path) -> str:
    """A file's permission bits as ls shows them in octal, e.g. 0700 ("?" if gone)."""
    try:
        return f"{stat.S_IMODE(os.stat(path).st_mode):04o}"
    except OSError:
        return "?"


def _remove_sqlite_file(path: Path) -> None:
    """Remove a database file a failed command created (and its journal, WAL and shared
    memory files), so that nothing half-made is left: the next try starts afresh."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            path.with_name(path.name + suffix).unlink(missing_ok=True)


class _RevisionsCommand(click.Command):
    """A ``db`` command whose help lists the revisions REV may name: read from the
    migration scripts (`schema.revision_notes`) when the help is shown, newest first,
    then "base" if ``with_base`` (`downgrade`; `upgrade` has nothing to do there)."""

    with_base = False

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help_text(ctx, formatter)
        notes = schema.revision_notes()
        rows = [(f"{rev} (head)" if i == 0 else rev, doc) for i, (rev, doc) in enumerate(notes)]
        if self.with_base:
            rows.append(("base", "No schema: drops every table."))
        with formatter.section("Revisions (newest first)"):
            formatter.write_dl(rows)


class _DowngradeCommand(_RevisionsCommand):
    """``db downgrade``'s help: the revisions, then "base"."""

    with_base = True


@click.group()
def db() -> None:
    """Create, upgrade and inspect the state store's schema.

    The database: --database-url, else $MALLEABLE_DATABASE_URL, else [database]
    url of the configuration file (--config, $MALLEABLE_CONFIG or
    /etc/malleable/malleable.toml), else sqlite:////var/lib/malleable/malleable.db.
    """


@db.command(cls=_RevisionsCommand)
@store_options
@click.option("--to", "to", default="head", show_default=True, metavar="REV",
              help="revision to upgrade to.")
@click.option("--force", is_flag=True,
              help="Upgrade even while a daemon holds the lease with a fresh heartbeat.")
@_with_engine(create=True)
def upgrade(engine: Engine, to: str, force: bool) -> None:
    """Create the schema in an empty database or upgrade it (creates a missing SQLite file
    and its missing directories, and says so; if that fails, they are removed again).

    A database that holds other tables but no malleable schema version (another
    application's) is refused, naming a few of its tables; nothing is written to it.
    Stop the daemon first (systemctl stop malleable): the command refuses while a
    daemon holds the lease with a heartbeat within [daemon] lease_timeout_s (or the
    holder's own, if larger), unless --force (a migration locks the tables it changes,
    and the running daemon's cycles fail until it ends).
    """
    if not force:
        _refuse_while_running(engine)
    before, after = schema.upgrade(engine, to)
    where = describe_url(engine.url)
    if before == after:
        click.echo(f"{where}: schema already at revision {after or 'base (empty)'}")
    else:
        click.echo(f"{where}: schema upgraded from {before or 'empty'} to {after}")


@db.command()
@store_options
@_with_engine(create=False, readonly=True)
def current(engine: Engine) -> None:
    """Print the database's schema revision and this malleable's newest one (read-only:
    works on a file you may only read, and changes nothing)."""
    st = schema.schema_status(engine)
    if st.foreign or (st.current is not None and not st.known):
        schema.check_schema(engine)  # raises NotMalleableDatabase or SchemaTooNew (exit 2)
    if st.current is None:
        click.echo(f"{st.where}: empty: run `malleable db upgrade` (head {st.head})")
    elif st.up_to_date:
        click.echo(f"{st.where}: {st.current} (head)")
    else:
        click.echo(f"{st.where}: {st.current} (older than head {st.head}: "
                   f"run `malleable db upgrade`)")


def _live_holder(engine: Engine, timeout_s: float) -> str | None:
    """The daemon holding the lease if it is live by `malleable.db.lease.lease_health`
    (heartbeat within the larger of ``timeout_s`` and the holder's own timeout, seconds;
    not a gone process of this host), as "host:pid (heartbeat N s ago)". None: no live
    daemon, or no lease table to read."""
    from datetime import UTC, datetime

    from sqlalchemy.exc import DBAPIError

    from malleable.db.lease import lease_health, read_lease

    try:
        lease = read_lease(engine)
    except (StoreError, DBAPIError):   # an empty or older schema: no lease to honour
        return None
    h = lease_health(lease, datetime.now(UTC), timeout_s)
    return f"{h.holder} (heartbeat {h.heartbeat_age_s:.0f} s ago)" if h.live else None


def _refuse_while_running(engine: Engine) -> None:
    """Exit 2, naming the holder, when a live daemon holds the lease (`_live_holder`,
    with [daemon] lease_timeout_s): a schema change under it fails its cycles."""
    ctx = click.get_current_context()
    holder = _live_holder(engine, ctx.meta[_CONFIG_KEY].daemon.lease_timeout_s)
    if holder is not None:
        _fail(ctx, f"a daemon is running on this database: {holder}; stop it first "
                   "(systemctl stop malleable), or pass --force")


@db.command(cls=_DowngradeCommand)
@store_options
@click.argument("rev")
@click.option("--force", is_flag=True,
              help="Downgrade even while a daemon holds the lease with a fresh heartbeat.")
@_with_engine(create=False)
def downgrade(engine: Engine, rev: str, force: bool) -> None:
    """Downgrade the schema to REV ("base": drop every table). Destroys data of newer tables.

    Stop the daemon first (systemctl stop malleable): the command refuses while a
    daemon holds the lease with a heartbeat within [daemon] lease_timeout_s (or the
    holder's own, if larger), unless --force.
    """
    if not force:
        _refuse_while_running(engine)
    before, after = schema.downgrade(engine, rev)
    where = describe_url(engine.url)
    if before == after:
        click.echo(f"{where}: schema already at {after or 'base (empty)'}: nothing to downgrade")
    else:
        click.echo(f"{where}: schema downgraded from {before or 'empty'} to {after or 'base'}")
