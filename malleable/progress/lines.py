"""Progress lines on the daemon side: bytes in, a typed record or a rejection reason out.

The format is written by `malleable.progress.reporter` (and by the simulator and
``malleable report``) and documented in docs/progress-format.md. Everything a
job writes is untrusted: `parse_line` never raises on any input; it returns
either a `ProgressRecord` or a `Rejection` whose reason is one of the fixed set
`Reason`, so ingestion can count rejections per job and reason.

Ordering is checked separately (`check_order`, `LineValidator`) because it
needs the last accepted record of the job: within one run (same restart count)
step and samples never decrease; a ``started`` event may go back (the job
reloaded an older checkpoint), and a higher restart count starts a new run.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass

from malleable.progress.reporter import (
    EVENTS,
    FORMAT_VERSION,
    MAX_BATCH,
    MAX_INT,
    MAX_LINE_BYTES,
)

MAX_JOB_ID_LEN = 64
MAX_PATH_LEN = 4096


class Reason(enum.StrEnum):
    """Why a line was rejected (stored and counted per job by ingestion)."""

    TOO_LONG = "too_long"                    # longer than MAX_LINE_BYTES
    NOT_JSON = "not_json"                    # not UTF-8 JSON
    NOT_OBJECT = "not_object"                # JSON, but not an object
    UNKNOWN_SCHEMA = "unknown_schema"        # "v" missing or not a known version
    MISSING_FIELD = "missing_field"          # a required key is absent
    BAD_TYPE = "bad_type"                    # a key has the wrong JSON type
    NAN_OR_INF = "nan_or_inf"                # NaN, Infinity, or a number that overflows
    BAD_VALUE = "bad_value"                  # right type, out of range (unknown event, gpus < 0...)
    NEGATIVE_STEP = "negative_step"          # step or samples < 0
    DECREASING_STEP = "decreasing_step"      # step went back within one run
    DECREASING_SAMPLES = "decreasing_samples"  # samples went back within one run
    STALE_RESTART = "stale_restart"          # restart count lower than one already seen
    FUTURE_RESTART = "future_restart"        # restart count above Slurm's for the job, plus one
    DECREASING_TIME = "decreasing_time"      # "t" went back within one run
    FUTURE_TIME = "future_time"              # "t" too far ahead of the daemon's clock
    WRONG_JOB = "wrong_job"                  # "job" is not the job whose file this is


@dataclass(frozen=True)
class ProgressRecord:
    """One accepted progress line (format version 1).

    Attributes:
        t: when the job wrote it, unix seconds.
        job: the Slurm job id ("123", "123_4").
        event: "started", "progress", "checkpointed" or "finished".
        step: cumulative training iterations; samples: cumulative samples.
        gpus: GPUs the job ran on (total); nodes: nodes; batch: global batch size.
        restart: Slurm's restart count when written.
        metric, grad_sqr, grad_var: optional finite floats.
        path: the checkpoint path (``checkpointed`` only).
    """

    t: float
    job: str
    event: str
    step: int
    samples: int
    gpus: int
    nodes: int
    batch: int
    restart: int
    metric: float | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    path: str | None = None


@dataclass(frozen=True)
class Rejection:
    """A rejected line: a `Reason` and a short human-readable detail (<= 200 chars)."""

    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class Cursor:
    """The ordering state of a job's stream: its last accepted (restart, step, samples)
    and time ``t`` (Unix seconds; None: not known, e.g. restored from the store)."""

    restart: int
    step: int
    samples: int
    t: float | None = None


_INT_FIELDS = ("step", "samples", "gpus", "nodes", "batch", "restart")
_REQUIRED = ("t", "job", "event", *_INT_FIELDS)
_FLOAT_FIELDS = ("metric", "grad_sqr", "grad_var")
_MIN = {"gpus": 0, "nodes": 1, "batch": 1, "restart": 0}
_MAX = {"batch": MAX_BATCH}


class _NonFinite(ValueError):
    pass


def _no_constants(name: str) -> float:
    raise _NonFinite(name)


# json.loads(text, parse_constant=_no_constants) builds a decoder per call; one is enough.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _loads(text: str) -> object:
    """``json.loads(text, parse_constant=_no_constants)``, with a shared decoder."""
    if text.startswith("\ufeff"):   # as json.loads: a BOM is not JSON
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _DECODER.decode(text)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_line(line: bytes, *, now: float, max_future_s: float = 300.0,
               job_id: str | None = None) -> ProgressRecord | Rejection:
    """Validate one line (without its newline) of a progress file.

    Args:
        line: the raw bytes of one line; a trailing "\\n" or "\\r\\n" is ignored.
        now: the daemon's clock, unix seconds.
        max_future_s: a line with ``t > now + max_future_s`` is rejected (FUTURE_TIME).
        job_id: the job whose file this is; a line naming another job is rejected
            (WRONG_JOB). None skips the check.

    Returns:
        A `ProgressRecord`, or a `Rejection`. Never raises, whatever the bytes.
    """
    line = line.rstrip(b"\r\n")
    if len(line) > MAX_LINE_BYTES:
        return Rejection(Reason.TOO_LONG, f"{len(line)} bytes > {MAX_LINE_BYTES}")
    try:
        doc = _loads(line.decode("utf-8"))
    except _NonFinite as exc:
        return Rejection(Reason.NAN_OR_INF, f"{exc}")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return Rejection(Reason.NOT_JSON, str(exc)[:200])
    if not isinstance(doc, dict):
        return Rejection(Reason.NOT_OBJECT, f"a JSON {type(doc).__name__}")
    v = doc.get("v")
    if "v" not in doc:
        return Rejection(Reason.UNKNOWN_SCHEMA, "no \"v\" key")
    if type(v) is not int or v != FORMAT_VERSION:
        return Rejection(Reason.UNKNOWN_SCHEMA, f"v={_short(v)}, expected {FORMAT_VERSION}")
    for name in _REQUIRED:
        if name not in doc:
            return Rejection(Reason.MISSING_FIELD, name)
    return _check_fields(doc, now=now, max_future_s=max_future_s, job_id=job_id)


def _check_fields(doc: dict, *, now: float, max_future_s: float,
                  job_id: str | None) -> ProgressRecord | Rejection:
    t = doc["t"]
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return Rejection(Reason.BAD_TYPE, f"t={_short(t)}")
    for name in _INT_FIELDS:
        value = doc[name]
        if type(value) is not int:
            return Rejection(Reason.BAD_TYPE, f"{name}={_short(value)}")
    for name in _FLOAT_FIELDS:
        value = doc.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return Rejection(Reason.BAD_TYPE, f"{name}={_short(value)}")
    for name in ("job", "event"):
        if not isinstance(doc[name], str):
            return Rejection(Reason.BAD_TYPE, f"{name}={_short(doc[name])}")
    path = doc.get("path")
    if path is not None and not isinstance(path, str):
        return Rejection(Reason.BAD_TYPE, f"path={_short(path)}")
    floats: dict[str, float | None] = {}
    for name in ("t", *_FLOAT_FIELDS):
        value = doc.get(name)
        try:
            floats[name] = None if value is None else float(value)
        except OverflowError:  # an integer too large for a float
            floats[name] = math.inf
        if floats[name] is not None and not math.isfinite(floats[name]):
            return Rejection(Reason.NAN_OR_INF, f"{name}={_short(value)}")
    t = floats["t"]
    for name in ("step", "samples"):
        if doc[name] < 0:
            return Rejection(Reason.NEGATIVE_STEP, f"{name}={doc[name]}")
    for name in _INT_FIELDS:
        if doc[name] > _MAX.get(name, MAX_INT) or doc[name] < _MIN.get(name, 0):
            return Rejection(Reason.BAD_VALUE, f"{name}={_short(doc[name])}")
    if t < 0:
        return Rejection(Reason.BAD_VALUE, f"t={t}")
    if t > now + max_future_s:
        return Rejection(Reason.FUTURE_TIME, f"t={t:.0f} is {t - now:.0f} s ahead")
    if doc["event"] not in EVENTS:
        return Rejection(Reason.BAD_VALUE, f"event={_short(doc['event'])}")
    job = doc["job"]
    if not job or len(job) > MAX_JOB_ID_LEN:
        return Rejection(Reason.BAD_VALUE, f"job={_short(job)}")
    if job_id is not None and job != job_id:
        return Rejection(Reason.WRONG_JOB, f"job={_short(job)} in the file of {job_id}")
    if doc["event"] == "checkpointed" and path is None:
        return Rejection(Reason.MISSING_FIELD, "path")
    if path is not None and (not path or len(path) > MAX_PATH_LEN or "\x00" in path):
        return Rejection(Reason.BAD_VALUE, f"path={_short(path)}")
    return ProgressRecord(
        t=t, job=job, event=doc["event"], step=doc["step"], samples=doc["samples"],
        gpus=doc["gpus"], nodes=doc["nodes"], batch=doc["batch"], restart=doc["restart"],
        metric=floats["metric"], grad_sqr=floats["grad_sqr"], grad_var=floats["grad_var"],
        path=path)


RESTART_SLACK = 1
"""A line may carry a restart count this much above Slurm's as last polled: a job
requeued and started again between the daemon's poll and its read of the file (the
job-side `malleable report` judges a file's earlier lines by its own run's count plus
this). A line above that (a job that writes a wrong count, e.g. its own attempt
counter) is rejected; accepted, it would have made every later line of the job's real
run ``stale_restart``."""


def check_order(record: ProgressRecord, last: Cursor | None, *,
                check_time: bool = True, max_restart: int | None = None) -> Rejection | None:
    """Is ``record`` in order after the job's last accepted record?

    Rules: a restart count above ``max_restart`` is FUTURE_RESTART (checked
    first: such a line, once accepted, would make every later line of the job's
    real run STALE_RESTART); a lower restart count than ``last`` is
    STALE_RESTART, unless ``last`` itself is above ``max_restart`` (a cursor
    restored from a line stored before this bound existed: the line starts a
    new run, so a job such a line froze resumes); a higher one starts a new
    run (any step and time); a
    ``started`` event may go back in step (reloaded from an older checkpoint),
    otherwise step and samples must not decrease (DECREASING_STEP,
    DECREASING_SAMPLES); and within a run ``t`` must not decrease
    (DECREASING_TIME, checked last, and not if ``check_time`` is False: a line
    stamped before the last one would put the run's throughput intervals out of
    order).

    Args:
        record: the line to check.
        last: the job's cursor after its last accepted line (None before any).
        check_time: see DECREASING_TIME above.
        max_restart: the highest restart count the job can have written (the
            daemon: Slurm's count as last polled, plus one; `IngestJob`), None:
            no bound.

    Returns:
        None if in order, else the `Rejection`.
    """
    if max_restart is not None and record.restart > max_restart:
        return Rejection(Reason.FUTURE_RESTART,
                         f"restart={record.restart} > {max_restart}, "
                         "one more than Slurm's restart count for the job")
    if last is None or record.restart > last.restart:
        return None
    if max_restart is not None and last.restart > max_restart:
        # The cursor is one no real run can have (accepted before FUTURE_RESTART
        # existed, kept in the database): a line within bounds starts a new run.
        return None
    if record.restart < last.restart:
        return Rejection(Reason.STALE_RESTART, f"restart={record.restart} < {last.restart}")
    if record.event != "started":
        if record.step < last.step:
            return Rejection(Reason.DECREASING_STEP, f"step={record.step} < {last.step}")
        if record.samples < last.samples:
            return Rejection(Reason.DECREASING_SAMPLES,
                             f"samples={record.samples} < {last.samples}")
    if check_time and last.t is not None and record.t < last.t:
        return Rejection(Reason.DECREASING_TIME,
                         f"t={record.t:.3f} < {last.t:.3f}, the run's last line")
    return None


class LineValidator:
    """`parse_line` plus `check_order` over one job's stream; holds the `Cursor`.

    Attributes:
        job_id: the job whose lines these are.
        last: the cursor after the last accepted line (None before any).
        max_future_s, check_time, max_restart: as `parse_line` and `check_order`.
    """

    def __init__(self, job_id: str | None, last: Cursor | None = None, *,
                 max_future_s: float = 300.0, check_time: bool = True,
                 max_restart: int | None = None):
        self.job_id = job_id
        self.last = last
        self.max_future_s = max_future_s
        self.check_time = check_time
        self.max_restart = max_restart

    def feed(self, line: bytes, now: float) -> ProgressRecord | Rejection:
        """Validate the next line; on acceptance advance `last`. Never raises."""
        result = parse_line(line, now=now, max_future_s=self.max_future_s, job_id=self.job_id)
        if isinstance(result, Rejection):
            return result
        rejected = check_order(result, self.last, check_time=self.check_time,
                               max_restart=self.max_restart)
        if rejected is not None:
            return rejected
        self.last = Cursor(result.restart, result.step, result.samples, result.t)
        return result


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Split bytes read from a progress file into complete lines and a partial rest.

    Returns:
        (lines without their newline, the bytes after the last newline). Empty
        lines (blank or whitespace only) are dropped.
    """
    *lines, rest = buffer.split(b"\n")
    return [ln for ln in lines if ln.strip()], rest
