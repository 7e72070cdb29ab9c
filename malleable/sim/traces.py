"""Trace loaders: real job logs into one typed record per job (`TraceJob`).

Each loader reads one format and returns the jobs sorted by arrival (then
name), with arrivals in seconds from the trace's first submission (or as the
file gives them, for files that are already relative). A malformed row is
refused with `TraceError`, whose message names the file, the line number, the
field and the value; nothing is silently repaired. Rows that are well formed
but cannot be simulated (a job that never started, an SWF job of unknown run
time) are skipped and counted in the loader's ``skipped`` return where noted.

Formats:

* `load_pollux_workload`: Pollux's workload CSV (``name,time,application,
  num_replicas,batch_size``), e.g. ``malleable/sim/data/pollux/workloads/``.
* `load_philly`: the Philly job list derived by Pollux (``philly.csv``:
  ``timestamp,duration,num_gpus,gpu_time,cluster``), with models assigned by
  GPU-time class as Pollux's workload generator did (see the function), and
  `busiest_window` to cut the busiest stretch of it.
* `load_gavel`: Gavel's Philly-derived per-VC traces (``philly_msr_vc_traces.csv.gz``).
* `load_swf`: the Parallel Workloads Archive's Standard Workload Format (18 fields).
* `load_sacct`: a Slurm accounting export: ``sacct -P`` text with a header,
  ``sacct --json``, or the sacct-derived CSV of NREL's Eagle sample.

Files ending in ``.gz`` are read through gzip.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
import reprlib
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from malleable.sim.profiles import MODELS, load_profile

#: Pollux's GPU-time classes (upper bounds in GPU-seconds) and the models mapped to them.
PHILLY_CLASSES = ((3600.0, ("cifar10", "ncf")), (36000.0, ("deepspeech2", "bert")),
                  (360000.0, ("yolov3",)), (math.inf, ("imagenet",)))


class TraceError(ValueError):
    """A trace file is unreadable or has a malformed row.

    The message is ``<path>[:<line>][: field <field>=<value>]: <problem>``; a list or
    object value (from a JSON trace) is shown abridged (`_shown`).

    Attributes: path, line (1-based, 0 when not about a line), field, value, problem.
    """

    def __init__(self, path: str | Path, line: int, field: str, value: object, problem: str):
        where = f"{path}:{line}" if line else f"{path}"
        what = f": field {field}={_shown(value)}" if field else ""
        super().__init__(f"{where}{what}: {problem}")
        self.path = str(path)
        self.line = line
        self.field = field
        self.value = value
        self.problem = problem


#: How much of a list or object value a `TraceError` shows.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 4, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 40


def _shown(value: object) -> str:
    """``repr(value)``; for a list, tuple or dict (a JSON value) `_SHOWN`'s abridged one;
    at most 200 characters, a longer text or number cut with its length said: a message
    must stay one readable line whatever the trace holds (a list nested 900 deep, a job
    object of many fields, a value of 5,000 digits)."""
    if isinstance(value, (list, tuple, dict)):
        text = _SHOWN.repr(value)
        return text if len(text) <= 200 else text[:197] + "..."
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 600:
        # (str() of an int above 4,300 digits raises ValueError in Python 3.11)
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    if len(text) <= 200:
        return text
    return f"{text[:60]}... ({len(str(value))} characters)"


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace.

    Attributes:
        name: a name unique within the trace.
        arrival_s: submission time, seconds from the trace's origin (>= 0).
        gpus: GPUs requested (for SWF: processors; 0 for a CPU-only job).
        model: the training model ("cifar10", ... or Gavel's job type), None if unknown.
        duration_s: run time in the original trace, seconds, None if unknown.
        batch_size: global batch size, None if unknown.
        total_steps: iterations to run (Gavel), None if unknown. Kept as the trace
            gives it; the replay does not use it (`load_gavel` says why).
        nodes: nodes requested, None if unknown.
        group: virtual cluster, partition or user ("" if none).
    """

    name: str
    arrival_s: float
    gpus: int
    model: str | None = None
    duration_s: float | None = None
    batch_size: int | None = None
    total_steps: int | None = None
    nodes: int | None = None
    group: str = ""

    @property
    def gpu_time_s(self) -> float | None:
        """``gpus * duration_s`` in GPU-seconds, None without a duration."""
        return None if self.duration_s is None else self.gpus * self.duration_s


# ----------------------------------------------------------------------------- helpers


# What reading a trace may raise besides bad text: an OS error, and for a .gz file a
# stream cut short (EOFError) or corrupt data (zlib.error).
READ_ERRORS = (OSError, EOFError, zlib.error)


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(path, 0, "", None, f"cannot read trace: {exc.strerror}") from None


def _read_error(path: Path, exc: BaseException) -> TraceError:
    """The `TraceError` for a trace that could not be read: for bytes that are not UTF-8,
    the first such line and the byte (found by reading the file again, as bytes)."""
    if isinstance(exc, UnicodeDecodeError):
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rb") as fh:
                for line, raw in enumerate(fh, start=1):
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError as bad:
                        byte = raw[bad.start:bad.start + 1]
                        return TraceError(path, line, "", None,
                                          f"not UTF-8 text: byte 0x{byte.hex()} at column "
                                          f"{bad.start + 1}")
        except READ_ERRORS:
            pass
    return TraceError(path, 0, "", None, f"cannot read trace: {getattr(exc, 'strerror', None) or exc}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    fh = _open_text(path)
    try:
        with fh:
            yield from enumerate(fh, start=1)
    except (*READ_ERRORS, UnicodeDecodeError) as exc:
        raise _read_error(path, exc) from None


def _csv_rows(path: Path, required: Iterable[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a headed CSV; refuses a header without ``required``."""
    fh = _open_text(path)
    try:
        with fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [f for f in required if f not in header]
            if missing:
                raise TraceError(path, 1, "header", ",".join(header),
                                 f"missing column(s) {', '.join(missing)}")
            for row in reader:
                line = reader.line_num
                if all(v is None or (isinstance(v, str) and not v.strip())
                       for v in row.values()):
                    continue   # blank cells only (",,,," from a spreadsheet): as an empty line
                if None in row or any(v is None for v in row.values()):
                    cells = [v for k, v in row.items() if k is not None and v is not None]
                    cells += row.get(None) or []   # csv.DictReader's extra cells
                    raise TraceError(path, line, "row", ",".join(cells)[:80],
                                     f"{len(cells)} fields, expected {len(header)}")
                yield line, row
    except (*READ_ERRORS, UnicodeDecodeError, csv.Error) as exc:
        raise _read_error(path, exc) from None


#: The largest integer a trace field may hold (int64, as Slurm's and SWF's counters).
MAX_TRACE_INT = 2**63 - 1
#: An integer as a trace writes it: ASCII digits, an optional sign, and optionally a
#: point followed by zeros ("4.0", as pandas writes an integer column with a gap).
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:\.0*)?")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _int(path: Path, line: int, field: str, raw: Any, *, lo: int = 0,
         hi: int = MAX_TRACE_INT) -> int:
    """``raw`` (text or a JSON number) as an integer in [lo, hi].

    Text must be ASCII digits (``1e2``, ``1_000`` and Unicode digits, which Python's
    `float` takes, are not integers as a trace writes them).

    Raises:
        TraceError: not an integer, or outside [lo, hi] (names the field and value).
    """
    value = None
    if isinstance(raw, str):
        text = raw.strip()
        if text.isascii() and _INT_TEXT.fullmatch(text):
            whole = text.split(".")[0]
            if len(whole.lstrip("+-").lstrip("0")) > 19:   # (beyond int64; int() of more
                value = -hi - 1 if whole.startswith("-") else hi + 1   # than 4,300 digits
            else:                                                     # raises ValueError)
                value = int(whole)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and math.isfinite(raw) and raw == int(raw):
        value = int(raw)
    if value is None:
        raise TraceError(path, line, field, raw, "not an integer")
    if value < lo:
        raise TraceError(path, line, field, raw, f"must be >= {lo}")
    if value > hi:
        raise TraceError(path, line, field, raw, f"must be <= {hi}")
    return value


def _float(path: Path, line: int, field: str, raw: Any, *, lo: float = 0.0) -> float:
    text = raw.strip() if isinstance(raw, str) else None
    plain = text is None or bool(text.isascii() and _FLOAT_TEXT.fullmatch(text))
    if not plain and text.lower().lstrip("+-") not in ("inf", "infinity", "nan"):
        # (not "1_000" or "٣", which float() takes)
        raise TraceError(path, line, field, raw, "not a decimal number (ASCII digits, a "
                                                 "point, an exponent: 1000, 2.5, 1e3)")
    try:
        if not plain:
            raise ValueError   # ("nan", "inf")
        value = float(raw)
        if isinstance(raw, bool) or not math.isfinite(value):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise TraceError(path, line, field, raw, "not a finite number") from None
    if value < lo:
        raise TraceError(path, line, field, raw, f"must be >= {lo}")
    return value


_ISO = {"%Y-%m-%d %H:%M:%S": re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"),
        "%Y-%m-%dT%H:%M:%S": re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")}


def _datetime(path: Path, line: int, field: str, raw: str, fmt: str) -> datetime:
    """``raw`` in ``fmt`` (one of `_ISO`'s), read as UTC."""
    try:
        if not _ISO[fmt].match(raw):
            raise ValueError
        return datetime.fromisoformat(raw).replace(tzinfo=UTC)
    except (TypeError, ValueError):
        raise TraceError(path, line, field, raw, f"not a time of the form {fmt}") from None


def _sorted(jobs: list[TraceJob]) -> list[TraceJob]:
    return sorted(jobs, key=lambda j: (j.arrival_s, j.name))


def _rebase(jobs: list[TraceJob], origin: float) -> list[TraceJob]:
    return _sorted([replace(j, arrival_s=j.arrival_s - origin) for j in jobs])


def _uniquify(jobs: list[TraceJob]) -> list[TraceJob]:
    """Repeated job ids (requeued jobs, or array tasks without their index) become id#2, ..."""
    count: dict[str, int] = {}
    out = []
    for j in jobs:
        n = count[j.name] = count.get(j.name, 0) + 1
        out.append(j if n == 1 else replace(j, name=f"{j.name}#{n}"))
    return out


def _check_unique(path: Path, names: list[tuple[int, str]]) -> None:
    seen: dict[str, int] = {}
    for line, name in names:
        if name in seen:
            raise TraceError(path, line, "name", name, f"duplicate of line {seen[name]}")
        seen[name] = line


# ----------------------------------------------------------------------------- Pollux


def load_pollux_workload(path: str | Path) -> list[TraceJob]:
    """Pollux's workload CSV: ``name,time,application,num_replicas,batch_size``.

    Returns one job per row: ``arrival_s = time`` (s), ``model = application`` (one
    of the six profiled models), ``gpus = num_replicas``, ``batch_size`` (global,
    samples per iteration).

    A row's batch must give every replica at least one sample: ``batch_size >=
    num_replicas``. A data-parallel job cannot run a global batch of 1 on 2 GPUs,
    and the daemon's estimators (rightly) find no batch for it on its GPUs, so
    under a policy that runs it on its request only (``las``, ``static``) it would
    be held for the whole run. Such a row is refused, not repaired: raising the
    batch would replay a job the trace does not hold. (Pollux's own workloads
    have at least 8 samples per GPU; a batch below the profile's smallest
    measured per-GPU batch is accepted and runs as `ModelProfile.step_time` says.)

    Raises:
        TraceError: unreadable file, missing column, duplicate name, or a bad value
            (a batch size above the model's profile is one: the profile cannot say
            how such a job trains; a batch size below ``num_replicas`` is another).
    """
    path = Path(path)
    jobs, names = [], []
    for line, row in _csv_rows(path, ("name", "time", "application", "num_replicas",
                                      "batch_size")):
        name = row["name"].strip()
        if not name:
            raise TraceError(path, line, "name", row["name"], "empty")
        app = row["application"].strip()
        if app not in MODELS:
            raise TraceError(path, line, "application", app,
                             f"unknown model (known: {', '.join(MODELS)})")
        batch = _int(path, line, "batch_size", row["batch_size"], lo=1)
        most = load_profile(app).max_batch_size
        if batch > most:
            raise TraceError(path, line, "batch_size", row["batch_size"],
                             f"above the {app} profile's largest batch size ({most})")
        arrival = _float(path, line, "time", row["time"])
        gpus = _int(path, line, "num_replicas", row["num_replicas"], lo=1)
        if batch < gpus:
            raise TraceError(path, line, "batch_size", row["batch_size"],
                             f"below num_replicas ({gpus}): data-parallel training needs at "
                             f"least one sample per GPU")
        jobs.append(TraceJob(name=name, arrival_s=arrival, gpus=gpus, model=app,
                             batch_size=batch))
        names.append((line, name))
    _check_unique(path, names)
    return _sorted(jobs)


# ----------------------------------------------------------------------------- Philly


def philly_model(gpu_time_s: float, u: float) -> str:
    """The model Pollux's generator maps a Philly job to, by its GPU-time class.

    < 1 GPU-hour: cifar10 or ncf; < 10: deepspeech2 or bert; < 100: yolov3;
    otherwise imagenet. ``u`` in [0, 1) picks within a class of two (first if < 0.5).
    """
    for bound, models in PHILLY_CLASSES:
        if gpu_time_s < bound:
            return models[0] if len(models) == 1 or u < 0.5 else models[1]
    return PHILLY_CLASSES[-1][1][0]


def load_philly(path: str | Path, *, seed: int = 0, min_duration_s: float = 0.0,
                max_gpu_time_s: float = math.inf) -> list[TraceJob]:
    """The Philly job list ``philly.csv`` (``timestamp,duration,num_gpus,gpu_time,cluster``).

    Each job keeps its real arrival (seconds from the first ``timestamp`` of the
    kept rows), GPUs and duration, and gets a model by GPU-time class as Pollux's
    workload generator did (`philly_model`: < 1 GPU-h cifar10 or ncf, < 10 h
    deepspeech2 or bert, < 100 h yolov3, else imagenet). The choice within a
    class is a seeded coin flip per row: ``numpy.random.default_rng(seed)`` draws
    one uniform number for every data row in file order, so the same seed gives
    the same models, whatever the filters. Pollux also dropped jobs shorter than
    60 s and of 1000 GPU-hours or more: pass ``min_duration_s=60,
    max_gpu_time_s=3.6e6`` to do the same. Timestamps are read as UTC (the file
    has local wall-clock times without a zone; only differences matter).

    Returns the jobs named ``philly-<line>``, group = the hashed virtual cluster.

    Raises:
        TraceError: unreadable file, missing column, or a bad value (including a
            ``gpu_time`` that is not ``duration * num_gpus``).
    """
    path = Path(path)
    rows = list(_csv_rows(path, ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")))
    coins = np.random.default_rng(seed).random(len(rows))
    parsed = []
    for (line, row), u in zip(rows, coins, strict=True):
        ts = _datetime(path, line, "timestamp", row["timestamp"], "%Y-%m-%d %H:%M:%S")
        duration = _float(path, line, "duration", row["duration"])
        gpus = _int(path, line, "num_gpus", row["num_gpus"], lo=1)
        gpu_time = _float(path, line, "gpu_time", row["gpu_time"])
        if abs(gpu_time - duration * gpus) > 1e-6 * max(1.0, gpu_time):
            raise TraceError(path, line, "gpu_time", row["gpu_time"],
                             f"is not duration * num_gpus = {duration * gpus}")
        if duration < min_duration_s or gpu_time >= max_gpu_time_s:
            continue
        parsed.append((ts.timestamp(), line, duration, gpus, gpu_time, row["cluster"].strip(),
                       float(u)))
    if not parsed:
        return []
    origin = min(p[0] for p in parsed)
    jobs = [TraceJob(name=f"philly-{line}", arrival_s=t - origin, gpus=gpus,
                     model=philly_model(gt, u), duration_s=dur, group=vc)
            for t, line, dur, gpus, gt, vc, u in parsed]
    return _sorted(jobs)


def busiest_window(jobs: list[TraceJob], length_s: float = 14 * 86400.0, *,
                   by: str = "gpu_time") -> tuple[float, list[TraceJob]]:
    """The ``length_s`` stretch of arrivals with the most demand, rebased to start at 0.

    Windows start at a job's arrival; demand is the GPU time (``gpus *
    duration_s``) of the jobs arriving in ``[start, start + length_s)`` with
    ``by="gpu_time"``, or their number with ``by="jobs"``. Ties go to the earliest
    window. Returns ``(start_s, jobs)`` with start_s in the input's time base.

    Raises:
        ValueError: ``length_s <= 0``, an unknown ``by``, or ``by="gpu_time"`` with a
            job of unknown duration.
    """
    if not (length_s > 0):
        raise ValueError(f"length_s must be > 0, got {length_s!r}")
    if by not in ("gpu_time", "jobs"):
        raise ValueError(f"by must be 'gpu_time' or 'jobs', got {by!r}")
    if not jobs:
        return 0.0, []
    ordered = _sorted(jobs)
    t = np.array([j.arrival_s for j in ordered])
    if by == "jobs":
        w = np.ones(len(ordered))
    else:
        missing = [j.name for j in ordered if j.duration_s is None]
        if missing:
            raise ValueError(f"job {missing[0]!r} has no duration; use by='jobs'")
        w = np.array([j.gpus * j.duration_s for j in ordered])  # type: ignore[operator]
    cum = np.concatenate(([0.0], np.cumsum(w)))
    ends = np.searchsorted(t, t + length_s, side="left")
    demand = cum[ends] - cum[np.arange(len(t))]
    best = int(np.argmax(demand))
    start = float(t[best])
    window = ordered[best:int(ends[best])]
    return start, _rebase(window, start)


# ----------------------------------------------------------------------------- Gavel

_GAVEL_TYPE = re.compile(r"^(?P<model>.+?) \(batch size (?P<bs>[0-9]+)\)$")
#: The largest batch size in a Gavel job type, and the most GPUs of a Gavel job
#: (``scale_factor``): far above the traces' (batch 512, 8 GPUs), so that a larger
#: value is a malformed row rather than a job the simulator must hold.
GAVEL_MAX_BATCH = 2**31 - 1
GAVEL_MAX_GPUS = 2**20


def load_gavel(path: str | Path, *, seed: int = 0, vc: str | None = None) -> list[TraceJob]:
    """Gavel's Philly-derived traces (``seed,vc,line_no,job_type,num_steps_arg,
    needs_data_dir,total_steps,arrival_time_s,scale_factor``).

    The file holds 5 seeds of the same arrivals; ``seed`` picks one (only its
    ``job_type`` and ``total_steps`` differ). ``vc`` keeps one virtual cluster.
    Each job: ``arrival_s = arrival_time_s`` (seconds from its VC's first job),
    ``gpus = scale_factor``, ``model`` and ``batch_size`` from ``job_type``
    (e.g. "ResNet-50 (batch size 64)"; "A3C" and "CycleGAN" carry no batch
    size), ``total_steps``, group = VC, named ``<vc>-<line_no>``.

    ``total_steps`` (Gavel's work, iterations of Gavel's own implementation of
    the job type at its batch size) is read, checked (an integer >= 1) and kept
    on the job, but the replay does not use it: `malleable.sim.workloads.map_models`
    gives a Gavel job the Pollux profile of its family, which trains to that
    profile's target, as a Philly job does whatever its recorded duration
    (Pollux's convention). There is no sound mapping of the count onto a profile:
    the profile's work is statistical-efficiency-weighted progress at its own
    batch sizes, five of Gavel's seven families map to a profile of another
    model or data set (Transformer -> bert, LM -> deepspeech2, CycleGAN ->
    yolov3, A3C -> cifar10, Recommendation -> ncf), and the counts are
    generated, not recorded: the same job (VC and line, same arrival and GPUs)
    has another count in each of the file's five seeds, and at Gavel's measured
    V100 throughput its longest takes 10 times as long as its shortest (the
    median over the jobs).

    Returns:
        The jobs of ``seed`` (and ``vc``), by arrival; [] for a file without rows.

    Raises:
        TraceError: unreadable file, missing column, a bad value, or a file with
            rows of which none is of ``seed`` (and ``vc``): field ``seed`` (or ``vc``),
            naming the seeds (VCs) the file has.
    """
    path = Path(path)
    jobs = []
    seen: dict[str, int] = {}   # job name -> its line
    seeds: set[int] = set()
    vcs: set[str] = set()       # of the rows of ``seed``
    need = ("seed", "vc", "line_no", "job_type", "total_steps", "arrival_time_s", "scale_factor")
    for line, row in _csv_rows(path, need):
        s = _int(path, line, "seed", row["seed"])
        seeds.add(s)
        row_vc = row["vc"].strip()   # (" a" and "a" are one VC)
        if not row_vc:
            raise TraceError(path, line, "vc", row["vc"], "empty (every job names its "
                             "virtual cluster; its jobs were named '-<line_no>')")
        if s == seed:
            vcs.add(row_vc)
        if s != seed or (vc is not None and row_vc != vc):
            continue
        no = _int(path, line, "line_no", row["line_no"])
        name = f"{row_vc}-{no}"   # (by the number: 1, 01 and 1.0 are one job)
        if name in seen:
            raise TraceError(path, line, "line_no", row["line_no"],
                             f"job {name} of seed {s} already on line {seen[name]}")
        seen[name] = line
        job_type = row["job_type"].strip()
        if not job_type:
            raise TraceError(path, line, "job_type", row["job_type"], "empty")
        m = _GAVEL_TYPE.match(job_type)
        if m is None and "batch size" in job_type:
            # ("(batch size 1e2)" or "(batch size 128) extra" were taken as a model's name,
            # refused later as "no profiled model", without the line)
            raise TraceError(path, line, "job_type", row["job_type"],
                             "expected 'MODEL (batch size N)', N in ASCII digits")
        model, batch = (m.group("model"), m.group("bs")) if m else (job_type, None)
        if batch is not None:
            if len(batch) > 10 or not 1 <= int(batch) <= GAVEL_MAX_BATCH:
                bs = batch if len(batch) <= 20 else f"of {len(batch)} digits"
                raise TraceError(path, line, "job_type", row["job_type"],
                                 f"batch size {bs} outside 1 to {GAVEL_MAX_BATCH}")
            batch = int(batch)
        jobs.append(TraceJob(
            name=name,
            arrival_s=_float(path, line, "arrival_time_s", row["arrival_time_s"]),
            gpus=_int(path, line, "scale_factor", row["scale_factor"], lo=1,
                      hi=GAVEL_MAX_GPUS),
            model=model, batch_size=batch,
            total_steps=_int(path, line, "total_steps", row["total_steps"], lo=1),
            group=row_vc))
    if not jobs and seeds:
        if seed not in seeds:
            raise TraceError(path, 0, "seed", seed,
                             f"no row of seed {seed}: the file's seeds are "
                             f"{', '.join(map(str, sorted(seeds)))}")
        shown = sorted(vcs)
        raise TraceError(path, 0, "vc", vc,
                         f"no row of seed {seed} is of this VC: its VCs are "
                         f"{', '.join(shown[:10])}"
                         + (f" and {len(shown) - 10} more" if len(shown) > 10 else ""))
    return _sorted(jobs)


# ----------------------------------------------------------------------------- SWF

SWF_FIELDS = ("job", "submit", "wait", "run_time", "alloc_procs", "avg_cpu_time", "used_memory",
              "req_procs", "req_time", "req_memory", "status", "user", "group", "executable",
              "queue", "partition", "preceding_job", "think_time")


def load_swf(path: str | Path) -> tuple[list[TraceJob], int]:
    """A Standard Workload Format log (Parallel Workloads Archive; ``;`` comment lines,
    18 whitespace-separated numeric fields per job, -1 = unknown).

    Each job: ``arrival_s`` = submit time (field 2) from the first submission,
    ``duration_s`` = run time (field 4), ``gpus`` = allocated processors (field 5,
    or requested, field 8, when unknown): SWF logs count CPUs, used here as the
    job's resource count; ``nodes`` unknown; group = "u<user id>" (field 12).
    Jobs whose submit time, run time or processor count is unknown are skipped
    (counted in ``skipped``); a log with jobs of which none is left is refused.

    Returns ``(jobs, skipped)``.

    Raises:
        TraceError: a row without 18 fields, a non-numeric field, or a negative
            value other than -1; or jobs none of which is known well enough to
            simulate (field ``alloc_procs`` when a job lacks its processor count,
            else the unknown field; the message names the fields and lines).
    """
    path = Path(path)
    jobs, skipped, names = [], 0, []
    why: dict[str, list[int]] = {}   # field unknown -> [jobs, first line]
    for line, text in _lines(path):
        s = text.strip()
        if not s or s.startswith(";"):
            continue
        parts = s.split()
        if len(parts) != len(SWF_FIELDS):
            raise TraceError(path, line, "row", s,
                             f"expected {len(SWF_FIELDS)} fields, got {len(parts)}")
        vals = []
        for name, raw in zip(SWF_FIELDS, parts, strict=True):
            # ASCII decimal notation only (float() takes 1_451 and full-width digits); the
            # counts and ids as integers (1e1 processors were 10 GPUs).
            pattern = _INT_TEXT if name in _SWF_INTEGERS else _FLOAT_TEXT
            if not (raw.isascii() and pattern.fullmatch(raw)):
                raise TraceError(path, line, name, raw, "not an integer" if
                                 name in _SWF_INTEGERS else "not a number")
            v = float(raw)
            if not math.isfinite(v) or v > MAX_TRACE_INT:
                raise TraceError(path, line, name, raw, f"must be <= {MAX_TRACE_INT}")
            if v < 0 and v != -1:
                raise TraceError(path, line, name, raw, "must be >= 0 or -1 (unknown)")
            vals.append(v)
        rec = dict(zip(SWF_FIELDS, vals, strict=True))
        procs = rec["alloc_procs"] if rec["alloc_procs"] >= 0 else rec["req_procs"]
        unknown = [f for f, v in (("submit", rec["submit"]), ("run_time", rec["run_time"]),
                                  ("alloc_procs", procs)) if v < 0]
        if unknown:
            skipped += 1
            for f in unknown:
                why.setdefault(f, [0, line])[0] += 1
            continue
        for name in ("job", "alloc_procs", "req_procs"):
            if rec[name] != int(rec[name]):
                raise TraceError(path, line, name, parts[SWF_FIELDS.index(name)],
                                 "not an integer")
        name = str(int(rec["job"]))
        names.append((line, name))
        user = int(rec["user"])
        jobs.append(TraceJob(name=name, arrival_s=rec["submit"], gpus=int(procs),
                             duration_s=rec["run_time"],
                             group=f"u{user}" if user >= 0 else ""))
    if not jobs and skipped:
        _no_swf_job(path, skipped, why)
    _check_unique(path, names)
    origin = min((j.arrival_s for j in jobs), default=0.0)
    return _rebase(jobs, origin), skipped


#: The SWF fields that are counts or ids (the others are times, sizes or averages).
_SWF_INTEGERS = frozenset(("job", "alloc_procs", "req_procs", "status", "user", "group",
                           "executable", "queue", "partition", "preceding_job"))

_SWF_UNKNOWN = {"submit": "submit time (field 2, submit)",
                "run_time": "run time (field 4, run_time)",
                "alloc_procs": "processor count (field 5, alloc_procs, and 8, req_procs)"}


def _no_swf_job(path: Path, skipped: int, why: dict[str, list[int]]) -> None:
    """Refuse an SWF log none of whose ``skipped`` jobs can be simulated, naming the
    fields (``why``: field -> [jobs where it is -1, first such line]); the error's
    field is ``alloc_procs`` if a job lacks its processor count, else the first."""
    field = "alloc_procs" if "alloc_procs" in why else next(iter(why))
    if len(why) == 1:
        n, first = why[field]
        problem = (f"the {_SWF_UNKNOWN[field]} is unknown (-1) on all {n} job(s) "
                   f"(the first on line {first})")
    else:
        problem = (f"each of its {skipped} job(s) lacks a field the simulator needs (-1): "
                   + "; ".join(f"the {_SWF_UNKNOWN[f]} on {n} (the first on line {first})"
                               for f, (n, first) in why.items()))
    raise TraceError(path, 0, field, -1, f"no job to simulate: {problem}")


# ----------------------------------------------------------------------------- sacct

_TRES_GPU = re.compile(r"(?:^|,)(gres/gpu(?::[^=,]+)?=([^,]*))")
_GRES_GPU = re.compile(r"(?:^|,)(gpu(?::[^,(]*)?)(?=[,(]|$)")
_ELAPSED = re.compile(r"^(?:(?P<d>[0-9]+)-)?(?:(?P<h>[0-9]+):)?(?P<m>[0-9]+):(?P<s>[0-9]+(?:\.[0-9]+)?)$")
_UNSET_TIMES = {"", "Unknown", "None", "N/A"}


def _elapsed(path: Path, line: int, field: str, raw: str) -> float:
    m = _ELAPSED.match(raw.strip())
    if m is None:
        raise TraceError(path, line, field, raw, "not a duration [D-][HH:]MM:SS")
    if any(len((m[g] or "").lstrip("0")) > 9 for g in "dhm") or len(m["s"]) > 30:
        # (a day count of thousands of digits was a ValueError from int(), and
        # 99999999999999999999 days was a duration)
        raise TraceError(path, line, field, raw, "not a duration [D-][HH:]MM:SS of at "
                         "most 999,999,999 days")
    if int(m["m"]) > 59 or float(m["s"]) >= 60 or (m["d"] and int(m["h"] or 0) > 23):
        raise TraceError(path, line, field, raw, "not a duration [D-][HH:]MM:SS (minutes "
                         "and seconds below 60, hours below 24 after a day count)")
    return (int(m["d"] or 0) * 86400 + int(m["h"] or 0) * 3600 + int(m["m"]) * 60
            + float(m["s"]))


def _sacct_gpus(path: Path, line: int, row: dict[str, str]) -> int:
    """GPUs from AllocTRES/ReqTRES ("gres/gpu=4"), else AllocGRES/ReqGRES ("gpu:4",
    "gpu:a100:4(IDX:0-3)"), else 0. Every GPU entry of these fields is checked, even
    one not used: a count that is not an integer >= 0 (or a GRES entry without one)
    is a malformed row."""
    counts: dict[str, int] = {}
    for field in ("AllocTRES", "ReqTRES"):
        raw = row.get(field) or ""
        for m in _TRES_GPU.finditer(raw):
            n = _gpu_count(m.group(2))
            if n is None:
                raise TraceError(path, line, field, raw, f"the gres/gpu count {_shown(m.group(2))} "
                                 f"is not an integer from 0 to {MAX_TRACE_INT}")
            counts.setdefault(field, n)
    for field in ("AllocGRES", "ReqGRES"):
        raw = row.get(field) or ""
        for m in _GRES_GPU.finditer(raw):
            count = m.group(1).split(":")[-1] if ":" in m.group(1) else ""
            n = _gpu_count(count)
            if n is None:
                raise TraceError(path, line, field, raw, f"{_shown(m.group(1))} has no GPU count "
                                 f"(expected gpu[:type]:N, N an integer from 0 to {MAX_TRACE_INT})")
            counts.setdefault(field, n)
    for field in ("AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES"):
        if field in counts:
            return counts[field]
    return 0


def _gpu_count(text: str) -> int | None:
    """A GPU count: ASCII digits up to `MAX_TRACE_INT`, else None."""
    text = text.strip()
    if not re.fullmatch(r"[0-9]+", text) or len(text.lstrip("0")) > 19:
        return None   # (int() of more than 4,300 digits raised ValueError)
    n = int(text)
    return n if n <= MAX_TRACE_INT else None


def _load_sacct_text(path: Path) -> tuple[list[TraceJob], int]:
    fh = _open_text(path)
    jobs, skipped = [], 0
    try:
        with fh:
            header_line = fh.readline()
            header = header_line.rstrip("\r\n").split("|")
            if header and header[-1] == "":
                header = header[:-1]   # sacct -p ends every line with "|"
            for need in ("JobID", "Submit"):
                if need not in header:
                    raise TraceError(path, 1, "header", header_line.strip(),
                                     f"missing column {need} (sacct -P --format=JobID,...)")
            if "Elapsed" not in header and not {"Start", "End"} <= set(header):
                raise TraceError(path, 1, "header", header_line.strip(),
                                 "needs Elapsed or Start and End")
            for line, text in enumerate(fh, start=2):
                text = text.rstrip("\r\n")
                if not text.strip():
                    continue
                parts = text.split("|")
                if len(parts) == len(header) + 1 and parts[-1] == "":
                    parts = parts[:-1]
                if len(parts) != len(header):
                    raise TraceError(path, line, "row", text[:80],
                                     f"expected {len(header)} fields, got {len(parts)}")
                row = dict(zip(header, parts, strict=True))
                jid = row["JobID"].strip()
                if not re.match(r"^[0-9]+(?:_[0-9]+|_\[[^\]]*\]|\+[0-9]+)?(?:\.[A-Za-z0-9_]+)?$",
                                jid):
                    raise TraceError(path, line, "JobID", jid, "not a Slurm job id")
                if "." in jid:
                    continue   # a job step (123.batch, 123.0, 123.extern)
                submit = _datetime(path, line, "Submit", row["Submit"], "%Y-%m-%dT%H:%M:%S")
                start_raw = row.get("Start", "")
                if start_raw in _UNSET_TIMES and "Start" in row:
                    skipped += 1   # never started (e.g. cancelled while pending)
                    continue
                if row.get("End", "") in _UNSET_TIMES and "End" in row:
                    skipped += 1   # still running (its Elapsed is the time so far)
                    continue
                if "Start" in row and "End" in row:
                    start = _datetime(path, line, "Start", start_raw, "%Y-%m-%dT%H:%M:%S")
                    end = _datetime(path, line, "End", row["End"], "%Y-%m-%dT%H:%M:%S")
                    if end < start:
                        raise TraceError(path, line, "End", row["End"], "before Start")
                if "Elapsed" in row:
                    duration = _elapsed(path, line, "Elapsed", row["Elapsed"])
                else:
                    duration = (end - start).total_seconds()
                nodes = None
                for f in ("NNodes", "ReqNodes"):
                    if row.get(f, "").strip():
                        nodes = _int(path, line, f, row[f].strip(), lo=0)
                        break
                jobs.append(TraceJob(name=jid, arrival_s=submit.timestamp(),
                                     gpus=_sacct_gpus(path, line, row), duration_s=duration,
                                     nodes=nodes, group=row.get("Partition", "").strip()))
    except (*READ_ERRORS, UnicodeDecodeError) as exc:
        raise _read_error(path, exc) from None
    jobs = _uniquify(jobs)
    origin = min((j.arrival_s for j in jobs), default=0.0)
    return _rebase(jobs, origin), skipped


class _LongNumber(str):
    """A JSON integer literal of more digits than any count or time has (Python's
    reader refuses one above 4,300 digits; read as this, it is refused with its path)."""

    def __repr__(self) -> str:
        return f"<an integer of {len(self.lstrip('-'))} digits>"


def _json_int(text: str) -> int | _LongNumber:
    """``json.load``'s ``parse_int``: an int, or a `_LongNumber` above 30 digits."""
    return _LongNumber(text) if len(text.lstrip("-")) > 30 else int(text)


def _json_number(path: Path, where: str, field: str, raw: Any) -> float | None:
    """A number from sacct --json: plain, or {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(raw, dict):
        if not raw.get("set", True) or raw.get("infinite", False):
            return None
        raw = raw.get("number")
    if isinstance(raw, _LongNumber) or (isinstance(raw, int) and not isinstance(raw, bool)
                                        and abs(raw) > MAX_TRACE_INT):
        # (math.isfinite raised OverflowError on an integer above 1e308)
        raise TraceError(path, 0, field, raw, f"a number beyond +-{MAX_TRACE_INT}")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise TraceError(path, 0, field, raw, f"{where}: not a number")
    return float(raw)


def _json_gpus(path: Path, field: str, entries: Any) -> int | None:
    """The count of the first ``gres`` ``gpu`` entry of a sacct --json TRES list
    (None: no list, or no GPU entry in it).

    Raises:
        TraceError: not a list, an entry not an object, or a GPU count that is not
            an integer >= 0.
    """
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise TraceError(path, 0, field, entries, "expected a list of TRES entries")
    found = None
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise TraceError(path, 0, f"{field}[{i}]", e, "not an object")
        if e.get("type") == "gres" and str(e.get("name", "")).split(":")[0] == "gpu":
            count = e.get("count")
            if isinstance(count, bool) or not isinstance(count, int) or \
                    not 0 <= count <= MAX_TRACE_INT:
                raise TraceError(path, 0, f"{field}[{i}].count", count,
                                 f"the GPU count is not an integer from 0 to {MAX_TRACE_INT}")
            if found is None:
                found = count
    return found


def _load_sacct_json(path: Path) -> tuple[list[TraceJob], int]:
    fh = _open_text(path)
    try:
        with fh:
            doc = json.load(fh, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise TraceError(path, exc.lineno, "json", exc.msg, "not valid JSON") from None
    except RecursionError:
        # (Python's decoder recurses per nesting level: a file of 100000 '[' stops it)
        raise TraceError(path, 0, "", None, f"JSON nested too deeply to read (lists or "
                         f"objects more than about {sys.getrecursionlimit()} levels deep; "
                         f"a sacct --json export has fewer than 10)") from None
    except (*READ_ERRORS, UnicodeDecodeError) as exc:
        raise _read_error(path, exc) from None
    if not isinstance(doc, dict) or "jobs" not in doc:
        raise TraceError(path, 0, "", None, "not a sacct --json export: expected an object "
                         "with a 'jobs' list")
    if not isinstance(doc["jobs"], list):
        raise TraceError(path, 0, "jobs", type(doc["jobs"]).__name__,
                         "expected a list (sacct --json)")
    jobs, skipped = [], 0
    for i, rec in enumerate(doc["jobs"]):
        where = f"jobs[{i}]"
        if not isinstance(rec, dict):
            raise TraceError(path, 0, where, rec, "not an object")
        jid_raw = rec.get("job_id")
        if isinstance(jid_raw, bool) or not isinstance(jid_raw, int) or \
                not 1 <= jid_raw <= MAX_TRACE_INT:
            raise TraceError(path, 0, f"{where}.job_id", jid_raw,
                             f"not an integer from 1 to {MAX_TRACE_INT}")
        arr = rec.get("array") or {}
        task = arr.get("task_id") if isinstance(arr, dict) else None
        task_n = _json_number(path, where, f"{where}.array.task_id", task) \
            if task is not None else None
        parent = arr.get("job_id") if isinstance(arr, dict) else None
        if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int)
                                   or parent < 0):
            raise TraceError(path, 0, f"{where}.array.job_id", parent,
                             "not an integer >= 0 (0: not an array job)")
        if task_n is not None and not (task_n >= 0 and float(task_n).is_integer()):
            raise TraceError(path, 0, f"{where}.array.task_id", task, "not an integer >= 0")
        jid = f"{parent}_{int(task_n)}" if task_n is not None and parent else str(jid_raw)
        t = rec.get("time")
        if not isinstance(t, dict):
            raise TraceError(path, 0, f"{where}.time", t, "missing time object")
        if t.get("submission") is None:
            raise TraceError(path, 0, f"{where}.time.submission", None,
                             "missing submission time")
        submit = _json_number(path, where, f"{where}.time.submission", t.get("submission"))
        start = _json_number(path, where, f"{where}.time.start", t.get("start", 0))
        end = _json_number(path, where, f"{where}.time.end", t.get("end", 0))
        if submit is None or submit <= 0:
            raise TraceError(path, 0, f"{where}.time.submission", t.get("submission"),
                             "missing submission time" if submit is None else
                             "not a submission time (seconds since 1970, > 0)")
        if not start or not end:
            skipped += 1   # never started, or still running
            continue
        if end < start:
            raise TraceError(path, 0, f"{where}.time.end", t.get("end"),
                             f"before {where}.time.start ({start:.0f})")
        elapsed = t.get("elapsed")
        duration = _json_number(path, where, f"{where}.time.elapsed", elapsed) \
            if elapsed is not None else None
        if duration is None:   # absent or {"set": false}: from start and end
            duration = end - start
        elif duration < 0:
            raise TraceError(path, 0, f"{where}.time.elapsed", elapsed, "negative")
        tres = rec.get("tres") or {}
        if not isinstance(tres, dict):
            raise TraceError(path, 0, f"{where}.tres", tres, "expected an object")
        gpus = _json_gpus(path, f"{where}.tres.allocated", tres.get("allocated"))
        requested = _json_gpus(path, f"{where}.tres.requested", tres.get("requested"))
        if gpus is None:
            gpus = requested
        nodes_raw = rec.get("allocation_nodes")
        nodes = None
        if nodes_raw is not None:
            n = _json_number(path, where, f"{where}.allocation_nodes", nodes_raw)
            if n is not None and not (n >= 0 and n == int(n)):
                raise TraceError(path, 0, f"{where}.allocation_nodes", nodes_raw,
                                 f"{where}: not an integer >= 0")
            nodes = int(n) if n is not None else None
        jobs.append(TraceJob(name=jid, arrival_s=submit, gpus=gpus or 0, duration_s=duration,
                             nodes=nodes, group=str(rec.get("partition") or "")))
    jobs = _uniquify(jobs)
    origin = min((j.arrival_s for j in jobs), default=0.0)
    return _rebase(jobs, origin), skipped


def _load_eagle_csv(path: Path) -> tuple[list[TraceJob], int]:
    jobs, skipped = [], 0
    need = ("job_id", "partition", "nodes_req", "gpus_req", "submit_time", "start_time",
            "run_time")
    for line, row in _csv_rows(path, need):
        jid = row["job_id"].strip()
        if not re.match(r"^[0-9]+(?:_[0-9]+)?$", jid):
            raise TraceError(path, line, "job_id", jid, "not a Slurm job id")
        submit = _datetime(path, line, "submit_time", row["submit_time"], "%Y-%m-%d %H:%M:%S")
        if row["start_time"].strip() in _UNSET_TIMES:
            skipped += 1
            continue
        _datetime(path, line, "start_time", row["start_time"], "%Y-%m-%d %H:%M:%S")
        jobs.append(TraceJob(name=jid, arrival_s=submit.timestamp(),
                             gpus=_int(path, line, "gpus_req", row["gpus_req"]),
                             duration_s=_float(path, line, "run_time", row["run_time"]),
                             nodes=_int(path, line, "nodes_req", row["nodes_req"], lo=1),
                             group=row["partition"].strip()))
    jobs = _uniquify(jobs)
    origin = min((j.arrival_s for j in jobs), default=0.0)
    return _rebase(jobs, origin), skipped


def load_sacct(path: str | Path) -> tuple[list[TraceJob], int]:
    """A Slurm accounting export, format detected from its start:

    * ``sacct --json`` (``{"jobs": [...]}``; 22.05 plain numbers and 23.02+
      ``{"set", "infinite", "number"}`` objects both accepted): submission, start,
      end and elapsed from ``time``, GPUs from ``tres.allocated`` (else
      ``tres.requested``) ``gres/gpu`` entries (a count that is not an integer
      >= 0 is refused), nodes from ``allocation_nodes``.
    * ``sacct -P`` (or ``-p``) text with a header line, e.g. ``sacct -a -X -P
      --format=JobID,JobName,Partition,Submit,Start,End,Elapsed,NNodes,AllocTRES``:
      needs JobID, Submit and Elapsed (or Start and End); GPUs from
      AllocTRES/ReqTRES ``gres/gpu=N`` (else AllocGRES/ReqGRES ``gpu[:type]:N``,
      else 0; a GPU count that is not an integer >= 0 is a malformed row);
      job steps (``123.batch``) are ignored.
    * The NREL Eagle sample's sacct-derived CSV (``job_id,...,gpus_req,...,
      submit_time,start_time,end_time,run_time,...``).

    Each job: arrival from its submit time (relative to the first), ``duration_s``
    its elapsed run time, ``gpus``, ``nodes``, group = partition, named by job id
    (a repeated id, as ``sacct --duplicates`` lists a requeued job or an export
    that dropped array task indices has it, becomes ``<id>#2``, ``<id>#3``, ...
    in file order).
    Jobs that never started or are still running are skipped.

    Returns ``(jobs, skipped)``.

    Raises:
        TraceError: unknown format, missing columns, or a bad value (JSON nested too
            deeply for Python's decoder is refused as such).
    """
    path = Path(path)
    fh = _open_text(path)
    try:
        with fh:
            head = fh.read(4096)
    except (*READ_ERRORS, UnicodeDecodeError) as exc:
        raise _read_error(path, exc) from None
    first = head.lstrip()[:1]
    first_line = head.split("\n", 1)[0]
    if first == "{":
        return _load_sacct_json(path)
    if "|" in first_line:
        return _load_sacct_text(path)
    if first_line.startswith("job_id,") or ",submit_time," in first_line:
        return _load_eagle_csv(path)
    raise TraceError(path, 1, "header", first_line[:80],
                     "not sacct --json, sacct -P text, or the Eagle sacct CSV")
