"""Which trace file, read how: format detection, model mapping, load scaling and windows.

`load_workload` turns a trace file into the `TraceJob` list a run replays:

1. the format (``pollux``, ``philly``, ``gavel``, ``swf``, ``sacct``) is given or
   detected from the file name and first line (`detect_format`);
2. the loader of `malleable.sim.traces` reads it (a malformed row raises
   `TraceError` naming the file, line, field and value);
3. jobs get a profiled model where the format has none (`map_models`):
   Philly rows by GPU-time class as Pollux's workload generator did (done by
   `load_philly`); Gavel's job types by model family (`GAVEL_MODELS`); SWF and
   sacct jobs stay rigid (they run for their recorded duration and are never
   resized) unless ``map_models`` is set, then GPU jobs get a model by GPU-time
   class like Philly's. A job with a model trains it to the model's target
   (Pollux's convention), not for its recorded duration (Philly) or
   ``total_steps`` (Gavel: `malleable.sim.traces.load_gavel` says why);
4. optionally a window of the trace (`busiest_fitting_window`) and a load scale
   (arrival times divided by ``load_scale``: 2.0 = twice the arrival rate).

Pollux's Philly filters (``duration >= 60 s``, ``gpu_time < 1000 GPU-hours``) are
applied to the Philly list, as for Pollux's workloads.
"""

from __future__ import annotations

import gzip
import math
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from malleable.sim.profiles import load_profile
from malleable.sim.traces import (
    READ_ERRORS,
    TraceError,
    TraceJob,
    load_gavel,
    load_philly,
    load_pollux_workload,
    load_sacct,
    load_swf,
    philly_model,
)

FORMATS = ("pollux", "philly", "gavel", "swf", "sacct")

#: Gavel job type (model part) -> the Pollux profile of the same family. ResNet-18
#: (CIFAR-10) and ResNet-50 (ImageNet) are the very models; Recommendation is
#: NCF-like; Transformer and LM are the closest language models (BERT, and the
#: recurrent DeepSpeech2); CycleGAN and A3C have no profiled counterpart and get
#: the closest convolutional profile by image size (YOLOv3, CIFAR-10).
GAVEL_MODELS = {"ResNet-18": "cifar10", "ResNet-50": "imagenet", "Recommendation": "ncf",
                "Transformer": "bert", "LM": "deepspeech2", "CycleGAN": "yolov3",
                "A3C": "cifar10"}

#: What `load_workload` notes about a Gavel trace (`malleable.sim.traces.load_gavel` says why).
GAVEL_NOTE = ("Gavel's total_steps and the job type's batch size are not used: each job "
              "trains its model's profile (the same family's, e.g. Transformer -> bert) to "
              "the profile's target at the profile's batch sizes, as a Philly job does "
              "whatever its duration (docs/simulator.md, Traces)")

#: Pollux's filters of the Philly list (its workload generator, osdi21-artifact).
PHILLY_MIN_DURATION_S = 60.0
PHILLY_MAX_GPU_TIME_S = 1000 * 3600.0


def detect_format(path: str | Path) -> str:
    """The trace format of ``path`` from its name and first line.

    ``.swf`` (or ``.swf.gz``): swf; a header starting ``name,time,application``:
    pollux; ``timestamp,duration,num_gpus``: philly; ``seed,vc,line_no``: gavel;
    a JSON object, a ``|``-separated header, or the Eagle CSV's header
    (``job_id,...`` or one with ``submit_time``): sacct (whose loader tells its
    three layouts apart).

    Raises:
        TraceError: the file cannot be read, is empty, or its first line is none of
            these (the message lists them and points to ``--format``).
    """
    p = Path(path)
    names = [s.lower() for s in p.suffixes]
    if ".swf" in names:
        return "swf"
    try:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8", errors="replace") as fh:
            first = fh.readline().strip().lstrip("\ufeff")
    except READ_ERRORS as exc:
        raise TraceError(p, 0, "", None, f"cannot read trace: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if first.startswith("name,time,application"):
        return "pollux"
    if first.startswith("timestamp,duration,num_gpus"):
        return "philly"
    if first.startswith("seed,vc,line_no"):
        return "gavel"
    if (first.startswith("{") or "|" in first or first.startswith("job_id,")
            or ",submit_time," in first):
        return "sacct"
    if not first:
        raise TraceError(p, 1, "", None, "empty first line: no trace format to recognise "
                         "(name one with --format)")
    raise TraceError(p, 1, "header", first[:80], "no known trace format: expected a Pollux "
                     "CSV (name,time,application,...), the Philly list (timestamp,duration,"
                     "num_gpus,...), a Gavel trace (seed,vc,line_no,...), SWF (*.swf), or "
                     "a sacct export (--json, -P text, the Eagle CSV); or name one with "
                     "--format")


def trace_file_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be a trace file: "no such file", "is a directory", "not a
    regular file (a character device ...)" (/dev/null, a pipe: the loaders read a
    trace more than once), "cannot read it (...)"; None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "no such file"
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
            if stat.S_ISBLK(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a file")
    return f"not a regular file ({kind}); give a trace file"


def workload_name(path: str | Path) -> str:
    """A trace's short name: its file name without ``.gz`` and the last extension."""
    name = Path(path).name
    if name.endswith(".gz"):
        name = name[:-3]
    return name.rsplit(".", 1)[0] if "." in name else name


def unique_names(paths: Sequence[str | Path]) -> list[str]:
    """`workload_name` of each path, prefixed with its parent folder where two collide."""
    names = [workload_name(p) for p in paths]
    dup = {n for n in names if names.count(n) > 1}
    out = [f"{Path(p).resolve().parent.name}-{n}" if n in dup else n
           for p, n in zip(paths, names, strict=True)]
    if len(set(out)) != len(out):
        clash = sorted({n for n in out if out.count(n) > 1})
        same = [str(p) for p, n in zip(paths, out, strict=True) if n in clash]
        raise ValueError(f"traces whose runs would share a name ({', '.join(clash)}): "
                         f"{', '.join(same)}; rename or move one (a run is named by its "
                         f"file name without the extension, and its folder if two collide)")
    return out


def map_models(jobs: list[TraceJob], fmt: str, *, seed: int = 0,
               gpu_time_classes: bool = False) -> list[TraceJob]:
    """Give jobs a profiled model where the format has none (see the module docstring).

    Gavel jobs: `GAVEL_MODELS` by family (an unknown family raises), without the job
    type's batch size (Gavel's implementation's, not the profile's: the job runs at
    the profile's batch sizes) and leaving ``total_steps`` unused. Others with
    ``gpu_time_classes``: jobs with GPUs and a duration get `philly_model` by their
    GPU time (a seeded coin per job in file order picks within a class); the rest
    are unchanged.

    Raises:
        ValueError: a Gavel job type with no mapping.
    """
    if fmt == "gavel":
        out = []
        for j in jobs:
            model = GAVEL_MODELS.get(j.model or "")
            if model is None:
                raise ValueError(f"Gavel job {j.name}: job type {j.model!r} has no profiled "
                                 f"model (known: {', '.join(GAVEL_MODELS)})")
            out.append(replace(j, model=model, batch_size=None))
        return out
    if not gpu_time_classes:
        return jobs
    coins = np.random.default_rng([seed, 2]).random(len(jobs))
    return [replace(j, model=philly_model(j.gpu_time_s, float(u)), batch_size=None)
            if j.gpus > 0 and j.duration_s is not None and j.model is None else j
            for j, u in zip(jobs, coins, strict=True)]


def isolated_demand(job: TraceJob, gpus_per_node: int = 4, max_gpus: int = 64) -> float:
    """GPU-seconds a job needs alone at its request: for a profiled model, its
    isolated training time at the request (capped at ``max_gpus``) times the GPUs;
    otherwise ``gpus * duration_s`` (0 if unknown)."""
    if job.model is not None:
        try:
            prof = load_profile(job.model)
        except ValueError:
            prof = None
        if prof is not None:
            k = max(1, min(job.gpus, max_gpus))
            return prof.isolated_time(k, job.batch_size, gpus_per_node) * k
    return float(job.gpus * (job.duration_s or 0.0))


def busiest_fitting_window(jobs: list[TraceJob], length_s: float, capacity_gpus: float, *,
                           demand: Callable[[TraceJob], float] | None = None,
                           by_group: bool = True) -> tuple[str, float, list[TraceJob]]:
    """The ``length_s`` window of arrivals with the most demand that the cluster can
    serve on average: the largest ``sum(demand) / length_s`` that is at most
    ``capacity_gpus``.

    Windows start at a job's arrival. With ``by_group`` each group (a Philly
    virtual cluster: one tenant's stream of jobs) is windowed on its own and
    the best window over all groups wins (ties: first group by name, earliest
    start); otherwise the trace as a whole. ``demand`` defaults to
    `isolated_demand` (what the simulated jobs need, not the trace's durations).

    Returns:
        ``(group, start_s, jobs)``: the group ("" when not by group), the window's
        start in the input's time base, and its jobs rebased to start at 0.

    Raises:
        ValueError: ``length_s`` or ``capacity_gpus`` not positive, or no window fits.
    """
    if not (length_s > 0) or not (capacity_gpus > 0):
        raise ValueError(f"window length {length_s!r} s and capacity {capacity_gpus!r} GPUs "
                         "must be positive")
    demand = demand or isolated_demand
    groups: dict[str, list[TraceJob]] = {}
    for j in sorted(jobs, key=lambda j: (j.arrival_s, j.name)):
        groups.setdefault(j.group if by_group else "", []).append(j)
    best: tuple[float, str, int, int] | None = None
    for g in sorted(groups):
        js = groups[g]
        t = np.array([j.arrival_s for j in js])
        w = np.array([demand(j) for j in js])
        cum = np.concatenate(([0.0], np.cumsum(w)))
        ends = np.searchsorted(t, t + length_s, side="left")
        load = (cum[ends] - cum[np.arange(len(t))]) / length_s
        ok = load <= capacity_gpus
        if not np.any(ok):
            continue
        i = int(np.argmax(np.where(ok, load, -1.0)))
        if best is None or load[i] > best[0]:
            best = (float(load[i]), g, i, int(ends[i]))
    if best is None:
        raise ValueError(f"no {length_s / 86400:g}-day window's demand fits {capacity_gpus:g} GPUs")
    _, g, i, e = best
    window = groups[g][i:e]
    start = window[0].arrival_s
    return g, start, [replace(j, arrival_s=j.arrival_s - start) for j in window]


def scale_load(jobs: list[TraceJob], load_scale: float) -> list[TraceJob]:
    """Arrivals divided by ``load_scale`` (> 0): the same jobs arriving that much faster.

    Raises:
        ValueError: a scale that is not a positive finite number, or one so small that
            an arrival divided by it is no finite time.
    """
    if not (math.isfinite(load_scale) and load_scale > 0):
        raise ValueError(f"load scale must be a positive number, got {load_scale!r}")
    if load_scale == 1.0:
        return jobs
    out = [replace(j, arrival_s=j.arrival_s / load_scale) for j in jobs]
    for j, o in zip(jobs, out, strict=True):
        if not math.isfinite(o.arrival_s):
            raise ValueError(f"--load-scale {load_scale!r}: job {j.name}'s arrival, "
                             f"{j.arrival_s:g} s, divided by it is no finite time")
    return out


def load_workload(path: str | Path, fmt: str = "auto", *, seed: int = 0, load_scale: float = 1.0,
                  window_days: float | None = None, capacity_gpus: float | None = None,
                  gpus_per_node: int = 4, gpu_time_classes: bool = False,
                  notes: list[str] | None = None) -> list[TraceJob]:
    """Read one trace for a run (see the module docstring).

    Args:
        path: the trace file.
        fmt: one of `FORMATS` or "auto" (`detect_format`).
        seed: seeds the model choice within a GPU-time class (Philly, mapped jobs).
        load_scale: arrival times are divided by it.
        window_days: keep only `busiest_fitting_window` of this many days (needs
            ``capacity_gpus``).
        capacity_gpus: the cluster's GPUs (for the window).
        gpus_per_node: g (for the window's demand).
        gpu_time_classes: map SWF/sacct GPU jobs to models (`map_models`).
        notes: if given, gets one line per kind of row the loader left out (SWF jobs
            with an unknown submit time, run time or processor count; sacct jobs that
            never started or still run), with their count, and for a Gavel trace
            `GAVEL_NOTE` (what of its rows is not used).

    Raises:
        TraceError: a missing, unreadable, empty or not regular file (`trace_file_problem`),
            a malformed row, or a Gavel trace without rows of ``seed % 5`` (field
            ``seed``: the file's seeds and how the run's seed picks one).
        ValueError: an unknown format, a bad scale or window, or a job that cannot
            be mapped.
    """
    p = Path(path)
    problem = trace_file_problem(p)
    if problem:
        raise TraceError(p, 0, "", None, problem)
    if p.stat().st_size == 0:
        raise TraceError(p, 0, "", None, "empty file (no header, no job)")
    fmt = detect_format(p) if fmt == "auto" else fmt
    if fmt == "pollux":
        jobs = load_pollux_workload(p)
    elif fmt == "philly":
        jobs = load_philly(p, seed=seed, min_duration_s=PHILLY_MIN_DURATION_S,
                           max_gpu_time_s=PHILLY_MAX_GPU_TIME_S)
    elif fmt == "gavel":
        try:
            jobs = load_gavel(p, seed=seed % 5)
        except TraceError as exc:
            if exc.field != "seed":
                raise
            if seed == seed % 5:
                raise
            raise TraceError(p, 0, "seed", exc.value, f"{exc.problem} (the run's seed {seed} "
                             f"reads the file's seed {seed} % 5 = {seed % 5})") from None
        if jobs and notes is not None:
            notes.append(GAVEL_NOTE)
    elif fmt == "swf":
        jobs, skipped = load_swf(p)
        if skipped and notes is not None:
            notes.append(f"{skipped} job(s) with an unknown submit time, run time or "
                         f"processor count (-1) left out")
    elif fmt == "sacct":
        jobs, skipped = load_sacct(p)
        if skipped and notes is not None:
            notes.append(f"{skipped} job(s) that never started or still run left out")
    else:
        raise ValueError(f"unknown trace format {fmt!r} (known: auto, {', '.join(FORMATS)})")
    jobs = map_models(jobs, fmt, seed=seed, gpu_time_classes=gpu_time_classes)
    if window_days is not None:
        if capacity_gpus is None:
            raise ValueError("a window needs the cluster's GPU count")
        _, _, jobs = busiest_fitting_window(
            jobs, window_days * 86400.0, capacity_gpus,
            demand=lambda j: isolated_demand(j, gpus_per_node, int(capacity_gpus)))
    return scale_load(jobs, load_scale)
