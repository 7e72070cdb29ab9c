"""The daemon's estimator bookkeeping: per-job estimator state kept across cycles.

The estimators are pure functions over arrays (`malleable.estimators`); this
module feeds them from the state store. It keeps one `EstimatorState` row per
active malleable job, folds in only the progress samples stored since the
previous cycle (a watermark on ``progress_samples.id``), and on a daemon
restart rebuilds each job's state from all its stored samples (the estimators
give the same state either way; docs/estimators.md section 1).

What finished jobs teach the new ones comes from here too: the fitted
throughput parameters of finished malleable jobs of the same group (same model
name in the spec, else same job name and user) become their prior
(`prior_from_finished`, kept per group: `group_prior`), and their total work the history behind
remaining-work estimates for jobs without a declared target (`WorkHistory`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from malleable.db.models import Estimate, Job, ProgressSample
from malleable.db.store import run_core
from malleable.estimators import (
    EstimatorConfig,
    EstimatorState,
    GroupPrior,
    JobSpecs,
    ProgressBatch,
    ThroughputParams,
    WorkHistory,
    candidate_grid,
    group_prior,
)
from malleable.estimators.incremental import CycleMemo, cycle_changed
from malleable.estimators.params import MIN_PRIOR_LOG_SD
from malleable.estimators.pipeline import Estimates
from malleable.estimators.table import SpeedupTable

ESTIMATOR_MODEL = "pollux"  # `Estimate.model`: the name of the throughput model the params belong to


# Built once (building a statement costs more than running it); IN lists expand at run time.
_SAMPLE_COLS = (ProgressSample.id, ProgressSample.job_id, ProgressSample.time,
                ProgressSample.step, ProgressSample.samples, ProgressSample.gpus,
                ProgressSample.nodes, ProgressSample.batch_size, ProgressSample.metric,
                ProgressSample.grad_sqr, ProgressSample.grad_var, ProgressSample.restart)
_TOP_SAMPLE = select(func.max(ProgressSample.id))
# Every job's samples after an id: the id range is the cheap way in (an IN on job_id
# would walk each job's whole index range); other jobs' rows are dropped after.
_SAMPLES_AFTER = select(*_SAMPLE_COLS).where(ProgressSample.id > bindparam("lo"))
_SAMPLES_ALL = select(*_SAMPLE_COLS).where(
    ProgressSample.job_id.in_(bindparam("ids", expanding=True)),
    ProgressSample.id <= bindparam("top"))
_IS_COMPLETED = (Job.malleable.is_(True), Job.state == "COMPLETED")
_COMPLETED = select(Job.id).where(*_IS_COMPLETED)
# How many finished malleable jobs there are and the sum of their ids: one row, so that
# the ids are read only when the set changed (`EstimatorBook._learn_finished`).
_COMPLETED_KEY = select(func.count(), func.coalesce(func.sum(Job.id), 0)).where(*_IS_COMPLETED)
# The last estimate of each of some jobs, with what `group_key` reads of the job.
_LAST_ESTIMATE_ID = (select(Estimate.job_id, func.max(Estimate.id).label("id"))
                     .where(Estimate.job_id.in_(bindparam("ids", expanding=True)),
                            Estimate.model == ESTIMATOR_MODEL)
                     .group_by(Estimate.job_id).subquery())
_LAST_ESTIMATES = (select(Job.id, Job.spec, Job.user, Job.name, Estimate.params)
                   .join(_LAST_ESTIMATE_ID, _LAST_ESTIMATE_ID.c.job_id == Job.id)
                   .join(Estimate, Estimate.id == _LAST_ESTIMATE_ID.c.id).order_by(Job.id))


def _sample_order(r) -> tuple:
    return (r.job_id, r.time, r.id)


def group_key(job: Job) -> str:
    """Which finished jobs are "like" this one: same model, else same name and user."""
    spec = job.spec or {}
    model = spec.get("model")
    return f"model:{model}" if model else f"name:{job.user}/{job.name}"


def _nan(v) -> float:
    return float("nan") if v is None else float(v)


_SPEC_FLOATS = ("max_batch_size", "max_local_batch_size", "target_samples", "target_epochs",
                "samples_per_epoch", "target_steps", "target_metric")


def _spec_row(job: Job) -> tuple:
    """What `job_specs` reads of one job's spec: (min_gpus, max_gpus, step, batch_size
    as declared or None, the `_SPEC_FLOATS` as floats (NaN: not declared), metric
    direction, `group_key`)."""
    spec = job.spec or {}
    return (int(spec.get("min_gpus", 1)), int(spec.get("max_gpus", 1)), int(spec.get("step", 1)),
            spec.get("batch_size"), *(_nan(spec.get(k)) for k in _SPEC_FLOATS),
            -1 if spec.get("metric_goal", "max") == "min" else 1, group_key(job))


def job_specs(jobs: Sequence[Job], groups: dict[str, int], first_batch: dict[int, float],
              cache: dict[int, tuple] | None = None) -> JobSpecs:
    """`JobSpecs` arrays for ``jobs`` from their stored specs.

    Args:
        jobs: active malleable jobs (their ``spec`` is the parsed spec dict).
        groups: group key -> int (`group_key`); unknown keys get -1.
        first_batch: ``jobs.id`` -> the batch size of the job's first sample, used
            as m0 when the spec declares none.
        cache: ``jobs.id`` -> (spec text, user, name, `_spec_row`), kept by the caller
            between cycles: a job's row is recomputed only when one of the three
            changed (the spec is parsed from its text). Jobs not in ``jobs`` are
            dropped from it. None: computed for every job.

    Returns:
        (J,) arrays; a job whose spec lacks a value gets NaN (the estimators flag
        it and fall back to priors; they never raise on per-job values).
    """
    if cache is None:
        rows = [_spec_row(j) for j in jobs]
    else:
        rows = []
        for j in jobs:
            hit = cache.get(j.id)
            if hit is None or hit[0] != j.spec_text or hit[1] != j.user or hit[2] != j.name:
                hit = cache[j.id] = (j.spec_text, j.user, j.name, _spec_row(j))
            rows.append(hit[3])
        if len(cache) > len(rows):
            keep = {j.id for j in jobs}
            for k in [k for k in cache if k not in keep]:
                del cache[k]
    cols = list(zip(*rows, strict=True)) if rows else [()] * 13
    m0 = np.array([_nan(b or first_batch.get(j.id)) for j, b in zip(jobs, cols[3], strict=True)],
                  dtype=np.float64)
    floats = [np.array(c, dtype=np.float64) for c in cols[4:4 + len(_SPEC_FLOATS)]]
    return JobSpecs(
        min_gpus=np.array(cols[0], np.int64),
        max_gpus=np.array(cols[1], np.int64),
        step=np.array(cols[2], np.int64),
        init_batch=m0,
        max_batch=floats[0],
        max_local_batch=floats[1],
        target_samples=floats[2],
        target_epochs=floats[3],
        samples_per_epoch=floats[4],
        target_steps=floats[5],
        target_metric=floats[6],
        metric_direction=np.array(cols[11], np.int64),
        # The progress format's grad_var is normalised to m0 (adaptdl's convention).
        grad_ref_batch=m0,
        history_group=np.array([groups.get(g, -1) for g in cols[12]] if rows else [], np.int64),
    )


@dataclass
class FinishedKnowledge:
    """What finished malleable jobs left behind, by group (in memory; rebuilt from the store)."""

    group: list[str] = field(default_factory=list)
    u: list[list[float]] = field(default_factory=list)
    log_sd: list[list[float]] = field(default_factory=list)
    total_work: list[float] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    def add(self, job_id: int, group: str, params: dict) -> None:
        if job_id in self.seen:
            return
        u, sd, progress = params.get("u"), params.get("log_sd"), params.get("progress")
        if not (isinstance(u, list) and len(u) == 7
                and all(isinstance(x, float | int) for x in u)):
            return
        if not (isinstance(sd, list) and len(sd) == 7
                and all(isinstance(x, float | int) for x in sd)):
            sd = None
        self.seen.add(job_id)
        self.group.append(group)
        self.u.append([float(x) for x in u])
        self.log_sd.append([float(x) for x in sd] if sd is not None else [0.0] * 7)
        self.total_work.append(float(progress) if isinstance(progress, float | int) else math.nan)


class EstimatorBook:
    """Estimator state of the active malleable jobs, updated from the store each cycle.

    Args:
        config: estimator settings (defaults: `EstimatorConfig()`).
    """

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self.ids: list[int] = []                 # jobs.id of each row
        self.state = EstimatorState.empty(0, self.config)
        self.watermark = 0                       # largest progress_samples.id folded in
        self.first_batch: dict[int, float] = {}
        self.spec_rows: dict[int, tuple] = {}     # `job_specs`'s cache
        self.finished = FinishedKnowledge()
        # The last cycle's inputs and estimates per row (`cycle_changed`): a job whose
        # samples, spec and prior did not change keeps its estimate.
        self.memo: CycleMemo | None = None
        self.group_numbers: dict[str, int] = {}   # `_number_groups`
        self._completed_key: tuple | None = None   # (count, sum of ids) last read
        # What the finished jobs give (`_finished_priors`), and what it was built from;
        # per group key: (its finished jobs, its row of `GroupPrior` mean_u and log_sd).
        self._priors_key: tuple | None = None
        self._priors: tuple[GroupPrior, WorkHistory] | None = None
        self._group_priors: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
        # The finished jobs by group (indices into `finished`) and their group numbers,
        # for the first len(self._history_groups) finished jobs (`finished` only grows).
        self._members: dict[str, list[int]] = {}
        self._history_groups: list[int] = []

    # ------------------------------------------------------------------ rows

    def _align(self, ids: list[int]) -> list[int]:
        """Reorder/extend the state's rows to ``ids``; returns the ids that are new."""
        if ids == self.ids:  # the same jobs in the same order: the state as it is
            return []
        pos = {jid: r for r, jid in enumerate(self.ids)}
        if self.memo is not None and self.ids:
            self.memo = self.memo.take(np.array([pos.get(j, -1) for j in ids], dtype=np.int64))
        else:
            self.memo = None
        keep = [pos[j] for j in ids if j in pos]
        new = [j for j in ids if j not in pos]
        kept = self.state.take(np.array(keep, dtype=np.int64))
        parts = [kept] + ([EstimatorState.empty(len(new), self.config)] if new else [])
        kept_ids = [j for j in ids if j in pos]
        self.state = EstimatorState.concat(parts) if new else kept
        order = kept_ids + new
        if order != ids:  # put the rows in the caller's order
            where = {jid: r for r, jid in enumerate(order)}
            self.state = self.state.take(np.array([where[j] for j in ids], dtype=np.int64))
        self.ids = list(ids)
        return new

    # ------------------------------------------------------------------ samples

    def _samples(self, s: Session, ids: list[int], new: list[int]) -> ProgressBatch:
        rows: list = []
        fresh = set(new)
        old = set(ids) - fresh
        # Jobs seen before: only the samples stored since the last cycle. New jobs
        # (and every job after a restart): all their stored samples. ``top``, the
        # largest sample id, bounds both, so a sample stored meanwhile comes next cycle.
        if old:
            lo = self.watermark
            after = run_core(s, _SAMPLES_AFTER, {"lo": lo}).all()
            top = max((r.id for r in after), default=lo)  # no newer ids: none above lo
            rows += [r for r in after if r.job_id in old]
        else:
            top = int(run_core(s, _TOP_SAMPLE).scalar() or 0)
        for chunk in _chunks(new, 500):
            rows += run_core(s, _SAMPLES_ALL, {"ids": chunk, "top": top}).all()
        self.watermark = max(self.watermark, top)
        rows.sort(key=_sample_order)
        row_of = {jid: r for r, jid in enumerate(ids)}
        first_batch = self.first_batch
        for r in rows:
            if r.job_id not in first_batch:
                first_batch[r.job_id] = float(r.batch_size)
        n = len(rows)
        # Columns in _SAMPLE_COLS order: id, job_id, time, step, samples, gpus, nodes,
        # batch_size, metric, grad_sqr, grad_var, restart.
        cols = list(zip(*rows, strict=True)) if n else [()] * len(_SAMPLE_COLS)

        def arr(values, dtype=np.float64):
            return np.fromiter(values, dtype=dtype, count=n)

        def nans(values):
            return arr(_nan(v) for v in values)

        return ProgressBatch(
            job=arr((row_of[j] for j in cols[1]), np.int64),
            t=arr(x.timestamp() for x in cols[2]),
            step=arr(cols[3]), samples=arr(cols[4]), gpus=arr(cols[5]), nodes=nans(cols[6]),
            batch=arr(cols[7]), metric=nans(cols[8]), grad_sqr=nans(cols[9]),
            grad_var=nans(cols[10]), restart=nans(cols[11]))

    # ------------------------------------------------------------------ finished jobs

    def _learn_finished(self, s: Session) -> None:
        """Fold in the last estimate of every finished malleable job not yet seen.

        Only the estimates of jobs not seen yet are read (by job id, in chunks), so
        the cost does not grow with the estimates of jobs learned long ago. While the
        set of finished jobs stays the same (the same count and sum of ids), there is
        nothing new: a finished job gets no new estimate (the decide cycle estimates
        active jobs only), so one whose estimate was missing or unusable stays so.
        """
        key = tuple(run_core(s, _COMPLETED_KEY).one())
        if key == self._completed_key:
            return
        self._completed_key = key
        done = run_core(s, _COMPLETED).scalars()
        todo = sorted(set(done) - self.finished.seen)
        for chunk in _chunks(todo, 500):
            for row in run_core(s, _LAST_ESTIMATES, {"ids": chunk}):
                self.finished.add(row.id, group_key(row), row.params or {})

    def _finished_priors(self, groups: dict[str, int]) -> tuple[GroupPrior, WorkHistory]:
        """The per-group prior and the work history of the finished jobs (``groups``:
        group key -> int, as in `job_specs`).

        Rebuilt only when a finished job was learned or a group got a number:
        `FinishedKnowledge` only grows and `_number_groups` only adds numbers, so the
        two lengths determine both. A group's prior depends on its own finished jobs
        alone (the first n learned of that group), so only the groups that grew are
        fitted again (`group_prior` of that group's jobs; the same values as of all
        jobs at once).
        """
        fk = self.finished
        key = (len(fk.group), len(groups))   # (numbers are never reassigned: `_number_groups`)
        if key != self._priors_key or self._priors is None:
            # Only the jobs finished since the last build are added (not all, per cycle).
            members, hgroups = self._members, self._history_groups
            for i in range(len(hgroups), len(fk.group)):
                g = fk.group[i]
                members.setdefault(g, []).append(i)
                hgroups.append(groups[g])
            for g, idx in members.items():
                if self._group_priors.get(g, (0,))[0] != len(idx):
                    one = group_prior(ThroughputParams.from_u(np.array([fk.u[i] for i in idx])),
                                      np.zeros(len(idx), np.int64),
                                      min_log_sd=MIN_PRIOR_LOG_SD,
                                      log_sd=np.array([fk.log_sd[i] for i in idx]))
                    self._group_priors[g] = (len(idx), one.mean_u[0], one.log_sd[0])
            names = sorted(members, key=groups.__getitem__)
            gp = GroupPrior(np.array([groups[g] for g in names], np.int64),
                            np.array([self._group_priors[g][1] for g in names]),
                            np.array([self._group_priors[g][2] for g in names]),
                            MIN_PRIOR_LOG_SD)
            hg = np.array(hgroups, np.int64)
            self._priors = gp, WorkHistory(np.array(fk.total_work), hg)
            self._priors_key = key
        return self._priors

    def _number_groups(self, keys: set[str]) -> dict[str, int]:
        """Group key -> its number, for every key this book has seen (``keys`` added).

        A key keeps its number for the life of the book (new keys get the next
        numbers, in sorted order): a job's row of `JobSpecs` (its ``history_group``)
        changes only when its own group does, so `cycle_changed` does not fit it
        again because another group appeared or went (numbering the keys in use by
        sorted name, as before, shifted every group after a new one). The numbers
        are identifiers only; no estimate depends on their order.
        """
        numbers = self.group_numbers
        for g in sorted(keys - numbers.keys()):
            numbers[g] = len(numbers)
        return numbers

    # ------------------------------------------------------------------ one cycle

    def run(self, s: Session, jobs: Sequence[Job], gpus_per_node: int, total_gpus: int,
            ) -> tuple[Estimates, SpeedupTable]:
        """Fold new samples in and estimate every job; rows follow ``jobs``' order.

        Args:
            s: a session on the state store (read only here).
            jobs: the active malleable jobs, in the order the policy will see them.
            gpus_per_node: g.
            total_gpus: GPUs malleable jobs may use (caps the candidate grid).

        Returns:
            (estimates, speedup table), both with ``len(jobs)`` rows.

        Raises:
            What reading the store or the estimators raise. The rows are then
            forgotten (`forget_rows`): reading the samples moves the watermark past
            them before they are folded in, so the next run reads every job's
            samples again, as after a restart, instead of missing those.
        """
        try:
            return self._run(s, jobs, gpus_per_node, total_gpus)
        except BaseException:
            self.forget_rows()
            raise

    def forget_rows(self) -> None:
        """Drop every job's row, fold and kept estimate: the next `run` treats every
        job as new and reads all its stored samples (what a restarted daemon does),
        and checks the finished jobs again (a read of theirs cut short is redone;
        those already learned are kept)."""
        self.ids = []
        self.state = EstimatorState.empty(0, self.config)
        self.memo = None
        self._completed_key = None

    def _run(self, s: Session, jobs: Sequence[Job], gpus_per_node: int, total_gpus: int,
             ) -> tuple[Estimates, SpeedupTable]:
        ids = [j.id for j in jobs]
        new = self._align(ids)
        batch = self._samples(s, ids, new)
        self._learn_finished(s)
        fk = self.finished
        groups = self._number_groups(set(fk.group) | {group_key(j) for j in jobs})
        specs = job_specs(jobs, groups, self.first_batch, self.spec_rows)
        prior = None
        history = None
        if fk.group:
            gp, history = self._finished_priors(groups)
            prior = gp.for_jobs(specs.history_group)
        k = candidate_grid(specs.max_gpus, gpus_per_node, max(total_gpus, 1))
        self.state, est, table, self.memo = cycle_changed(
            self.state, batch, specs, k, gpus_per_node, prior=prior, history=history,
            config=self.config, memo=self.memo)
        return est, table


def _json_float(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def estimate_params(est: Estimates, row: int) -> dict:
    """The JSON stored in `Estimate.params` for one job (what a prior needs later).

    Non-finite values are stored as null (JSON has no NaN)."""
    return {"u": [_json_float(x) for x in est.u[row]],
            "log_sd": [_json_float(x) for x in est.log_sd[row]],
            "p": _json_float(est.power_p[row]),
            "phi": _json_float(est.phi[row]),
            "progress": _json_float(est.progress[row]),
            "m0": _json_float(est.m0[row])}


def json_floats(a: np.ndarray) -> list:
    """A (J,) or (J, C) float array as (nested) Python lists of floats, non-finite values
    as None (JSON has no NaN; the same values as `_json_float` element by element)."""
    a = np.asarray(a, dtype=np.float64)
    out = a.tolist()
    bad = ~np.isfinite(a)
    if bad.any():
        if a.ndim == 1:
            for i in np.flatnonzero(bad):
                out[i] = None
        else:
            for i, j in zip(*np.nonzero(bad), strict=True):
                out[i][j] = None
    return out


ESTIMATE_PARAMS = ("u", "log_sd", "p", "phi", "progress", "m0")
"""The keys of `Estimate.params` (`estimate_params`), in `estimate_keys` order."""


def estimate_keys(est: Estimates) -> list[tuple]:
    """What an ``estimates`` row stores of each job, converted in bulk, to compare
    with what was stored (`StoredEstimates`) before building any row.

    Returns:
        One tuple per row of ``est``: its `estimate_params` values in
        `ESTIMATE_PARAMS` order (``u`` and ``log_sd`` as lists), then remaining work
        and its sd (work units; None if not finite), then the flag bits (int).
    """
    cols = [json_floats(a) for a in (est.u, est.log_sd, est.power_p, est.phi, est.progress,
                                     est.m0, est.remaining_work, est.remaining_std)]
    return list(zip(*cols, np.asarray(est.flags).tolist(), strict=True))


def estimate_row(job_id: int, time: datetime, key: tuple) -> dict:
    """A `malleable.db.store.record_estimates` row from one `estimate_keys` tuple
    (``job_id``: ``jobs.id``; ``time``: the cycle's, aware). Its ``params`` equal
    `estimate_params` of the same row."""
    *params, remaining, remaining_sd, bits = key
    return {"job_id": job_id, "time": time, "model": ESTIMATOR_MODEL,
            "params": dict(zip(ESTIMATE_PARAMS, params, strict=True)),
            "remaining_work": remaining, "remaining_work_sd": remaining_sd,
            "flags": {"bits": int(bits)}}


class StoredEstimates:
    """The estimate this daemon last stored per managed job, so that a decide cycle
    writes a job's estimate only when it changed.

    An ``estimates`` row says what the estimators made of a job from its ``time``
    on; while a job waits without new progress or new priors its estimate stays
    the same from cycle to cycle, and rewriting it each cycle was most of a
    decide cycle's writes in a long queue (one row per managed job per cycle).
    The newest row of each job is what readers use (`malleable status`, the
    priors learned from finished jobs), and it holds the same values either way.

    The daemon is the only writer of estimates while it holds the lease. What it
    kept is forgotten when a decide cycle did not commit (`clear`) and after a
    gap longer than ``max_gap_s`` between committed cycles (another daemon may
    have written estimates meanwhile), so that the next cycle writes every job's
    estimate again.
    """

    def __init__(self) -> None:
        self._stored: dict[int, tuple] = {}
        self._staged: dict[int, tuple] | None = None
        self._at: datetime | None = None

    def changed(self, job_ids: Sequence[int], keys: Sequence[tuple], now: datetime,
                max_gap_s: float) -> list[int]:
        """Which jobs' estimates to write this cycle: those with no stored estimate
        or a different one.

        Args:
            job_ids: this cycle's jobs (``jobs.id``), (J,).
            keys: their estimates as `estimate_keys` gives them, (J,).
            now: the cycle's time (aware datetime).
            max_gap_s: seconds since the last committed cycle beyond which nothing
                kept is trusted (the lease timeout).

        Returns:
            Positions in ``job_ids`` to store (`estimate_row`), ascending. They count
            as stored once `committed` is called.
        """
        if self._at is None or (now - self._at).total_seconds() > max_gap_s:
            self._stored.clear()
        stored = self._stored
        self._staged = dict(zip(job_ids, keys, strict=True))
        return [i for i, (j, key) in enumerate(zip(job_ids, keys, strict=True))
                if stored.get(j) != key]

    def committed(self, now: datetime) -> None:
        """The cycle's transaction committed: the rows `changed` saw are the stored
        ones (jobs no longer managed are forgotten)."""
        if self._staged is not None:
            self._stored, self._staged, self._at = self._staged, None, now

    def clear(self) -> None:
        """Forget everything (the cycle's transaction did not commit)."""
        self._stored, self._staged, self._at = {}, None, None


def _chunks(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
