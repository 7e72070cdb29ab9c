"""Job ids and other user-supplied values, checked before any command runs.

A job id reaches Slurm as one argv element (never through a shell), but it is
still validated first: only the forms Slurm itself prints are accepted, so a
value such as ``1;rm -rf /`` or ``$(x)`` is refused with `InvalidJobId` and no
command is started. The same module checks signal names and sizes.
"""

from __future__ import annotations

import re

from malleable.slurm.client import InvalidArgument, InvalidJobId

# 123 (plain or array master), 123_4 (array task), 123+0 (het job component).
_JOB_ID = re.compile(r"[1-9][0-9]{0,9}(?:_[0-9]{1,10}|\+[0-9]{1,5})?")
_SIGNAL = re.compile(r"(?:SIG)?[A-Z][A-Z0-9]{1,11}|[1-9][0-9]?")


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` as the canonical string Slurm accepts.

    Accepts "123", "123_4", "123+0" (or a positive int). Raises `InvalidJobId`
    naming the value for anything else: empty strings, signs, spaces, shell
    metacharacters, leading zeros, bools.
    """
    if isinstance(job_id, bool):
        raise InvalidJobId(f"invalid job id {job_id!r}: expected 123, 123_4 or 123+0")
    if isinstance(job_id, int) and job_id > 0:
        return str(job_id)
    if isinstance(job_id, str) and _JOB_ID.fullmatch(job_id):
        return job_id
    raise InvalidJobId(f"invalid job id {job_id!r}: expected 123, 123_4 or 123+0")


def check_signal(signal: object) -> str:
    """Return a signal name ("USR1", "SIGTERM") or number ("10") as given.

    Raises `InvalidArgument` for anything else (e.g. "-9", "USR1;x", "").
    """
    if isinstance(signal, str) and _SIGNAL.fullmatch(signal):
        return signal
    raise InvalidArgument(f"invalid signal {signal!r}: expected a name like USR1 or a number")


def check_count(name: str, value: object, minimum: int = 1, maximum: int = 1_000_000) -> int:
    """Return ``value`` if it is an int in [minimum, maximum]; else `InvalidArgument` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"invalid {name} {value!r}: expected an integer "
                              f"from {minimum} to {maximum}")
    return value
