"""The state store's error hierarchy.

Every failure the store reports to its callers is a `StoreError`; its message
is one line that names the database (path or URL, password hidden) and the
cause, so the command line can print it as it is (exit code 2) and the daemon
can log it. SQLAlchemy's own exceptions for an unusable database (not SQLite,
read-only, disk full, cannot open, connection refused) never reach a caller:
`malleable.db.engine` turns them into `DatabaseUnavailable`.
"""

from __future__ import annotations

from datetime import datetime


class StoreError(Exception):
    """Any failure of the state store; ``str(exc)`` is a one-line message."""


class DatabaseUnavailable(StoreError):
    """The database cannot be opened, read or written.

    Attributes:
        where: the file path (SQLite) or the URL with its password hidden.
        cause: what went wrong, in words ("file is not a database",
            "database or disk is full", "read-only file", ...).
    """

    def __init__(self, where: str, cause: str):
        super().__init__(f"{where}: {cause}")
        self.where = where
        self.cause = cause


class SchemaError(StoreError):
    """The database's schema is not the one this malleable works with."""


class SchemaMissing(SchemaError):
    """The database is empty (no malleable schema): run ``malleable db upgrade``."""


class SchemaTooOld(SchemaError):
    """The schema is older than this malleable's: run ``malleable db upgrade``.

    Attributes:
        found: the revision the database is at; expected: this malleable's head.
    """

    def __init__(self, message: str, *, found: str, expected: str):
        super().__init__(message)
        self.found = found
        self.expected = expected


class SchemaTooNew(SchemaError):
    """The schema was written by a newer malleable than this one.

    Attributes:
        found: the revision the database is at (unknown to this malleable).
        expected: this malleable's head revision.
        written_by: the malleable version that last upgraded the database ("" if unknown).
    """

    def __init__(self, message: str, *, found: str, expected: str, written_by: str = ""):
        super().__init__(message)
        self.found = found
        self.expected = expected
        self.written_by = written_by


class NotMalleableDatabase(SchemaError):
    """The database holds tables but no malleable schema version (someone else's database)."""


class CorruptSetting(StoreError):
    """A row of the ``settings`` table whose value is not valid JSON, or not the kind of
    value its key holds (the database was edited by hand: every writer stores JSON of
    the right kind).

    Attributes:
        key: the setting's key; text: its stored value as text (shortened in the message).
    """

    def __init__(self, key: str, text: str, fix: str = "", why: str = "not valid JSON"):
        shown = text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
        super().__init__(f"settings row {key!r} holds {shown!r}, which is {why} (was the "
                         f"database edited by hand?)" + (f"; {fix}" if fix else ""))
        self.key = key
        self.text = text


class LeaseError(StoreError):
    """A failure of the single-daemon lease."""


class LeaseHeld(LeaseError):
    """Another daemon holds the lease and its heartbeat is fresh.

    Attributes:
        holder: "host:pid" of the holder; heartbeat_at: its last heartbeat (UTC);
        acquired_at: when it acquired the lease (UTC).
    """

    def __init__(self, message: str, *, holder: str, heartbeat_at: datetime,
                 acquired_at: datetime | None = None):
        super().__init__(message)
        self.holder = holder
        self.heartbeat_at = heartbeat_at
        self.acquired_at = acquired_at


class LeaseLost(LeaseError):
    """This daemon no longer holds the lease (another one took it over): it must stop."""
