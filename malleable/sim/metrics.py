"""Metrics of a simulation run: JCT, makespan, utilisation, restarts, finish-time fairness.

Input is one `JobOutcome` per job (what happened to it) plus the cluster's
allocated-GPU timeline; output is a flat dict (`summarize`) written as
``summary.json`` with sorted keys and rounded values, so the same run gives
byte-identical files (`write_summary`), and a per-job CSV (`write_jobs_csv`).

Definitions (all times in seconds):

* JCT of a job: end minus arrival (its first submission; a requeue does not reset
  it). ``avg_jct_s``, ``median_jct_s``, ``p99_jct_s`` are over finished jobs; the
  percentile is numpy's default (linear interpolation between order statistics).
* ``makespan_s``: last end minus first arrival (over finished jobs).
* ``gpu_utilization``: allocated GPU-seconds over ``total_gpus * makespan`` in the
  same interval (allocated, whether or not the job was training at that time).
* ``restarts_per_job``: mean Slurm restart count (requeues) over all jobs.
* ``avg_wait_s``: mean of first start minus arrival over jobs that started.
* Finish-time fairness (Themis: Mahajan et al., "Themis: Fair and Efficient GPU
  Cluster Scheduling", NSDI 2020, section 3): ``rho = T_shared / T_ideal`` with
  ``T_shared`` the job's JCT under the policy and ``T_ideal`` its run time alone on
  ``1/N`` of the cluster's GPUs, where ``N`` is the time-averaged number of GPU
  jobs in the system (submitted, not finished: running, pending or held, also
  when a run stopped by ``--max-time`` left them unfinished) during the job's
  life, counting itself; the share is capped at the most GPUs the job can use,
  and its start-up counts in ``T_ideal`` as in its JCT (`malleable.sim.workload`).
  Rho above 1 means the job did worse than under an equal split. ``T_ideal``
  needs a model of the job (`JobOutcome.ideal_time`, a function of a GPU share);
  jobs without one get no rho. CPU-only jobs (0 GPUs requested) are outside
  fairness: they get no rho and do not count in ``N`` (they share no GPU).
  Keys: ``ftf_rho_avg``, ``ftf_rho_max``, ``ftf_unfair_fraction`` (share of
  jobs with rho > 1), over the finished jobs that have a rho.

A metric over an empty set (no job finished, none started, none with a model of
its ideal time) is None (``null`` in summary.json), not 0: a run stopped before
any job ended has no JCT, and 0 would read as a perfect one.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROUND_DIGITS = 3


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one job in a simulation.

    Attributes:
        name: the trace's job name; job_id: the Slurm id it got ("" if never submitted).
        model: training model, None for a rigid job of unknown kind.
        gpus_requested: GPUs it asked for at submission.
        arrival_s: first submission (virtual s); start_s: first start; end_s: end
            (None if it did not start / finish).
        restarts: requeues (Slurm RestartCnt).
        gpu_seconds: GPU-seconds allocated to it.
        ideal_time: seconds the job would take alone on a GPU share (float GPUs),
            for finish-time fairness; None if unknown.
    """

    name: str
    job_id: str
    model: str | None
    gpus_requested: int
    arrival_s: float
    start_s: float | None
    end_s: float | None
    restarts: int = 0
    gpu_seconds: float = 0.0
    ideal_time: Callable[[float], float] | None = field(default=None, compare=False, repr=False)

    @property
    def jct_s(self) -> float | None:
        """End minus arrival, None if unfinished."""
        return None if self.end_s is None else self.end_s - self.arrival_s


def _round(x: float) -> float:
    return float(round(x, ROUND_DIGITS)) if math.isfinite(x) else x


def contention(arrival: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Time-averaged number of jobs in the system during each job's life.

    Args:
        arrival, end: (J,) float, arrival and end of each job (end >= arrival).

    Returns:
        (J,) float: the average over ``[arrival_j, end_j]`` of the number of jobs
        with ``arrival <= t < end`` (at least 1 for a job of zero length).
    """
    arrival = np.asarray(arrival, dtype=float)
    end = np.asarray(end, dtype=float)
    if arrival.shape != end.shape or np.any(end < arrival):
        raise ValueError("arrival and end must have the same shape and end >= arrival")
    if arrival.size == 0:
        return np.zeros(0)
    times = np.concatenate((arrival, end))
    delta = np.concatenate((np.ones_like(arrival), -np.ones_like(end)))
    order = np.lexsort((delta, times))   # at equal times, ends (-1) before arrivals (+1)
    t, d = times[order], delta[order]
    count = np.cumsum(d)                       # jobs in system from t[i] to t[i+1]
    area = np.concatenate(([0.0], np.cumsum(count[:-1] * np.diff(t))))
    span = end - arrival
    integral = np.interp(end, t, area) - np.interp(arrival, t, area)
    with np.errstate(invalid="ignore", divide="ignore"):
        avg = np.where(span > 0, integral / np.where(span > 0, span, 1.0), 1.0)
    return np.maximum(avg, 1.0)


def fairness_rho(outcomes: Sequence[JobOutcome], total_gpus: int) -> np.ndarray:
    """Themis finish-time fairness rho per finished GPU job with an ``ideal_time`` (else NaN).

    ``rho_j = JCT_j / ideal_time_j(total_gpus / N_j)`` with ``N_j`` from `contention`
    over the jobs that share the GPUs: every job that asked for GPUs
    (``gpus_requested > 0``) and was submitted (a ``job_id``), from its arrival to
    its end. A submitted job that has not ended (a run stopped by ``--max-time``:
    running, pending or held) shares them from its arrival on; it is counted until
    the last end of a finished job, which is all a finished job's ``N`` can see of
    it. A CPU-only job (``gpus_requested == 0``) gets no rho (NaN) and is not
    counted: it takes no GPU from the others, and an equal share of the GPUs says
    nothing about its time alone.

    Args:
        outcomes: every job of the run.
        total_gpus: GPUs in the cluster.

    Returns:
        (J,) float, seconds over seconds, in the order of ``outcomes``.
    """
    rho = np.full(len(outcomes), np.nan)
    done = [i for i, o in enumerate(outcomes) if o.end_s is not None and o.gpus_requested > 0]
    if not done:
        return rho
    last = max(float(outcomes[i].end_s) for i in done)  # type: ignore[arg-type]
    sharing = done + [i for i, o in enumerate(outcomes)
                      if o.end_s is None and o.gpus_requested > 0 and o.job_id
                      and o.arrival_s < last]
    arr = np.array([outcomes[i].arrival_s for i in sharing], dtype=float)
    end = np.array([outcomes[i].end_s if outcomes[i].end_s is not None else last
                    for i in sharing], dtype=float)
    n = contention(arr, end)
    for k, i in enumerate(done):
        o = outcomes[i]
        if o.ideal_time is None:
            continue
        ideal = o.ideal_time(total_gpus / n[k])
        if ideal > 0:
            rho[i] = (end[k] - arr[k]) / ideal
    return rho


def utilization(times: np.ndarray, used: np.ndarray, total_gpus: int, start: float,
                stop: float) -> float:
    """Allocated GPU-seconds over ``total_gpus * (stop - start)`` in ``[start, stop]``.

    ``used[i]`` GPUs are allocated from ``times[i]`` until ``times[i+1]`` (the last
    value holds on). Returns 0 for an empty interval.
    """
    if stop <= start or total_gpus <= 0:
        return 0.0
    t = np.asarray(times, dtype=float)
    u = np.asarray(used, dtype=float)
    edges = np.clip(np.concatenate((t, [max(stop, t[-1])])), start, stop)
    return float(np.sum(u * np.diff(edges)) / (total_gpus * (stop - start)))


def summarize(outcomes: Sequence[JobOutcome], total_gpus: int,
              timeline: tuple[np.ndarray, np.ndarray] | None = None,
              ) -> dict[str, float | int | None]:
    """The run's summary metrics (see the module docstring), values rounded to 3 digits.

    Args:
        outcomes: every job of the run.
        total_gpus: GPUs in the cluster.
        timeline: ``(times, used)`` allocated GPUs over time (`SimSlurm.gpu_timeline`);
            without it, utilisation is computed from each job's ``gpu_seconds``.

    Returns keys: jobs, jobs_finished, avg_jct_s, median_jct_s, p99_jct_s,
    max_jct_s, makespan_s, gpu_utilization, gpu_hours, restarts_per_job,
    avg_wait_s, ftf_rho_avg, ftf_rho_max, ftf_unfair_fraction (None for a
    metric over an empty set: the JCTs, makespan and utilisation when no job
    finished, the wait when none started, fairness when no finished GPU job has
    an ideal-time model, restarts when there is no job).
    """
    jcts = np.array([o.jct_s for o in outcomes if o.jct_s is not None], dtype=float)
    finished = [o for o in outcomes if o.end_s is not None]
    waits = np.array([o.start_s - o.arrival_s for o in outcomes if o.start_s is not None])
    out: dict[str, float | int | None] = {"jobs": len(outcomes),
                                          "jobs_finished": len(finished)}
    if jcts.size:
        out.update(avg_jct_s=_round(float(jcts.mean())),
                   median_jct_s=_round(float(np.median(jcts))),
                   p99_jct_s=_round(float(np.percentile(jcts, 99))),
                   max_jct_s=_round(float(jcts.max())))
        first = min(o.arrival_s for o in finished)
        last = max(o.end_s for o in finished)  # type: ignore[type-var]
        makespan = float(last - first)
    else:
        out.update(avg_jct_s=None, median_jct_s=None, p99_jct_s=None, max_jct_s=None)
        first = last = makespan = 0.0
    out["makespan_s"] = _round(makespan) if finished else None
    gpu_s = float(sum(o.gpu_seconds for o in outcomes))
    if not finished or total_gpus <= 0:
        util = None
    elif timeline is not None and makespan > 0:
        util = _round(utilization(timeline[0], timeline[1], total_gpus, first, last))
    else:
        util = _round(gpu_s / (total_gpus * makespan)) if makespan > 0 else 0.0
    out["gpu_utilization"] = util
    out["gpu_hours"] = _round(gpu_s / 3600.0)
    out["restarts_per_job"] = (_round(float(np.mean([o.restarts for o in outcomes])))
                               if outcomes else None)
    out["avg_wait_s"] = _round(float(waits.mean())) if waits.size else None
    rho = fairness_rho(outcomes, total_gpus)
    rho = rho[np.isfinite(rho)]
    out["ftf_rho_avg"] = _round(float(rho.mean())) if rho.size else None
    out["ftf_rho_max"] = _round(float(rho.max())) if rho.size else None
    # (above 1 by more than rounding: a job served exactly as alone has rho 1 +- 1e-15)
    out["ftf_unfair_fraction"] = _round(float(np.mean(rho > 1.0 + 1e-9))) if rho.size else None
    return out


def write_summary(summary: dict[str, object], path: str | Path) -> Path:
    """Write ``summary`` as JSON, keys sorted, 2-space indent, trailing newline.

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(path)
    path.write_text(json.dumps(summary, sort_keys=True, indent=2, allow_nan=False) + "\n",
                    encoding="utf-8")
    return path


JOB_COLUMNS = ("name", "job_id", "model", "gpus_requested", "arrival_s", "start_s", "end_s",
               "jct_s", "wait_s", "restarts", "gpu_seconds", "ftf_rho")


def write_jobs_csv(outcomes: Sequence[JobOutcome], total_gpus: int, path: str | Path) -> Path:
    """One row per job (columns `JOB_COLUMNS`), ordered by arrival then name; empty
    cells for unknown values; numbers rounded to 3 digits.

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(path)
    rho = fairness_rho(outcomes, total_gpus)
    order = sorted(range(len(outcomes)), key=lambda i: (outcomes[i].arrival_s, outcomes[i].name))

    def cell(x: float | None) -> str:
        return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
            else repr(_round(float(x)))

    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(JOB_COLUMNS)
        for i in order:
            o = outcomes[i]
            wait = None if o.start_s is None else o.start_s - o.arrival_s
            w.writerow([o.name, o.job_id, o.model or "", o.gpus_requested, cell(o.arrival_s),
                        cell(o.start_s), cell(o.end_s), cell(o.jct_s), cell(wait), o.restarts,
                        cell(o.gpu_seconds), cell(float(rho[i]))])
    return path
