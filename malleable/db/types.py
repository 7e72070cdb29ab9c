"""Column types shared by the models and the migrations.

`UTCDateTime`: a timezone-aware UTC `datetime` in Python. Storage:

* SQLite: an INTEGER, microseconds since the Unix epoch (1970-01-01 UTC).
  Exact, compact (6 bytes for present-day times instead of 26 for ISO text),
  and ordered like time. To read it by hand:
  ``SELECT datetime(t / 1000000, 'unixepoch') FROM progress_samples``.
* PostgreSQL (and any other backend): ``TIMESTAMP WITH TIME ZONE``, read back
  and converted to UTC.

A naive `datetime` is refused (`ValueError` naming the value): a time whose
zone is unknown would be silently wrong after a DST change or on a host not
in UTC.

`JSONDoc`: JSON on SQLite (TEXT), JSONB on PostgreSQL.

`SharedJSON`: a read-side type for a `JSONDoc` column whose few distinct documents
are read over and over (``type_coerce(column, SharedJSON())`` in a select): each
distinct text is decoded once and the same dict is returned for it after that,
so the values must be treated as read-only.

These types are used by the frozen migration scripts too, so their storage
must never change; a new storage format is a new type and a migration.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def to_micros(value: datetime) -> int:
    """An aware datetime -> integer microseconds since the Unix epoch (UTC).

    Raises:
        ValueError: ``value`` is naive (has no tzinfo).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"time {value.isoformat()}: a naive datetime; "
                         "pass a timezone-aware one (e.g. datetime.now(UTC))")
    return (value - _EPOCH) // _US


def from_micros(value: int) -> datetime:
    """Integer microseconds since the Unix epoch -> an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=int(value))


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime; INTEGER microseconds on SQLite, TIMESTAMPTZ elsewhere."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(BigInteger())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise ValueError(f"time {value!r}: expected a datetime, got {type(value).__name__}")
        if dialect.name == "sqlite":
            return to_micros(value)
        to_micros(value)  # refuses a naive datetime on every backend alike
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return from_micros(value)
        if value.tzinfo is None:  # a backend without time zones stores UTC
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# Integer primary keys: SQLite makes only INTEGER PRIMARY KEY an alias of the rowid
# (autoincrementing, 8 bytes max); elsewhere a 64-bit key for tables that grow fast.
BigId = BigInteger().with_variant(Integer(), "sqlite")

JSONDoc = JSON().with_variant(JSONB(), "postgresql")


@lru_cache(maxsize=4096)
def _decoded(text: str) -> Any:
    return json.loads(text)


class SharedJSON(TypeDecorator):
    """Read a `JSONDoc` column through a memo of decoded documents (module docstring).

    Only for reading: a row's value is the document as a Python object (a shared,
    read-only one for a JSON text; as the driver gives it where the driver decodes
    JSON itself, e.g. JSONB on PostgreSQL). None stays None.

    Raises:
        json.JSONDecodeError: a stored text that is not JSON (as the JSON type would).
    """

    impl = Text
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, str | bytes):
            return _decoded(value if isinstance(value, str) else value.decode())
        return value
