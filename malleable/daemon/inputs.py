"""What the policy sees: the state store and this cycle's poll, as policy records.

Builds the policy's `JobSet` (the managed malleable jobs, FIFO by arrival),
`Capacity` (per node, the GPUs malleable jobs may use: a node's GPUs minus
those held by rigid or unmanaged jobs) and `Context` (time, seed, the size
history of finished jobs), with the estimators' speedup table attached.

A job whose stored values are unusable (a spec the store could not parse, a
size that is not a legal shape, ...) is left out of this cycle with a logged
reason; it never stops the cycle for the others. So is a job whose initial
batch size is not known yet (its spec declares none and it has logged no
progress): the estimators cannot size it (only 0 GPUs would be feasible, and a
pending job would be held for ever), so Slurm runs it at the size it asked for
until its first progress line tells its batch size.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import operator
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from sqlalchemy import bindparam, func, select, type_coerce
from sqlalchemy.orm import Session

from malleable.config import Config
from malleable.daemon.estimates import EstimatorBook
from malleable.db.models import Action, Decision, Job, JobEvent, ProgressSample, Target
from malleable.db.store import run_core
from malleable.db.types import SharedJSON
from malleable.estimators.pipeline import Estimates
from malleable.policies.base import Capacity, Context, JobSet
from malleable.slurm.hostlist import HostlistError, expand_hostlist
from malleable.slurm.records import JobState, SlurmJob, SlurmNode

log = logging.getLogger(__name__)

MANAGED_STATES = (JobState.PENDING.value, JobState.RUNNING.value)


@dataclass
class PolicyInputs:
    """One cycle's policy inputs and what was left out.

    Attributes:
        jobs: the jobs' rows of the ``jobs`` table in the JobSet's order (read-only
            rows with `Job`'s attributes: ``id``, ``slurm_job_id``, ``spec``, ...; all
            but ``submit_time``, ``start_time``, ``end_time`` and ``last_seen``).
        jobset, capacity, context: the policy's records.
        estimates: the estimators' output for ``jobs`` (same order).
        excluded: Slurm id -> why a malleable job was left out this cycle.
        digest: a hash of the inputs (`Decision.inputs_digest`).
        queued: the pending jobs beyond the queue depth (`split_queue`), oldest first:
            rows as ``jobs``, not allocated (also in ``excluded``); the daemon keeps
            them held.
        free_by_node: node name -> GPUs malleable jobs may use there (``capacity``'s
            ``free_per_node`` by name, same order), for the reconciler's placement.
    """

    jobs: list[Job]
    jobset: JobSet
    capacity: Capacity
    context: Context
    estimates: Estimates
    excluded: dict[str, str] = field(default_factory=dict)
    digest: str = ""
    queued: list[Job] = field(default_factory=list)
    free_by_node: dict[str, int] = field(default_factory=dict)


def cluster_gpus_per_node(nodes: Sequence[SlurmNode]) -> int:
    """g: the most common GPU count among nodes with GPUs (the cluster is taken as
    homogeneous; nodes with another count are used only up to g). 0 if none has GPUs."""
    counts = Counter(n.gpus for n in nodes if n.gpus > 0)
    return counts.most_common(1)[0][0] if counts else 0


def managed(job: Job, partitions: Sequence[str]) -> bool:
    """Whether the daemon manages this job: malleable, valid spec, managed partition."""
    if not job.malleable or not job.spec or job.spec_error:
        return False
    if partitions and not (set(job.partition.split(",")) & set(partitions)):
        return False
    return job.state in MANAGED_STATES


def split_queue(jobs: list[Job], observed: dict[str, SlurmJob], depth: int,
                starting: Collection[int] = ()) -> tuple[list[Job], list[Job]]:
    """Bound the policy's problem to the head of the queue, as Slurm's main scheduler
    does with ``default_queue_depth`` (slurm.conf(5), SchedulerParameters): of the
    pending jobs, started before or not, only the first ``depth`` by arrival, and
    those the daemon is starting.

    A requeued or preempted job pending again counts like one that never started:
    if the depth did not bound those, a policy that rotates jobs through the GPUs
    (starvation promotion under overload) would grow the problem to every job that
    ever ran (1,400 jobs in the Philly window, benchmarks/results/sim_speed.txt).
    Such a job keeps its checkpoint while it waits beyond the depth.

    A job's place can move down: an older running job that is requeued pends ahead
    of it. So a pending job the last decision gave GPUs (``starting``: an admission
    or a restart at a new size, not running yet) stays in the problem, outside the
    count, as a running job does: it is not held back in mid-start, and the room its
    start needs stays reserved.

    Args:
        jobs: the managed jobs in queue order (oldest arrival first).
        observed: this cycle's poll by Slurm id (every job of ``jobs`` is in it).
        depth: how many pending jobs the policy considers; 0: all of them.
        starting: ``jobs.id`` of the jobs the last decision gave GPUs (`last_started`).

    Returns:
        (the jobs the policy allocates: every job that is not pending, those in
        ``starting``, and the first ``depth`` other pending ones; the later pending
        jobs), both in the given order.
    """
    if depth <= 0:
        return jobs, []
    kept: list[Job] = []
    queued: list[Job] = []
    n = 0
    for j in jobs:
        if observed[j.slurm_job_id].state == JobState.PENDING and j.id not in starting:
            n += 1
            if n > depth:
                queued.append(j)
                continue
        kept.append(j)
    return kept, queued


_LAST_STARTED = select(Target.job_id).where(
    Target.decision_id == select(func.max(Decision.id)).scalar_subquery(), Target.gpus > 0)


def last_started(s: Session) -> set[int]:
    """``jobs.id`` of the jobs the latest recorded decision gave GPUs (one query over
    that decision's targets; empty before the first decision)."""
    return set(s.scalars(_LAST_STARTED))


@functools.lru_cache(maxsize=4096)
def _node_names(nodes: str) -> tuple[str, ...]:
    """`expand_hostlist` as a tuple, kept for the node lists seen lately (a running
    job's is read every cycle, and it changes only when the job restarts). Raises
    `HostlistError` as it does."""
    return tuple(expand_hostlist(nodes))


def placement_of(sj: SlurmJob) -> tuple[tuple[str, int], ...]:
    """A running job's GPUs per node, ((node name, GPUs), ...) in its node list's order:
    its GPUs per node on each node of ``sj.nodes``; () when it has no node list or an
    unreadable one (logged)."""
    if sj.state != JobState.RUNNING or sj.gpus <= 0 or not sj.nodes:
        return ()
    try:
        names = _node_names(sj.nodes)
    except HostlistError as exc:
        log.warning("job %s: node list %r unreadable (%s); its GPUs are not counted",
                    sj.job_id, sj.nodes, exc, extra={"job": sj.job_id})
        return ()
    per = sj.gpus_per_node or (sj.gpus // max(len(names), 1))
    return tuple((n, per) for n in names)


def node_usage(observed: Iterable[SlurmJob], skip: set[str]) -> dict[str, int]:
    """GPUs in use per node by running jobs not in ``skip`` (the managed ones).

    A job's GPUs per node are spread over its node list; an unparseable node
    list counts against no node (logged).
    """
    used: dict[str, int] = {}
    for sj in observed:
        if sj.job_id in skip:
            continue
        for n, per in placement_of(sj):
            used[n] = used.get(n, 0) + per
    return used


def capacity_for(nodes: Sequence[SlurmNode], free_by_node: dict[str, int]) -> Capacity:
    """The policy's `Capacity` from `pool_by_node`'s free GPUs per node.

    Args:
        nodes: every node (`SlurmClient.nodes`): g is their most common GPU count.
        free_by_node: node name -> GPUs malleable jobs may use there, in name order.

    Returns:
        `Capacity` with ``gpus_per_node`` g and ``free_per_node`` (N,) in [0, g], in
        ``free_by_node``'s order.
    """
    return Capacity(gpus_per_node=max(cluster_gpus_per_node(nodes), 1),
                    free_per_node=np.array(list(free_by_node.values()), dtype=np.int64))


def pool_by_node(nodes: Sequence[SlurmNode], observed: Iterable[SlurmJob],
                 managed_ids: set[str], partitions: Sequence[str]) -> dict[str, int]:
    """Per node, by name and in name order, GPUs malleable jobs may use: usable nodes of
    the managed partitions (``partitions``; empty = every partition), a node's GPUs (at
    most g) less those of the running jobs not in ``managed_ids`` (the jobs the policy
    allocates: their GPUs count as free)."""
    g = cluster_gpus_per_node(nodes)
    used = node_usage(observed, managed_ids)
    free: dict[str, int] = {}
    for n in sorted(nodes, key=lambda n: n.name):
        if not n.usable or n.gpus <= 0:
            continue
        if partitions and not (set(n.partitions) & set(partitions)):
            continue
        free[n.name] = max(0, min(n.gpus, g) - used.get(n.name, 0))
    return free


# Built once (building a statement costs more than running it); IN lists expand at run time.
_IDS = bindparam("ids", expanding=True)
_LAST_CHANGE = (select(JobEvent.job_id, func.max(JobEvent.time))
                .where(JobEvent.job_id.in_(_IDS), JobEvent.kind.in_(("size", "restart")))
                .group_by(JobEvent.job_id))
_REQUESTED = (select(JobEvent.job_id, JobEvent.new_gpus)
              .where(JobEvent.job_id.in_(_IDS), JobEvent.kind == "new"))
_REQUEUES = (select(Action.job_id, Action.signalled_at, Action.finished_at)
             .where(Action.job_id.in_(_IDS), Action.kind == "requeue",
                    Action.state == "done", Action.to_gpus > 0,
                    Action.signalled_at.is_not(None)))
# Every column but the times no reader of `PolicyInputs.jobs` uses (`_UNREAD_TIMES`:
# converting each row's was 1.2 % of the Philly window's wall time); the spec through
# `SharedJSON` (a queue holds few distinct specs, and decoding every row's in every
# cycle was 3.8 %).
_UNREAD_TIMES = frozenset({"submit_time", "start_time", "end_time", "last_seen"})
_MANAGED_ROWS = select(*(type_coerce(c, SharedJSON()).label(c.name) if c.name == "spec" else c
                         for c in Job.__table__.c if c.name not in _UNREAD_TIMES)
                       ).where(Job.malleable.is_(True), Job.state.in_(MANAGED_STATES)
                               ).order_by(Job.id)
_row_id = operator.attrgetter("id")
_SIZE_HISTORY = (select(Job.attained_gpu_s).where(
    Job.malleable.is_(True), Job.state == JobState.COMPLETED.value,
    Job.attained_gpu_s > 0).order_by(Job.id.desc()).limit(bindparam("limit")))


@dataclass
class InputsCache:
    """Per job (``jobs.id``), values `build_inputs` reads from job events that only a poll
    changes, kept between cycles by the daemon:

    * ``requested``: GPUs at first sight (its "new" event: never changes);
    * ``last_change``: the time of its latest "size" or "restart" event, None if none;
      `forget` them for the jobs a poll gave such an event (`UpsertResult.resized`).
    """

    requested: dict[int, int] = field(default_factory=dict)
    last_change: dict[int, datetime | None] = field(default_factory=dict)

    def forget(self, job_ids) -> None:
        """Drop the ``last_change`` of ``job_ids`` (they got a size or restart event)."""
        for j in job_ids:
            self.last_change.pop(j, None)

    def keep_only(self, job_ids: set[int]) -> None:
        """Drop every job not in ``job_ids`` (no longer managed)."""
        for d in (self.requested, self.last_change):
            for j in [j for j in d if j not in job_ids]:
                del d[j]


def _last_change(s: Session, ids: list[int], cache: InputsCache | None = None
                 ) -> dict[int, datetime]:
    """Per job, the time of its latest size or restart event (absent: none)."""
    if cache is None:
        return {j: t for j, t in run_core(s, _LAST_CHANGE, {"ids": ids})}
    missing = [j for j in ids if j not in cache.last_change]
    if missing:
        got = dict(run_core(s, _LAST_CHANGE, {"ids": missing}).all())
        for j in missing:
            cache.last_change[j] = got.get(j)
    return {j: t for j in ids if (t := cache.last_change[j]) is not None}


def _requested(s: Session, ids: list[int], cache: InputsCache | None = None) -> dict[int, int]:
    """Per job, the GPUs it asked for at first sight (absent: no "new" event)."""
    if cache is None:
        return {j: int(g or 0) for j, g in run_core(s, _REQUESTED, {"ids": ids})}
    missing = [j for j in ids if j not in cache.requested]
    if missing:
        cache.requested.update((j, int(g or 0)) for j, g in
                               run_core(s, _REQUESTED, {"ids": missing}))
    return {j: cache.requested[j] for j in ids if j in cache.requested}


def _measured_restart_cost(s: Session, ids: list[int]) -> dict[int, float]:
    """Median seconds from the checkpoint signal to running again, per job, over its
    completed checkpoint-requeues (save + queue + start; load time is in the job's
    own progress)."""
    rows = run_core(s, _REQUEUES, {"ids": ids})
    per: dict[int, list[float]] = {}
    for j, a, b in rows:
        if a is not None and b is not None:
            per.setdefault(j, []).append(max(0.0, (b - a).total_seconds()))
    return {j: float(np.median(v)) for j, v in per.items()}


def _without_batch(s: Session, jobs: list[Job], book: EstimatorBook) -> list[Job]:
    """Jobs with no initial batch size: none declared and no progress sample stored."""
    unknown = [j for j in jobs if not (j.spec or {}).get("batch_size")
               and j.id not in book.first_batch]
    if not unknown:
        return []
    have: set[int] = set()
    ids = [j.id for j in unknown]
    for i in range(0, len(ids), 500):
        have.update(s.scalars(select(ProgressSample.job_id).where(
            ProgressSample.job_id.in_(ids[i:i + 500])).distinct()))
    return [j for j in unknown if j.id not in have]


def size_history(s: Session, limit: int = 5000) -> np.ndarray:
    """Attained service (GPU-seconds) of the latest finished malleable jobs, for Gittins."""
    rows = run_core(s, _SIZE_HISTORY, {"limit": limit})
    return np.array([float(r[0]) for r in rows], dtype=np.float64)


def build_inputs(s: Session, observed: dict[str, SlurmJob], nodes: Sequence[SlurmNode],
                 book: EstimatorBook, now: datetime, config: Config, *, seed: int = 0,
                 with_size_history: bool = True, cache: InputsCache | None = None,
                 known: Iterable[Job] | None = None) -> PolicyInputs:
    """The policy's inputs for this cycle.

    Args:
        s: a session on the state store (the job rows are upserted from ``observed``).
        observed: this cycle's poll by Slurm id (jobs Slurm does not report now are
            not allocated).
        nodes: this cycle's node list.
        book: the estimator bookkeeping (updated here).
        now: the daemon's clock.
        config: settings (partitions, default restart cost).
        seed: the policy's seed.
        with_size_history: read ``Context.size_history`` (finished jobs' attained
            service); False leaves it empty, for a policy that does not use it
            (`Policy.uses_size_history`).
        cache: values kept from earlier cycles (`InputsCache`; the caller forgets
            what its polls changed); None: read every value.
        known: the rows of every stored job in the managed states (pending, running),
            as the caller, the only writer of job rows, keeps them
            (`store.JobRows.in_states`: `JobRow`s, every column but ``last_seen``);
            None: read from the store. The same inputs either way.

    Returns:
        `PolicyInputs`. Never raises for one job's bad values: the job is excluded.
    """
    partitions = list(config.slurm.partitions)
    # Read-only table rows (attributes as `Job`'s), not ORM entities: cheaper to load.
    # The caller's kept rows (`known`) hold the rigid jobs too: `managed` leaves them out.
    # (By id, so that ``excluded`` lists jobs in one order whichever way they came.)
    rows = run_core(s, _MANAGED_ROWS).all() if known is None else \
        sorted((j for j in known if j.malleable), key=_row_id)
    excluded: dict[str, str] = {}
    jobs: list[Job] = []
    for j in rows:
        if j.slurm_job_id not in observed:
            excluded[j.slurm_job_id] = "not in this poll"
            continue
        if not managed(j, partitions):
            excluded[j.slurm_job_id] = "partition not managed" if j.spec else "no valid spec"
            continue
        spec = j.spec or {}
        try:
            lo, hi, st = int(spec["min_gpus"]), int(spec["max_gpus"]), int(spec.get("step", 1))
            if not (1 <= lo <= hi and st >= 1):
                raise ValueError(f"gpus {lo}-{hi}, step {st}")
        except (KeyError, TypeError, ValueError) as exc:
            excluded[j.slurm_job_id] = f"bad spec: {exc}"
            continue
        jobs.append(j)
    unsized = _without_batch(s, jobs, book)
    for j in unsized:
        excluded[j.slurm_job_id] = "no batch size known yet (none in its spec, no progress " \
                                   "logged): left to Slurm"
    unsized_ids = {j.id for j in unsized}
    jobs = [j for j in jobs if j.id not in unsized_ids]
    jobs.sort(key=lambda j: (j.arrival_time or j.first_seen, j.id))
    jobs, queued = split_queue(jobs, observed, config.policy.queue_depth,
                               last_started(s) if config.policy.queue_depth > 0 else ())
    if queued:
        why = (f"waiting beyond the queue depth (policy.queue_depth = "
               f"{config.policy.queue_depth}): held until it moves up")
        for j in queued:
            excluded[j.slurm_job_id] = why
    for sid, why in excluded.items():
        log.debug("left out of this cycle: %s", why, extra={"job": sid})

    managed_ids = {j.slurm_job_id for j in jobs}
    free_by_node = pool_by_node(nodes, observed.values(), managed_ids, partitions)
    capacity = capacity_for(nodes, free_by_node)
    g = capacity.gpus_per_node
    est, table = book.run(s, jobs, g, capacity.total)

    ids = [j.id for j in jobs]
    if cache is not None:
        cache.keep_only(set(ids))
    changed = _last_change(s, ids, cache)
    requested = _requested(s, ids, cache)
    measured = _measured_restart_cost(s, ids)
    default_cost = float(config.policy.default_restart_cost_s)
    now_s = now.timestamp()

    def restart_cost(j: Job) -> float:
        declared = (j.spec or {}).get("restart_cost_s")
        if isinstance(declared, int | float) and math.isfinite(declared) and declared >= 0:
            return float(declared)
        return measured.get(j.id, default_cost)

    # One pass over the jobs, one tuple per job (a column per JobSet field).
    per_job = []
    for j in jobs:
        sj, spec = observed[j.slurm_job_id], j.spec
        lo = int(spec["min_gpus"])
        last = changed.get(j.id)
        per_job.append((
            j.slurm_job_id, lo, int(spec["max_gpus"]), int(spec.get("step", 1)),
            sj.gpus if sj.state == JobState.RUNNING else 0,
            max(0.0, j.attained_gpu_s or 0.0),
            max(0.0, now_s - (j.arrival_time or j.first_seen).timestamp()),
            restart_cost(j),
            math.inf if last is None else max(0.0, now_s - last.timestamp()),
            requested.get(j.id, j.gpus) or lo,
            j.restart_count))
    (sids, lo, hi, step, current, attained, age, cost, since, asked, restarts) = (
        list(zip(*per_job, strict=True)) or [()] * 11)
    current = np.array(current, dtype=np.int64)
    jobset = JobSet(
        ids=np.array(sids, dtype=object),
        min_gpus=np.array(lo, dtype=np.int64),
        max_gpus=np.array(hi, dtype=np.int64),
        step=np.array(step, dtype=np.int64),
        current=current,
        table=table,
        attained=np.array(attained, dtype=np.float64),
        age=np.array(age, dtype=np.float64),
        restart_cost=np.array(cost, dtype=np.float64),
        since_change=np.array(since, dtype=np.float64),
        requested=np.array(asked, dtype=np.int64),
        restarts=np.array(restarts, dtype=np.int64),
    )
    context = Context(now=now_s, seed=seed,
                      size_history=size_history(s) if with_size_history else np.zeros(0))
    digest = hashlib.sha256()
    for arr in (jobset.ids.astype(str), current, capacity.free_per_node,
                np.round(table.goodput, 6), np.round(table.remaining_work, 3)):
        digest.update(np.ascontiguousarray(arr).tobytes())
    return PolicyInputs(jobs, jobset, capacity, context, est, excluded, digest.hexdigest()[:32],
                        queued, free_by_node)
