"""Opening the state store for an admin command: read-only for the commands that only
read, read-write for those that change settings.

Who can read: the daemon creates its SQLite database with mode 0600 in a 0700
directory (`malleable.db.engine`), so by default only root reads it (``sudo
malleable status``). docs/operator-guide.md ("Who may do what") shows how to
give the operator group read access (group ownership, 0750 directory, 0640
file; SQLite gives the ``-wal`` and ``-shm`` files the database file's mode and
owner). A user who may read but not write the file cannot use
`malleable.db.engine.make_engine` (it refuses a file it cannot write, which is
right for the daemon), so this module opens such a file itself through
SQLite's read-only mode (``mode=ro``): that works while the daemon runs (its
``-wal`` and ``-shm`` files exist); when the daemon is stopped and its last
connection removed them, the file is fully checkpointed and is opened as
``immutable`` instead (a daemon starting during that read could make it see a
half-written page; the read takes milliseconds and only prints).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from malleable.config import Config, check_database_url, load_config
from malleable.db.engine import (
    describe_url,
    engine_from_config,
    session_factory,
    sqlite_cause,
    sqlite_path,
)
from malleable.db.errors import DatabaseUnavailable
from malleable.db.schema import check_schema

READ_HINT = ("reading needs read access to the database file, its -wal and -shm files and "
             "search access to its directory: run as root (sudo) or see docs/operator-guide.md, "
             "'Who may do what'")


WRITE_HINT = ("changing settings needs write access to the database file: run it with sudo, or "
              "see docs/operator-guide.md, 'Who may do what'")


def effective_config(config_path: str | None, database_url: str | None) -> Config:
    """The configuration for a command: the file (or defaults), then ``--database-url``.

    Raises:
        ConfigError: the file is missing (when named), unreadable or invalid, or
            ``--database-url`` is not a supported URL (the same check as ``[database] url``,
            `malleable.config.check_database_url`; a NUL byte is refused there too).
    """
    config = load_config(config_path)
    if database_url is not None:   # '' too: an empty URL is refused, not ignored
        check_database_url("--database-url", database_url)
        config = dataclasses.replace(
            config, database=dataclasses.replace(config.database, url=database_url))
    return config


@dataclass
class Store:
    """An open state store for one command.

    Attributes:
        engine: the SQLAlchemy engine (disposed by `open_store` on exit).
        sessions: a sessionmaker (read-only sessions unless opened for writing).
        where: the database as named in messages (path, or URL without password).
        readonly_file: True when opened through SQLite's read-only mode because
            the caller may not write the file.
    """

    engine: Engine
    sessions: sessionmaker[Session]
    where: str
    readonly_file: bool = False


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except PermissionError:
        raise DatabaseUnavailable(str(path), f"permission denied ({READ_HINT})") from None
    except OSError as exc:
        raise DatabaseUnavailable(str(path), exc.strerror or str(exc)) from None


def _connect_readonly(path: Path, timeout_s: float, *,
                      no_new_files: bool = False) -> sqlite3.Connection:
    """A read-only sqlite3 connection to ``path`` (see the module docstring).

    ``no_new_files``: with no ``-wal`` file beside it (no daemon has it open; the file
    is fully checkpointed), open it as ``immutable`` at once: a read-only connection
    to a WAL database that may write its directory creates the ``-wal`` and ``-shm``
    files and leaves them behind.

    Raises:
        sqlite3.Error: it cannot be opened or read.
    """
    uri = f"file:{quote(str(path))}?mode=ro"
    if no_new_files and not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        wal = Path(f"{path}-wal")
        if "readonly" not in str(exc).lower() or wal.exists():
            raise
        conn = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=timeout_s,
                               check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    conn.execute("PRAGMA query_only = ON")
    return conn


def readonly_sqlite_engine(path: Path, busy_timeout_ms: int = 30000, *,
                           no_new_files: bool = False) -> Engine:
    """An engine that reads the SQLite database ``path`` without write access to it.

    ``no_new_files``: create no file beside it either, even where the caller could
    (`_connect_readonly`; ``malleable db current``).

    Raises:
        DatabaseUnavailable: it cannot be opened or read (message names the path and
            the cause, with a hint on the permissions reading needs).
    """
    where = str(path)

    def creator() -> sqlite3.Connection:
        return _connect_readonly(path, busy_timeout_ms / 1000.0, no_new_files=no_new_files)

    # The file's URL (the creator opens it): messages that name the engine's database,
    # e.g. the schema check's, name the file, not ":memory:".
    engine = create_engine(URL.create("sqlite", database=where), creator=creator,
                           poolclass=NullPool)

    @event.listens_for(engine, "handle_error")
    def _on_error(ctx: ExceptionContext) -> None:
        orig = ctx.original_exception
        if isinstance(orig, sqlite3.OperationalError | sqlite3.DatabaseError):
            raise DatabaseUnavailable(where, _cause(orig, path)) from orig

    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sqlite3.Error as exc:  # raised by the creator, before SQLAlchemy wraps anything
        engine.dispose()
        raise DatabaseUnavailable(where, _cause(exc, path)) from exc
    return engine


def _cause(exc: BaseException, path: Path | None = None) -> str:
    msg = str(exc).strip() or type(exc).__name__
    low = msg.lower()
    if "unable to open" in low or "readonly" in low or "permission" in low:
        return f"{msg} ({READ_HINT})"
    # Not a database, corrupt, a full disk (a reader of a WAL database may need to grow
    # its -shm file), ...: as the read-write opening words them.
    return sqlite_cause(exc, path)


@contextmanager
def open_store(config: Config, *, write: bool = False) -> Iterator[Store]:
    """Open the configured state store and check its schema; dispose of it on exit.

    Args:
        config: settings (``[database]``).
        write: sessions may write (pause, resume, policy set); otherwise sessions
            are read-only, and an SQLite file the caller cannot write is opened
            read-only (see the module docstring).

    Yields:
        `Store`.

    Raises:
        DatabaseUnavailable: missing, unreadable or not a database (message names it).
        SchemaError: an empty database, or a schema older or newer than this malleable's.
    """
    url = config.database.url
    path = sqlite_path(url)
    readonly_file = False
    if path is not None and write and _stat(path) is not None and not os.access(path, os.W_OK):
        raise DatabaseUnavailable(str(path), f"read-only for you (no write permission); {WRITE_HINT}")
    if path is not None and not write:
        st = _stat(path)
        if st is not None and not os.access(path, os.R_OK):
            raise DatabaseUnavailable(str(path), f"permission denied ({READ_HINT})")
        # Read-only too where SQLite could not create the -wal and -shm files next to
        # it (a group-writable file in a directory the caller cannot write, as the
        # operator guide sets up, once the daemon's last connection removed them).
        readonly_file = st is not None and not (
            os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK))
    if readonly_file:
        engine = readonly_sqlite_engine(path, config.database.busy_timeout_ms)
    else:
        engine = engine_from_config(config, create=False)
    try:
        check_schema(engine)
        sessions = session_factory(engine, readonly=not write)
        yield Store(engine, sessions, describe_url(url), readonly_file)
    finally:
        engine.dispose()
