"""Readers for the value shapes Slurm's JSON uses across data_parser v0.0.38-v0.0.44.

* numbers: a plain int (v0.0.38), ``null`` for "not set", or from v0.0.39 an
  object ``{"set": bool, "infinite": bool, "number": n}``;
* times: epoch seconds as an int (0 = never) or, from v0.0.40, such an object;
* job_state: a string (up to v0.0.39) or a list "base state + flags" (v0.0.40+);
* strings: may be missing or ``null``.

Each reader takes the job (or node) object, the key and a path for messages,
and raises `SlurmParseError` naming the field and the value when the shape is
not one of these. Missing keys give the documented default.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from malleable.slurm.client import SlurmParseError
from malleable.slurm.records import JobState

_MISSING = object()

BASE_STATES = frozenset({
    JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETED,
    JobState.CANCELLED, JobState.FAILED, JobState.TIMEOUT, JobState.NODE_FAIL,
    JobState.PREEMPTED, JobState.BOOT_FAIL, JobState.DEADLINE, JobState.OUT_OF_MEMORY,
})

# States Slurm may print alone (22.05/23.02 strings print the flag instead of the
# base state) that are not JobState members: the base state they imply.
_FLAG_ONLY = {
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING, "POWER_UP_NODE": JobState.CONFIGURING,
    "COMPLETE": JobState.COMPLETED,
}


def fail(path: str, value: object, expected: str) -> SlurmParseError:
    """A `SlurmParseError` for ``path`` holding ``value`` where ``expected`` was expected."""
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return SlurmParseError(f"{path}: expected {expected}, got {shown}", field=path, value=value)


def number(obj: dict, key: str, path: str, default: int | None = None) -> int | None:
    """An integer field: int, null, or a ``{"set","infinite","number"}`` object.

    Returns ``default`` when missing, null, unset or infinite. Floats with an
    integral value are accepted (``2.0``); bools, strings and other shapes raise.
    """
    value = obj.get(key)
    kind = type(value)
    if kind is int:  # the common cases first: this runs ~15 times per job
        return value
    if kind is dict and value.get("set") is True and value.get("infinite") is False:
        number = value.get("number")
        if type(number) is int:
            return number
    if value is None:
        return default
    if isinstance(value, dict):
        if value.get("infinite") is True or value.get("set") is False:
            return default
        if "number" not in value:
            raise fail(f"{path}.{key}", value, "a number or {set, infinite, number}")
        value = value["number"]
    if isinstance(value, bool):
        raise fail(f"{path}.{key}", value, "an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise fail(f"{path}.{key}", value, "an integer")


def infinite(obj: dict, key: str) -> bool:
    """True when the field is an object tagged ``infinite`` (v0.0.39+)."""
    value = obj.get(key)
    return isinstance(value, dict) and value.get("infinite") is True


def epoch(obj: dict, key: str, path: str) -> datetime | None:
    """A time field as a UTC datetime; None for missing, 0, unset or infinite."""
    seconds = number(obj, key, path)
    if not seconds:
        return None
    if seconds < 0 or seconds > 32503680000:  # year 3000
        raise fail(f"{path}.{key}", obj.get(key), "epoch seconds")
    return datetime.fromtimestamp(seconds, tz=UTC)


def minutes(obj: dict, key: str, path: str) -> timedelta | None:
    """A time limit in minutes; None for unlimited (null, infinite, unset)."""
    value = number(obj, key, path)
    if value is None:
        return None
    if not 0 <= value <= 100_000_000:  # 190 years
        raise fail(f"{path}.{key}", obj.get(key), "minutes from 0 to 100000000")
    return timedelta(minutes=value)


def string(obj: dict, key: str, path: str, default: str = "") -> str:
    """A string field; ``default`` when missing or null."""
    value = obj.get(key)
    if type(value) is str:
        return value
    if value is None:
        return default
    if not isinstance(value, str):
        raise fail(f"{path}.{key}", value, "a string")
    return value


def boolean(obj: dict, key: str, path: str, default: bool = False) -> bool:
    """A bool field (also accepts 0/1 as older dumps used)."""
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise fail(f"{path}.{key}", value, "a boolean")


def string_list(obj: dict, key: str, path: str) -> list[str]:
    """A list of strings (missing/null -> [])."""
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(f"{path}.{key}", value, "a list of strings")
    return value


_STATES = {s.value: s for s in JobState}
_BASE_NAMES = frozenset(s.value for s in BASE_STATES)


def job_state(value: object, path: str) -> tuple[JobState, frozenset[str]]:
    """(base state, extra flags) from a state string or a v0.0.40+ list.

    ``"RUNNING"`` -> (RUNNING, {}); ``["PENDING", "REQUEUED"]`` -> (PENDING,
    {"REQUEUED"}); a lone flag such as ``"COMPLETING"`` (22.05 prints the flag
    instead of the base state) -> (COMPLETING, {"COMPLETING"}).
    """
    if type(value) is str and value in _BASE_NAMES:  # the common case
        return _STATES[value], frozenset()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise fail(path, value, "a job state string or a non-empty list of them")
    upper = [n.strip().upper() for n in names]
    for name in upper:
        if name in _BASE_NAMES:
            return _STATES[name], frozenset(n for n in upper if n != name)
    first = upper[0]
    if first in _STATES:
        return _STATES[first], frozenset(upper)
    if first in _FLAG_ONLY:
        return _FLAG_ONLY[first], frozenset(upper)
    raise fail(path, value, "a Slurm job state")
