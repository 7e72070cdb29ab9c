"""The production decision loop in simulation: the daemon's `Daemon` on the engine's clock.

One run replays a trace into `SimSlurm` (`malleable.sim.workload.Replay`) and
drives the daemon's own `malleable.daemon.cycle.Daemon` against it:

* its clock is the engine's virtual time (an aware UTC datetime);
* its Slurm is the simulated controller (a `SlurmClient`);
* its spool is a per-run directory that the simulated jobs append progress
  lines to (`malleable.sim.jobs`) and that the daemon reads with the same
  ingestion code it uses on a cluster;
* its state store is a private in-memory SQLite database, opened with the
  store's own engine setup (`malleable.db.engine.make_engine`) and schema
  (Alembic head), one per run.

The cycles are scheduled as the service schedules them
(`malleable.daemon.service.Service`): at start one ``poll_cycle`` and a
forced node refresh, then ``decide_cycle`` at once and every
``decide_interval_s``, ``poll_cycle`` every ``poll_interval_s``, ``ingest``
every ``ingest_interval_s`` and retention every ``housekeeping_interval_s``
(all from the configuration). When several fall on the same instant they run
in the order the service adds its jobs (poll, ingest, decide, housekeeping),
which is the order in which APScheduler's intervals, started microseconds
apart, come due. Nothing of the cycle is replaced; the simulator only
chooses when to call it. The lease, its heartbeat and the systemd watchdog
are process management around the loop and are not simulated.

Event order at one instant: trace submissions, then the jobs' own events,
then Slurm's scheduler pass, then the daemon (`PRIORITY_DAEMON`), then the
scheduler pass its calls triggered. A cycle takes no virtual time.

Work skipped because it cannot change anything (``skip_idle``, on by
default; `tests/sim/test_loop.py` checks that a run gives the same summary and
the same decisions with and without it):

* a scheduled ``ingest`` when no progress line was written since the last
  ingestion (every cycle ingests; the simulator sees every line its jobs
  write): it would find no new bytes in any file and write nothing;
* a scheduled ``ingest`` at the instant of a ``decide_cycle``: the decide
  cycle ingests the same lines at the same virtual time right after its poll
  (only the interleaving of row ids between the poll's job events and the
  ingested events differs, and nothing reads events or samples in id order
  across kinds or jobs);
* a scheduled ``poll_cycle`` at the instant of a ``decide_cycle``, when no
  action is in flight and the daemon is not paused: the decide cycle polls,
  ingests and drives again at the same virtual time with the same Slurm state,
  so the poll cycle's rows, events and samples would be written by it, with
  the same times and values;
* a scheduled ``poll_cycle`` between decide cycles, when no action is in
  flight, the daemon is not paused, and Slurm would report exactly what the
  daemon's last poll saw (`SimSlurm.unchanged_since`: no job started, ended,
  changed size, state, reason or hold): it would write no job event; the
  progress lines it would ingest are ingested by the next cycle that runs
  (at the latest the next decide cycle, before anything reads them) with the
  same times and values, as samples and events carry the times their lines
  state; and with no action in flight its drive has nothing to advance. The
  one value it would change is each running job's attained service, which
  the next poll adds up in one step instead of two; with whole-second
  intervals both sums are exact (whole seconds times whole GPUs), so this
  skip is used only when the poll and decide intervals are whole seconds;
* likewise a scheduled ``ingest`` when no action is in flight and the daemon
  is not paused (its lines are ingested by the next cycle that runs);
* every ``poll_cycle``, ``ingest`` and ``decide_cycle`` while Slurm knows no job
  (none active, none ended within MinJobAge), no action is in flight, the daemon
  is not paused and every progress line was ingested: the poll, ingest and
  decide series move to their first tick at or after the next trace arrival, on
  the same grid (housekeeping keeps its ticks). Each skipped cycle would have
  polled an empty Slurm and recorded a decision with no job: the run's jobs,
  times and targets (``decisions_sha256``) are the same, and only the counts
  ``decide_cycles`` and ``decisions`` in the summary are smaller (the skipped
  decide ticks are in ``CycleStats.skipped_decides``). A trace with idle
  stretches (a site's nights, a sparse log) no longer costs a cycle a minute
  through them. When the next arrival comes after ``--max-time``, housekeeping
  too moves to its last tick before the end of the run (`_ServiceClock._jump_if_idle`).

A run that reaches ``max_time_s`` with jobs left says which and why
(`UnfinishedJob`, `unfinished_summary`): each job's state when the run stopped
(running, pending, held, not submitted) and, for one that was not running, the
daemon's last reason for its target (e.g. the policy's "no feasible size fits:
..." for a job no size of which can run), else Slurm's pending reason. They go to
``summary.json`` (``unfinished_jobs``, grouped by state and reason) and to a
warning in this module's log. A job that can never be placed therefore does not
go unexplained, though the run still lasts until ``max_time_s``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import Engine as StoreEngine

from malleable.config import Config
from malleable.daemon.cycle import Daemon
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, Decision, Job, Setting, Target
from malleable.db.retention import apply_retention
from malleable.sim.engine import PRIORITY_LATE, Engine
from malleable.sim.jobs import ProgressFiles
from malleable.sim.jobsetup import DEFAULT_SETUP, JobSetup, PreparedJob, prepare_jobs, program_for
from malleable.sim.metrics import JobOutcome, summarize
from malleable.sim.slurm import SimSlurm
from malleable.sim.traces import TraceJob
from malleable.sim.workload import Replay, rigid_program
from malleable.slurm.records import JobState

log = logging.getLogger(__name__)

#: Engine priority of the daemon's cycles: after Slurm's scheduler pass of the same instant.
PRIORITY_DAEMON = PRIORITY_LATE + 5

#: Default bound on simulated time (s): a run that has not finished by then stops.
DEFAULT_MAX_TIME_S = 120 * 86400.0

#: Job names listed per group of ``unfinished_jobs`` in the summary (`unfinished_summary`).
UNFINISHED_NAMES = 5

#: `UnfinishedJob.state` values.
UNFINISHED_STATES = ("running", "pending", "held", "not submitted")


@dataclass(frozen=True)
class SimOptions:
    """How one simulated run is set up (the daemon's own settings are in its `Config`).

    Attributes:
        nodes, gpus_per_node: the cluster (N nodes of g GPUs).
        seed: the run's seed (request rounding, the policy's seed).
        restart_cost_s: every malleable job's restart cost (None: per model,
            `malleable.sim.profiles.RESTART_COST_S`).
        setup: how trace jobs become malleable jobs (`malleable.sim.jobsetup`).
        report_interval_s: seconds between a training job's progress lines.
        max_time_s: stop at this virtual time even if jobs are left.
        requeue_delay_s: Slurm's begin-time delay after a requeue.
        backfill_interval_s: Slurm's ``bf_interval`` (`SimSlurm`; 0: backfill at
            every scheduler pass, the default).
        requeue_latency_s: least seconds from a requeue to the job's next start
            (`SimSlurm`; default 0).
        sched_delay_s: seconds from a change (a submission, a job's end, a
            release) to Slurm's scheduler pass (`SimSlurm`; default 0).
        skip_idle: skip scheduled cycles that cannot change anything (module docstring).
        dry_run: the daemon plans and records but changes nothing in Slurm (as
            ``malleable daemon --dry-run``): plain Slurm, observed.
    """

    nodes: int = 16
    gpus_per_node: int = 4
    seed: int = 0
    restart_cost_s: float | None = None
    setup: JobSetup = DEFAULT_SETUP
    report_interval_s: float = 30.0
    max_time_s: float = DEFAULT_MAX_TIME_S
    requeue_delay_s: float = 121.0
    backfill_interval_s: float = 0.0
    requeue_latency_s: float = 0.0
    sched_delay_s: float = 0.0
    skip_idle: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.restart_cost_s is not None and not (
                math.isfinite(self.restart_cost_s) and self.restart_cost_s >= 0):
            raise ValueError(f"restart_cost_s must be a number >= 0, got {self.restart_cost_s!r}")
        if not (self.report_interval_s > 0):
            raise ValueError(f"report_interval_s must be > 0, got {self.report_interval_s!r}")
        if not (self.max_time_s > 0):
            raise ValueError(f"max_time_s must be > 0, got {self.max_time_s!r}")


@dataclass
class CycleStats:
    """Counts and wall time of the daemon's cycles in one run (wall times vary run to run)."""

    polls: int = 0
    ingests: int = 0
    decides: int = 0
    housekeeping: int = 0
    skipped_polls: int = 0
    skipped_ingests: int = 0
    skipped_decides: int = 0
    wall_s: Counter = field(default_factory=Counter)

    def timed(self, kind: str, fn: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.wall_s[kind] += time.perf_counter() - t0


@dataclass
class SimResult:
    """What one run produced.

    Attributes:
        outcomes: one `JobOutcome` per trace job, in trace order.
        summary: `malleable.sim.metrics.summarize` plus the run's counters and
            ``unfinished_jobs`` (`unfinished_summary`; deterministic: the same inputs
            and seed give the same dict).
        allocation_log: ``(virtual s, job id, GPUs)`` at every allocation change.
        timeline: ``(times, used GPUs)`` arrays.
        cycles: the daemon's cycle counts and wall times.
        wall_s: wall time of the whole run (s).
        sim_s: virtual time at the end (s).
        finished: every job ended before ``max_time_s``.
        unfinished: the jobs that had not ended, in trace order ([] if ``finished``).
    """

    outcomes: list[JobOutcome]
    summary: dict
    allocation_log: list[tuple[float, str, int]]
    timeline: tuple
    cycles: CycleStats
    wall_s: float
    sim_s: float
    finished: bool
    unfinished: list[UnfinishedJob] = field(default_factory=list)


@dataclass(frozen=True)
class UnfinishedJob:
    """A job that had not ended when a run stopped (at ``max_time_s``).

    Attributes:
        name: the trace's job name.
        job_id: its Slurm id ("" if it was never submitted).
        state: one of `UNFINISHED_STATES`: "running", "pending" (in Slurm's queue),
            "held" (pending with a hold: the daemon's, e.g. a job checkpointed to 0
            GPUs, or a requeue hold) or "not submitted" (it arrives after the end).
        reason: why it was not running ("" for a running job): the daemon's
            reason for its last target (the policy's words, e.g. "no feasible size
            fits: min 2 GPUs, largest placeable 64"), else Slurm's pending reason
            (e.g. "Resources"), or "arrives after the end of the run".
    """

    name: str
    job_id: str
    state: str
    reason: str


class _ServiceClock:
    """Calls the daemon's cycles at the service's intervals on the engine (see module doc)."""

    ORDER = ("poll", "ingest", "decide", "housekeeping")

    # The series an idle jump moves (housekeeping keeps its ticks: retention runs as
    # the service runs it).
    JUMPING = ("poll", "ingest", "decide")

    def __init__(self, engine: Engine, periods: dict[str, float],
                 actions: dict[str, Callable[[], object]], done: Callable[[], bool],
                 until: float, idle_until: Callable[[], float | None] | None = None) -> None:
        for name, p in periods.items():
            if not (p > 0 and math.isfinite(p)):
                raise ValueError(f"daemon.{name}_interval_s must be > 0, got {p!r}")
        self.engine = engine
        self.periods = periods
        self.actions = actions
        self.done = done
        self.until = until
        # Next tick of each series, as an integer multiple of its period (no drift).
        self.k = {name: 1 for name in periods}
        self.k["decide"] = 0
        self.stopped_at: float | None = None
        self.idle_until = idle_until
        self.skipped_decides = 0   # decide ticks passed over by idle jumps

    def _due(self, name: str) -> float:
        return self.k[name] * self.periods[name]

    def start(self) -> None:
        self.engine.schedule(0.0, self._tick, priority=PRIORITY_DAEMON)

    def due_now(self, name: str) -> bool:
        """Whether series ``name`` comes due at the current instant."""
        return self._due(name) <= self.engine.now + 1e-9

    def _tick(self) -> None:
        now = self.engine.now
        for name in self.ORDER:
            if self.due_now(name):
                self.actions[name]()
                while self._due(name) <= now + 1e-9:
                    self.k[name] += 1
        if self.done():
            self.stopped_at = now
            return
        self._jump_if_idle()
        nxt = min(self._due(n) for n in self.ORDER)
        if nxt <= self.until:
            self.engine.schedule(nxt, self._tick, priority=PRIORITY_DAEMON)

    def _jump_if_idle(self) -> None:
        """Move the poll, ingest and decide series to their first tick at or after the
        time ``idle_until`` gives (on the same grid, whole periods), if it gives one.

        If that time is past the end of the run (the next arrival comes after
        ``until``), only retention would still change the store, and what it deletes
        by age the last tick at or before ``until`` deletes alone: housekeeping
        moves to that tick too. (Its thinning of progress samples and estimates
        keeps other rows than hourly runs would; nothing reads them after the run.)"""
        t = self.idle_until() if self.idle_until is not None else None
        if t is None:
            return
        if t > self.until:
            last = math.floor((self.until + 1e-9) / self.periods["housekeeping"])
            self.k["housekeeping"] = max(self.k["housekeeping"], last)
        t = min(t, self.until)   # (no tick is run or counted past the end of the run)
        for name in self.JUMPING:
            if self._due(name) < t - 1e-9:
                k = max(self.k[name], math.ceil((t - 1e-9) / self.periods[name]))
                if name == "decide":
                    self.skipped_decides += k - self.k[name]
                self.k[name] = k


def open_state_store(url: str = "sqlite://"):
    """A fresh state store at the current schema: ``(engine, sessionmaker)``.

    The default is a private in-memory SQLite database (one connection, used by
    one thread), opened by the store's `make_engine` and created by its Alembic
    migrations, as the service creates an empty database.

    Raises:
        malleable.db.errors.StoreError: the database cannot be opened or created.
    """
    engine = make_engine(url)
    schema.prepare_schema(engine)
    return engine, session_factory(engine)


def run_simulation(jobs: Sequence[TraceJob], config: Config, options: SimOptions | None = None,
                   *, workdir: str | os.PathLike | None = None,
                   progress: Callable[[float, int, int], None] | None = None,
                   db_url: str = "sqlite://") -> SimResult:
    """Replay ``jobs`` through the daemon's decision loop (see the module docstring).

    Args:
        jobs: the trace (arrivals in seconds from 0).
        config: the daemon's settings (policy, intervals, limits); its database
            and spool settings are ignored (each run has its own).
        options: the simulation's settings (cluster, seed, job setup, ...).
        workdir: where the run's spool directory goes (default: a temporary
            directory, removed at the end).
        progress: called after every decide cycle with (virtual s, jobs ended,
            jobs in the trace).
        db_url: the state store (default in memory; a file URL keeps it).

    Returns:
        `SimResult`.

    Raises:
        ValueError: bad options or a job the simulator cannot run.
        malleable.db.errors.StoreError: the state store cannot be opened.
    """
    options = options or SimOptions()
    prepared = prepare_jobs(list(jobs), options.setup, gpus_per_node=options.gpus_per_node,
                            total_gpus=options.nodes * options.gpus_per_node,
                            seed=options.seed, restart_cost_s=options.restart_cost_s)
    return run_prepared(prepared, config, options, workdir=workdir, progress=progress,
                        db_url=db_url)


def run_prepared(prepared: Sequence[PreparedJob], config: Config,
                 options: SimOptions | None = None, *,
                 workdir: str | os.PathLike | None = None,
                 progress: Callable[[float, int, int], None] | None = None,
                 db_url: str = "sqlite://", follow_plan: bool = False) -> SimResult:
    """`run_simulation` for jobs already set up (``options.setup`` is not used):
    e.g. `malleable.sim.predict`'s jobs of a `malleable replay` onto a cluster.
    ``follow_plan``: the jobs take the batch size of the daemon's plan at every start
    (`ProfileJob`'s ``follow_plan``). Same returns and errors as `run_simulation`."""
    options = options or SimOptions()
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="malleable-sim-") as tmp:
            return _run(list(prepared), config, options, Path(tmp), progress, db_url,
                        follow_plan)
    return _run(list(prepared), config, options, Path(workdir), progress, db_url, follow_plan)


def _run(prepared: list[PreparedJob], config: Config, options: SimOptions, workdir: Path,
         progress: Callable[[float, int, int], None] | None, db_url: str,
         follow_plan: bool) -> SimResult:
    t_start = time.perf_counter()
    spool = workdir / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    engine = Engine()
    slurm = SimSlurm(engine, options.nodes, options.gpus_per_node,
                     requeue_delay_s=options.requeue_delay_s,
                     backfill_interval_s=options.backfill_interval_s,
                     requeue_latency_s=options.requeue_latency_s,
                     sched_delay_s=options.sched_delay_s)
    total = slurm.total_gpus
    by_name = {p.trace.name: p for p in prepared}

    written = [0, 0]   # progress records written so far; that many when last ingested
    files = ProgressFiles()   # (closed when the run ends)

    def sink(path: Path, record: dict) -> None:
        files(path, record)
        written[0] += 1

    def build(t: TraceJob):
        p = by_name[t.name]
        if p.profile is None:
            return rigid_program(t)
        return program_for(p, spool_dir=spool, report_interval_s=options.report_interval_s,
                           sink=sink, follow_plan=follow_plan)

    replay = Replay(engine, slurm, [p.trace for p in prepared], spool_dir=spool,
                    program_for=build, comment_for=lambda t: by_name[t.name].comment,
                    restart_cost_s=options.restart_cost_s)
    replay.start()

    db_engine, sessions = open_state_store(db_url)
    try:
        daemon = Daemon(slurm=slurm, sessions=sessions, clock=engine.datetime_at,
                        spool_dir=str(spool), config=config, seed=options.seed,
                        dry_run=options.dry_run)
        stats = CycleStats()
        n_jobs = len(prepared)
        d = config.daemon

        whole = all(float(p).is_integer() for p in (d.poll_interval_s, d.decide_interval_s))
        # `_idle` as read since the last cycle ran (None: not read yet). Only the daemon's
        # cycles (and retention) write the store in a run, so the value holds from one
        # cycle to the next whatever the instant.
        idle_at: list[bool | None] = [None]

        def idle() -> bool:
            if idle_at[0] is None:
                idle_at[0] = _idle(db_engine)
            return idle_at[0]

        def poll() -> None:
            if options.skip_idle and (
                    clock.due_now("decide")
                    or (whole and daemon.poll_ok
                        and slurm.unchanged_since(list(daemon.observed.values())))) \
                    and idle():
                stats.skipped_polls += 1
                return
            stats.polls += 1
            idle_at[0] = None
            stats.timed("poll", daemon.poll_cycle)
            written[1] = written[0]

        def ingest() -> None:
            if options.skip_idle and (written[1] == written[0] or clock.due_now("decide")
                                      or idle()):
                stats.skipped_ingests += 1
                return
            stats.ingests += 1
            idle_at[0] = None
            stats.timed("ingest", lambda: daemon.ingest(engine.datetime_at()))
            written[1] = written[0]

        def decide() -> None:
            stats.decides += 1
            idle_at[0] = None
            stats.timed("decide", daemon.decide_cycle)
            written[1] = written[0]
            if progress is not None:
                progress(engine.now, replay.finished, n_jobs)

        def housekeeping() -> None:
            stats.housekeeping += 1
            idle_at[0] = None
            stats.timed("housekeeping", lambda: apply_retention(
                db_engine, config.retention, now=engine.datetime_at()))

        def first_poll() -> None:
            poll()
            daemon.refresh_nodes(engine.datetime_at(), force=True)

        def idle_until() -> float | None:
            # Nothing in Slurm, nothing in flight, nothing left to read: every cycle until
            # the next arrival would find no job and change nothing but record an empty
            # decision (module docstring).
            if not options.skip_idle or slurm.known_jobs or written[1] != written[0] \
                    or not idle():
                return None
            return replay.next_arrival(engine.now)

        clock = _ServiceClock(
            engine, {"poll": d.poll_interval_s, "ingest": d.ingest_interval_s,
                     "decide": d.decide_interval_s,
                     "housekeeping": d.housekeeping_interval_s},
            {"poll": poll, "ingest": ingest, "decide": decide, "housekeeping": housekeeping},
            done=replay.all_done, until=options.max_time_s, idle_until=idle_until)
        engine.schedule(0.0, first_poll, priority=PRIORITY_DAEMON)
        clock.start()
        engine.run(until=options.max_time_s)
        stats.skipped_decides = clock.skipped_decides
        finished = replay.all_done()
        end = clock.stopped_at if clock.stopped_at is not None else engine.now
        if progress is not None:
            progress(end, replay.finished, n_jobs)
        outcomes = _outcomes(replay.outcomes(), prepared)
        summary = summarize(outcomes, total, slurm.gpu_timeline())
        summary.update(_counters(sessions, stats, finished))
        unfinished = [] if finished else _unfinished(replay, slurm, sessions)
        summary["unfinished_jobs"] = unfinished_summary(unfinished)
        _warn_unfinished(unfinished, end)
        return SimResult(outcomes=outcomes, summary=summary,
                         allocation_log=list(slurm.allocation_log),
                         timeline=slurm.gpu_timeline(), cycles=stats,
                         wall_s=time.perf_counter() - t_start,
                         sim_s=end,
                         finished=finished, unfinished=unfinished)
    finally:
        files.close()
        db_engine.dispose()


# One statement: is any action unfinished, and the paused setting.
_IDLE = select(select(Action.id).where(Action.finished_at.is_(None)).exists(),
               select(Setting.value).where(Setting.key == store.PAUSED_KEY).scalar_subquery())


def _idle(db_engine: StoreEngine) -> bool:
    """No action in flight and not paused: a poll cycle would only poll and ingest.

    One read on a plain connection (no ORM session: this runs at most instants)."""
    with db_engine.connect() as c:
        busy, paused = c.execute(_IDLE).one()
        return not busy and not paused


def _outcomes(outcomes: list[JobOutcome], prepared: list[PreparedJob]) -> list[JobOutcome]:
    """Outcomes with ``gpus_requested`` as the trace asked (before the job setup)."""
    from dataclasses import replace

    return [replace(o, gpus_requested=p.requested) for o, p in zip(outcomes, prepared,
                                                                    strict=True)]


def _unfinished(replay: Replay, slurm: SimSlurm, sessions) -> list[UnfinishedJob]:
    """The jobs of ``replay`` that have not ended, with their state in ``slurm`` and the
    daemon's last reason for them (read from the store once, at the end of a run)."""
    records = {r.job_id: r for r in slurm.jobs()}
    last = (select(Target.job_id, func.max(Target.decision_id).label("decision_id"))
            .group_by(Target.job_id).subquery())
    with sessions() as s:
        reasons = dict(s.execute(
            select(Job.slurm_job_id, Target.reason)
            .join(last, last.c.job_id == Job.id)
            .join(Target, (Target.job_id == last.c.job_id)
                  & (Target.decision_id == last.c.decision_id))).all())
    out = []
    for r in replay.jobs:
        if not r.job_id:
            out.append(UnfinishedJob(r.trace.name, "", "not submitted",
                                     "arrives after the end of the run"))
            continue
        rec = records.get(r.job_id)
        if rec is None or rec.state not in (JobState.PENDING, JobState.RUNNING):
            continue   # ended (or ending: COMPLETING)
        if rec.state == JobState.RUNNING:
            out.append(UnfinishedJob(r.trace.name, r.job_id, "running", ""))
            continue
        reason = reasons.get(r.job_id) or ("" if rec.reason == "None" else rec.reason)
        out.append(UnfinishedJob(r.trace.name, r.job_id, "held" if rec.held else "pending",
                                 reason))
    return out


def unfinished_summary(jobs: Sequence[UnfinishedJob], names: int = UNFINISHED_NAMES
                       ) -> list[dict[str, object]]:
    """``unfinished_jobs`` of summary.json: ``jobs`` grouped by (state, reason).

    Args:
        jobs: the unfinished jobs, in trace order (`SimResult.unfinished`).
        names: how many job names each group lists (its first, in trace order).

    Returns:
        One ``{"state", "reason", "jobs" (count), "names" (list)}`` per group, the
        largest first (then by state, reason); ``[]`` for no job.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for j in jobs:
        groups.setdefault((j.state, j.reason), []).append(j.name)
    rows = [{"state": st, "reason": why, "jobs": len(ns), "names": ns[:names]}
            for (st, why), ns in groups.items()]
    return sorted(rows, key=lambda r: (-r["jobs"], r["state"], r["reason"]))


def _warn_unfinished(jobs: Sequence[UnfinishedJob], end_s: float, groups: int = 5) -> None:
    """One warning for a run that stopped with jobs that were not running (its first
    ``groups`` groups of `unfinished_summary`, the largest first)."""
    waiting = [g for g in unfinished_summary(jobs) if g["state"] != "running"]
    if waiting:
        more = len(waiting) - groups
        log.warning("run stopped at %.0f s with %d job(s) unfinished, %d of them not "
                    "running: %s%s", end_s, len(jobs), sum(g["jobs"] for g in waiting),
                    "; ".join(describe_group(g) for g in waiting[:groups]),
                    f"; {more} more group(s)" if more > 0 else "")


def describe_group(group: dict) -> str:
    """One group of `unfinished_summary` in words: ``held: <reason> (2: a, b)``."""
    names = ", ".join(group["names"]) + (", ..." if group["jobs"] > len(group["names"]) else "")
    reason = f": {group['reason']}" if group["reason"] else ""
    return f"{group['state']}{reason} ({group['jobs']}: {names})"


def _counters(sessions, stats: CycleStats, finished: bool) -> dict[str, object]:
    """Deterministic counters of the daemon's work: cycles, decisions, actions by outcome,
    and ``decisions_sha256``, a hash of every recorded target (decision time, job, GPUs,
    batch) in decision order: two runs that decided alike have the same hash. Of the
    targets the store holds at the end: retention (``finished_job_days``) has pruned
    older decisions and finished jobs, as it does on a cluster."""
    h = hashlib.sha256()
    with sessions() as s:
        decisions = int(s.scalar(select(func.count()).select_from(Decision)) or 0)
        rows = s.execute(select(Action.kind, Action.state, func.count())
                         .group_by(Action.kind, Action.state)).all()
        targets = s.execute(
            select(Decision.id, Decision.time, Job.slurm_job_id, Target.gpus, Target.batch_size)
            .join(Target, Target.decision_id == Decision.id).join(Job, Job.id == Target.job_id)
            .order_by(Decision.id, Job.id))
        for _, t, sid, gpus, batch in targets:
            h.update(f"{t.isoformat()} {sid} {gpus} {batch}\n".encode())
    actions = {f"{k}:{st}": int(n) for k, st, n in sorted(rows)}
    return {"all_finished": finished, "decide_cycles": stats.decides,
            "decisions": decisions, "actions": actions, "decisions_sha256": h.hexdigest()}
