"""The daemon's decision loop: poll, ingest, decide, apply.

`Daemon` holds what one daemon process keeps between cycles (the estimator
state, ingestion cursors, the last poll) and is driven from outside: by
APScheduler in the service (`malleable.daemon.service`), by the simulator's
event engine, or by ``malleable daemon --once``. Nothing inside reads the wall
clock, runs a subprocess or touches a file except through what it is given:
the clock, the `SlurmClient` and the progress spool directory. So the
simulator runs this very code against a simulated Slurm and virtual time.

Two cycles:

* `poll_cycle`: one ``jobs()`` RPC, job rows and events updated and progress
  ingested (one transaction), in-flight actions advanced. Default every 30 s.
* `decide_cycle`: the same, then estimates, the policy, the reconciler and
  the actions it asks for. Default every 60 s.

Safety rules:

* a failed poll (Slurm unavailable) means stale state: nothing is decided or
  changed until a poll succeeds again;
* a poll that skipped job records it could not parse (the port's
  ``parse_errors``) marks no job as vanished, and an in-flight action whose
  job is missing from it looks the job up (one RPC) instead of giving up on it;
* a job Slurm stopped listing before a poll saw its end (purged after
  MinJobAge) is COMPLETED only if its progress says ``finished``, else
  VANISHED, which the work priors and Gittins' size history do not count;
* paused: observe and plan (decisions are recorded), start no new action;
  actions that have not touched their job yet are dropped, jobs the daemon
  held for admission are released, and actions past that point (a signalled
  job, a requeued one) are driven to their end, so a paused cluster runs as
  plain Slurm;
* dry run: plan and log the actions, change nothing in Slurm;
* one bad job is excluded (logged) and never stops the cycle.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial

import numpy as np
from sqlalchemy import bindparam, select
from sqlalchemy.orm import sessionmaker

from malleable.config import Config
from malleable.daemon.actions import Step
from malleable.daemon.actuator import Actuator, DriveReport
from malleable.daemon.estimates import (
    EstimatorBook,
    StoredEstimates,
    estimate_keys,
    estimate_row,
)
from malleable.daemon.history import daemon_holds, reporting_runs, requeue_backoff
from malleable.daemon.inputs import (
    MANAGED_STATES,
    InputsCache,
    PolicyInputs,
    build_inputs,
    placement_of,
)
from malleable.daemon.logs import job_logger, set_cycle
from malleable.daemon.reconcile import (
    NO_PLACEMENT,
    ActionKind,
    JobView,
    NodePool,
    PlannedAction,
    Target,
    plan_actions,
    start_shape,
)
from malleable.daemon.shapes import Shape
from malleable.db import store
from malleable.db.models import VANISHED, Job, JobEvent
from malleable.estimators import EstimateFlags
from malleable.policies.base import Allocation
from malleable.policies.hysteresis import with_hysteresis
from malleable.policies.registry import get_policy
from malleable.progress.ingest import Cursors, IngestJob, IngestReport, ingest_progress
from malleable.progress.plan import write_plan
from malleable.progress.reporter import Plan
from malleable.progress.spool import SpoolDir
from malleable.slurm.client import SlurmClient, SlurmError, SlurmUnavailable
from malleable.slurm.records import JobState, SlurmJob, SlurmNode
from malleable.spec import SpecError, parse_spec

log = logging.getLogger(__name__)

# Built once (building a statement costs more than running it).
# Stored states of a job Slurm should still report (else it finished unseen).
_ACTIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
# Which of the jobs :ids reported a ``finished`` line.
_FINISHED_EVENT = (select(JobEvent.job_id).where(JobEvent.job_id.in_(bindparam(
    "ids", expanding=True)), JobEvent.kind == "finished").distinct())


def _to_ingest(which):
    """The malleable jobs ``which`` selects, with their progress_files rows (one
    statement; four columns as table rows: no ORM entity, nor its JSON spec, per job)."""
    return store.with_progress_files(select(
        Job.id, Job.slurm_job_id, Job.uid, Job.restart_count).where(
        Job.malleable.is_(True), which)).order_by(Job.id)


# Malleable jobs whose progress is read: active ones, and those seen since ``recent``.
_TO_INGEST = _to_ingest(Job.state.in_(("PENDING", "RUNNING", "COMPLETING", "SUSPENDED"))
                        | (Job.last_seen >= bindparam("recent")))
# States in which a job's processes exist, so it may write progress lines.
_WRITING_STATES = frozenset({JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED,
                             JobState.CONFIGURING})
# The states `_TO_INGEST` reads whatever the job's last sighting.
_READ_BY_STATE = ("RUNNING", "COMPLETING", "SUSPENDED")
# A job stored in one of these is not read by its last sighting (`Daemon._seen_ended`).
_NOT_BY_SIGHTING = frozenset({JobState.PENDING, *map(JobState, _READ_BY_STATE)})
_PENDING = JobState.PENDING
# The same jobs as `_TO_INGEST` less the pending ones that cannot have written since the
# last read (`Daemon._ingest_in`), found by index: the jobs in those states, and by id
# (:ids) the pending ones that may have written and the others seen since ``recent``
# (`Daemon._seen_ended`, so that no query scans every job the store holds for them).
_TO_INGEST_WRITERS = _to_ingest(Job.state.in_(_READ_BY_STATE)
                                | Job.id.in_(bindparam("ids", expanding=True)))
# The same jobs, the ended ones found by their last sighting (a scan), the pending ones
# by id: for more ended jobs seen lately than `_MAX_NAMED_JOBS` (rigid ones count).
_TO_INGEST_SCAN = _to_ingest(
    ((Job.state != JobState.PENDING.value)
     & (Job.state.in_(_READ_BY_STATE) | (Job.last_seen >= bindparam("recent"))))
    | Job.id.in_(bindparam("ids", expanding=True)))
# At most this many jobs are named by id in one ingest query; more pending ones: read
# every file (`_TO_INGEST`).
_MAX_NAMED_JOBS = 500
# The malleable jobs seen since ``recent`` in a state other than pending and
# `_READ_BY_STATE` (ended, configuring, ...), with their last sighting (a scan: only
# when every file is read, e.g. at start).
_SEEN_ENDED = select(Job.id, Job.last_seen).where(
    Job.malleable.is_(True), Job.state.not_in(("PENDING", *_READ_BY_STATE)),
    Job.last_seen >= bindparam("recent"))

# Steps at which an action has not changed its job yet, while no call was attempted.
_UNTOUCHED_STEPS = (Step.HOLD.value, Step.SHRINK.value)


def spec_as_dict(comment: str) -> dict | None:
    """The store's spec parser: the parsed spec as a dict, None for a rigid job.

    Raises:
        ValueError: a bad spec (`SpecError`), stored in ``jobs.spec_error``.
    """
    spec = parse_spec(comment)
    return spec.as_dict() if spec is not None else None


@dataclass
class CycleReport:
    """What one cycle did, for the log, the database and metrics.

    Attributes:
        kind: "poll" or "decide".
        number: the cycle's sequence number in this process.
        started: the daemon's clock at the start.
        duration_s: wall time (process time source given to `Daemon`).
        rpc: Slurm RPCs made in the cycle (one ``jobs()`` plus one per action step,
            plus the node list when it is re-read).
        rpc_poll: of which the poll (``jobs()``, with its retries).
        rpc_nodes: of which node-list reads (``nodes()``).
        slurm_unavailable: the poll failed; nothing was decided or changed.
        jobs: jobs in the poll; managed: malleable jobs the policy allocated.
        ingest: the ingestion report (None if not run).
        drive: the actuator's report(s), merged.
        decision_id: the recorded decision (decide cycles).
        objective: the policy's objective value.
        planned: actions the reconciler proposed (also in dry run).
        skipped: differences left alone, with the reason.
        paused, dry_run: the modes in force.
    """

    kind: str
    number: int
    started: datetime
    duration_s: float = 0.0
    rpc: int = 0
    rpc_poll: int = 0
    rpc_nodes: int = 0
    slurm_unavailable: bool = False
    jobs: int = 0
    managed: int = 0
    ingest: IngestReport | None = None
    drive: DriveReport = field(default_factory=DriveReport)
    decision_id: int | None = None
    objective: float | None = None
    planned: list[PlannedAction] = field(default_factory=list)
    skipped: list = field(default_factory=list)
    paused: bool = False
    dry_run: bool = False


class Daemon:
    """The decision loop over injected parts.

    Args:
        slurm: the Slurm port (real `SlurmClient`, or the simulator's).
        sessions: a read-write `sessionmaker` of the state store (schema checked).
        clock: returns the current time as an aware UTC datetime.
        spool_dir: the progress spool directory.
        config: settings.
        dry_run: plan and log, change nothing in Slurm.
        timer: a monotonic seconds source for cycle durations (default
            `time.perf_counter`; the simulator may pass its own).
        nodes_refresh_s: how often the node list is re-read (one RPC), seconds.
        seed: the policy's seed.
    """

    def __init__(self, *, slurm: SlurmClient, sessions: sessionmaker,
                 clock: Callable[[], datetime], spool_dir: str, config: Config,
                 dry_run: bool = False, timer: Callable[[], float] = time.perf_counter,
                 nodes_refresh_s: float = 300.0, seed: int = 0) -> None:
        self.slurm = slurm
        self.sessions = sessions
        self.clock = clock
        self.spool = SpoolDir(spool_dir)
        self.spool_dir = spool_dir
        self.config = config
        self.dry_run = dry_run
        self.timer = timer
        self.nodes_refresh_s = nodes_refresh_s
        self.seed = seed
        self.book = EstimatorBook()
        self.stored_estimates = StoredEstimates()   # what the last cycles stored, per job
        self.inputs_cache = InputsCache()   # job-event values between cycles
        self.cursors = Cursors()
        self.actuator = Actuator(slurm, sessions)
        self.observed: dict[str, SlurmJob] = {}
        self.poll_ok = False
        self.poll_error: str | None = None   # why the last failed poll failed (Slurm's words)
        # Whether the process is stopping (the service sets it; a failed poll is then
        # logged as cut short, not as Slurm being unavailable).
        self.stopping: Callable[[], bool] = lambda: False
        self.poll_incomplete = False
        self.paused = False  # the operator's pause, as the last successful poll read it
        # The operator's policy choice (name, params) as that poll read it; None: none.
        self.operator_policy: tuple[str, dict] | None = None
        self._settings_read = False   # whether a poll read them yet (`_note_operator_settings`)
        self.last_ingest: IngestReport | None = None  # of the last poll that ingested
        # Which pending jobs' progress files can hold unread lines (`_ingest_in`):
        # jobs.id -> the last poll at which the job ran, got an event, or had bytes left
        # to read; and whether every job's file was read once since this process began.
        self._writers: dict[int, datetime] = {}
        self._unread: set[int] = set()   # jobs.id of files a read left bytes in
        self._pending_writers: list[int] = []
        # The jobs stored in a state other than pending and `_READ_BY_STATE` (ended,
        # configuring, ...) seen in the read window: jobs.id -> their ``last_seen``.
        self._seen_ended: dict[int, datetime] = {}
        self._read_all = False
        self._spool_error = ""   # why the spool could not be opened at the last ingest
        # Slurm ids the last apply left alone for want of a node with room (the level
        # of their "left alone" log line: info when new).
        self._unplaced: set[str] = set()
        # The unfinished jobs' rows as this daemon last wrote them (it is their only
        # writer): a poll reads from the store only the jobs not kept here. When they
        # were last committed (older than the lease timeout: another daemon may have
        # taken over and written rows meanwhile, so they are read again).
        self.job_rows = store.JobRows()
        self._rows_at: datetime | None = None
        self._lookups: dict[str, SlurmJob | SlurmError | None] = {}
        self._rpc_poll = 0
        self._rpc_nodes = 0
        self._policy_cache: tuple[tuple, str, object] | None = None  # (key, name, policy)
        self.nodes: list[SlurmNode] = []
        self.nodes_at: datetime | None = None
        self.number = 0
        self.last_report: CycleReport | None = None

    # ------------------------------------------------------------------ steps

    def rpc_count(self) -> int:
        """Slurm RPCs made through this daemon's port so far (the port's ``rpc_count``)."""
        return int(getattr(self.slurm, "rpc_count", 0))

    def poll(self, now: datetime, ingest: bool = False) -> bool:
        """One ``jobs()`` RPC; store jobs and events, and read the operator's pause
        into ``paused`` (same transaction). False if Slurm did not answer.

        ``ingest``: also read the new progress lines in that transaction (`ingest`'s
        work; its report in ``last_ingest``), so what Slurm and the jobs said at this
        instant is committed together."""
        rpc0 = self.rpc_count()
        try:
            jobs = self.slurm.jobs()
        except SlurmError as exc:
            self.poll_ok = False
            self.poll_error = str(exc)
            if self.stopping():   # e.g. Ctrl-C reached squeue too: not an outage
                log.info("poll cut short by the stop: %s", exc)
            else:
                log.warning("poll failed, Slurm unavailable: %s; no decision or change "
                            "until it answers", exc)
            return False
        finally:
            self._rpc_poll += self.rpc_count() - rpc0
        skipped = list(getattr(self.slurm, "parse_errors", None) or ())
        if self._rows_at is None or (now - self._rows_at).total_seconds() > \
                self.config.daemon.lease_timeout_s:
            self.job_rows.clear()   # (a long gap: another daemon may have written rows)
        observed = {j.job_id: j for j in jobs}
        try:
            self._poll_in(jobs, observed, now, skipped, ingest)
        except BaseException:
            self.job_rows.clear()   # (not committed: the kept rows may be ahead of the store)
            if ingest:
                self._ingest_rolled_back()
            raise
        self._rows_at = now
        if ingest and not skipped and not self._spool_error:
            self._read_all = True   # (committed: what a full read saw is stored)
        self.observed = observed
        self.poll_ok = True
        self.poll_incomplete = bool(skipped)
        self._lookups = {}
        return True

    def _poll_in(self, jobs: list[SlurmJob], observed: dict[str, SlurmJob], now: datetime,
                 skipped: list, ingest: bool) -> None:
        """`poll`'s transaction: jobs and events, the operator's settings, ingestion.
        ``observed``: ``jobs`` by id."""
        with self.sessions() as s, s.begin():
            # The active jobs the poll does not list come with the upsert's own read
            # (or from the rows this daemon last wrote: it is their only writer).
            upserted = store.upsert_jobs(s, observed, now, parse_spec=spec_as_dict,
                                         unlisted_in=() if skipped else _ACTIVE_STATES,
                                         known=self.job_rows)
            self.inputs_cache.forget(upserted.resized)
            for sid, error in upserted.spec_errors.items():   # (once: when first parsed)
                job_logger(log, sid).warning("invalid malleable spec, left to Slurm as a "
                                             "rigid job: %s", error)
            self._note_writers(jobs, upserted, now, complete=not skipped)
            if skipped:
                log.warning("the poll skipped %d job record(s) it could not parse; no job is "
                            "taken as finished for missing from it", len(skipped))
            store.set_setting(s, store.LAST_POLL_KEY, now.isoformat(), now)
            # Read with the poll, in one query (one transaction less per cycle than a
            # read of its own; the pause and the policy the cycle decides with are read
            # together, so an operator's `policy set` and `pause` are seen alike).
            self._note_operator_settings(*store.operator_settings(s),
                                         who=partial(store.operator_change, s))
            self.last_ingest = self._ingest_in(s, now, full=bool(skipped)) if ingest else None
            # After the ingest: a vanished job's last lines (``finished``) count.
            if not skipped:
                # (ended now, they are read while their last sighting is recent)
                self._seen_ended.update(
                    self._mark_vanished(s, list(upserted.unlisted.values()), now))
            if self.last_ingest is not None and self.last_ingest.finished:
                self._complete_vanished(s, self.last_ingest.finished, now)

    @staticmethod
    def _mark_vanished(s, gone: list[int], now: datetime) -> dict[int, datetime]:
        """Jobs the store has as active that Slurm no longer reports (``gone``: their
        ``jobs.id``, `UpsertResult.unlisted`, which leaves out every job of the poll)
        ended unseen (purged after MinJobAge before a poll saw their end): COMPLETED if
        their progress has a ``finished`` event, else `VANISHED` (how they ended is
        not known: not counted as completed). Each gets a "state" job event. Returns
        their ``last_seen`` by ``jobs.id`` (their last sighting, kept)."""
        if not gone:
            return {}
        finished = set(store.run_core(s, _FINISHED_EVENT, {"ids": gone}).scalars())
        last_seen: dict[int, datetime] = {}
        for job in s.scalars(select(Job).where(Job.id.in_(gone))):
            last_seen[job.id] = job.last_seen
            if job.id in finished:
                state, why = JobState.COMPLETED.value, "its progress says finished"
            else:
                state, why = VANISHED, "how it ended is not known: not counted as completed"
            store.add_job_event(s, job.id, now, "state",
                                f"{job.state} -> {state} (no longer reported by Slurm; {why})")
            job.state = state
            job.end_time = job.end_time or now
        return last_seen

    @staticmethod
    def _complete_vanished(s, finished: set[int], now: datetime) -> None:
        """Jobs stored as `VANISHED` whose ``finished`` line the ingest read after they
        vanished (``finished``: ``jobs.id`` of the jobs that got a finished event)
        become COMPLETED, with a "state" job event."""
        for job in s.scalars(select(Job).where(Job.id.in_(sorted(finished)),
                                               Job.state == VANISHED)):
            store.add_job_event(s, job.id, now, "state",
                                f"{VANISHED} -> COMPLETED (its progress says finished)")
            job.state = JobState.COMPLETED.value

    def refresh_nodes(self, now: datetime, force: bool = False) -> bool:
        """Re-read the node list when it is older than ``nodes_refresh_s`` (one RPC)."""
        if (not force and self.nodes and self.nodes_at is not None
                and (now - self.nodes_at).total_seconds() < self.nodes_refresh_s):
            return True
        rpc0 = self.rpc_count()
        try:
            self.nodes = self.slurm.nodes()
        except SlurmError as exc:
            log.warning("node list unavailable: %s", exc)
            return bool(self.nodes)
        finally:
            self._rpc_nodes += self.rpc_count() - rpc0
        self.nodes_at = now
        wanted = set(self.config.slurm.partitions)
        if wanted and not any(wanted & set(n.partitions) for n in self.nodes):
            known = sorted({p for n in self.nodes for p in n.partitions})
            log.warning("no node is in the managed partitions (slurm.partitions = %s; "
                        "Slurm's: %s): no job is managed", sorted(wanted),
                        ", ".join(known) or "none")
        return True

    def _note_writers(self, jobs: list[SlurmJob], upserted: store.UpsertResult,
                      now: datetime, complete: bool = True) -> None:
        """Remember, from one poll, which jobs may have written progress lines: those
        Slurm shows running (or completing, suspended, configuring), and those the
        poll gave an event (new, state, size, restart: e.g. a job that started and was
        requeued between two polls). Entries older than the read window are dropped
        (so finished jobs do not accumulate), and so are the files with bytes left of
        jobs Slurm no longer lists (they are read while seen lately, as ended jobs
        are; ``complete`` False: the poll skipped records, so none is dropped). Also
        lists the pending jobs among them, for `_ingest_in`, and notes the jobs seen
        in a state other than pending and `_READ_BY_STATE` (`_seen_ended`)."""
        writers, ids, seen = self._writers, upserted.ids, self._seen_ended
        for jid in upserted.evented:
            writers[jid] = now
        pending = []
        for sj in jobs:
            if (jid := ids.get(sj.job_id)) is None:
                continue
            state = sj.state
            if state is _PENDING:   # (most of a queue: one identity test, no enum hash)
                pending.append(jid)
                seen.pop(jid, None)
                continue
            if state in _WRITING_STATES:
                writers[jid] = now
            if state in _NOT_BY_SIGHTING:
                seen.pop(jid, None)
            else:
                seen[jid] = now
        recent = now - timedelta(seconds=3 * self.config.daemon.poll_interval_s)
        for d in (writers, seen):
            for jid in [j for j, t in d.items() if t < recent]:
                del d[jid]
        if self._unread and complete:
            self._unread &= set(ids.values())
        unread = self._unread
        self._pending_writers = sorted(
            jid for jid in pending if jid in writers or jid in unread)

    def ingest(self, now: datetime) -> IngestReport:
        """Read new progress lines of the malleable jobs (and those that just ended),
        in a transaction of their own."""
        full = self.poll_incomplete
        try:
            with self.sessions() as s, s.begin():
                report = self._ingest_in(s, now, full=full)
        except BaseException:
            self._ingest_rolled_back()
            raise
        if not full and not self._spool_error:   # (a spool not opened read nothing)
            self._read_all = True   # (committed)
        return report

    def _ingest_rolled_back(self) -> None:
        """After an ingest whose transaction did not commit (a full disk, a locked or
        read-only database): the cursors have moved past lines that were not stored, so
        the files' stored offsets are behind them and the re-read lines would be
        rejected as decreasing_step and lost. The cursors are rebuilt from the store
        and the next ingest reads every file."""
        self.cursors = Cursors()
        self._read_all = False

    def _ingest_in(self, s, now: datetime, full: bool = False) -> IngestReport:
        """`ingest` in the caller's transaction (the caller sets ``_read_all`` once it
        has committed). ``full``: read every file as at start (the last poll skipped
        job records it could not parse, so which jobs are pending is not known).

        Whose files are read: the malleable jobs that are active (pending, running,
        completing, suspended) or were seen in the last three poll intervals (their
        last lines, e.g. ``finished``). Once every such file has been read since this
        process began, a pending job's file is read only while it may hold lines not
        read yet: within three poll intervals of a poll that showed the job running or
        gave it an event (`_note_writers`), or while its last read left bytes in it
        (`IngestReport.unread`, until a read drains it). A pending job has no
        processes, so it writes nothing; the lines it wrote before it stopped are read
        in that window, and after a restart of the daemon, or while polls skip job
        records, every file is read. Skipping the other pending jobs' files changes
        no sample or event (a read would find no new bytes); only a file refused for
        a problem (a symlink, another owner) is not checked again while its job
        pends. The jobs seen lately in another state are found by id (`_seen_ended`,
        filled by the polls and, at a read of every file, from the store), so no
        ingest but such a read scans every job the store holds.
        """
        recent = now - timedelta(seconds=3 * self.config.daemon.poll_interval_s)
        pending = self._pending_writers
        if self._read_all and not full and len(pending) <= _MAX_NAMED_JOBS:
            named = pending + sorted(j for j, t in self._seen_ended.items() if t >= recent)
            if len(named) <= _MAX_NAMED_JOBS:
                rows = store.run_core(s, _TO_INGEST_WRITERS, {"ids": named}).all()
            else:
                rows = store.run_core(s, _TO_INGEST_SCAN, {"recent": recent, "ids": pending}
                                      ).all()
        else:
            rows = store.run_core(s, _TO_INGEST, {"recent": recent}).all()
            self._seen_ended = dict(store.run_core(s, _SEEN_ENDED, {"recent": recent}).all())
        report = ingest_progress(
            s, [IngestJob.of(j) for j in rows], self.spool, now=now,
            max_bytes_per_job=self.config.progress.max_bytes_per_job,
            max_future_s=self.config.progress.max_future_s, cursors=self.cursors,
            files=store.progress_files_of(rows))
        if report.spool_error != self._spool_error:   # (said once, not every cycle)
            if report.spool_error:
                log.error("%s: no progress line is read until it can be opened (the jobs "
                          "write there; the daemon creates it at start)", report.spool_error)
            else:
                log.info("spool %s readable again", self.spool.path)
            self._spool_error = report.spool_error
        if report.spool_error:
            # Nothing was read: once the spool opens again, every file is (the lines of
            # a job that wrote meanwhile and then stopped are not left until its next event).
            self._read_all = False
        for sid, reasons in report.rejected_by_job.items():
            log.warning("rejected progress lines: %s", dict(reasons), extra={"job": sid})
        # Files with bytes left are read on until a read drains them.
        self._unread.difference_update(r.id for r in rows)
        self._unread.update(report.unread)
        for jid in report.unread:
            if jid not in self._pending_writers:
                self._pending_writers.append(jid)
        return report

    def drive(self, now: datetime, paused: bool) -> DriveReport:
        """Advance in-flight actions (while paused: only those past the point of no return)."""
        if not self.poll_ok or self.dry_run:
            return DriveReport()
        if paused:
            self._park_for_pause(now)
        return self.actuator.drive(now, self.observed, refresh=self._refresh())

    def _refresh(self) -> Callable[[str], SlurmJob | None] | None:
        return self._lookup if self.poll_incomplete else None

    def _lookup(self, job_id: str) -> SlurmJob | None:
        """One job's state (one RPC per job and poll), for an action whose job the poll
        skipped. Raises `SlurmError` (again, without a new RPC) if it could not be read."""
        if job_id not in self._lookups:
            try:
                self._lookups[job_id] = self.slurm.job(job_id)
            except SlurmError as exc:
                self._lookups[job_id] = exc
        got = self._lookups[job_id]
        if isinstance(got, SlurmError):
            raise got
        return got

    @staticmethod
    def _untouched(a) -> bool:
        """An action that has not changed its job in Slurm yet (no call attempted)."""
        if a.state == Step.SIGNAL.value:
            return a.signalled_at is None
        return a.state in _UNTOUCHED_STEPS and not a.attempts

    def _park_for_pause(self, now: datetime) -> None:
        """Paused: drop actions that have not touched their job yet; release admission holds.

        An action that may have touched its job (a signal sent: the job checkpoints
        and waits for its requeue; a hold or shrink attempted) is driven to its end.
        """
        with self.sessions() as s, s.begin():
            for a in store.unfinished_actions(s):
                if self._untouched(a):
                    store.update_action(s, a.id, now=now, state=Step.ABANDONED.value,
                                        note="paused by an operator", finished=True)
            held = daemon_holds(s, [j.id for j in s.scalars(
                select(Job).where(Job.malleable.is_(True), Job.state == "PENDING"))])
            busy = {a.job_id for a in store.unfinished_actions(s)}
            for job in s.scalars(select(Job).where(Job.id.in_(sorted(held - busy)))):
                sj = self.observed.get(job.slurm_job_id)
                if sj is None or not sj.held:
                    continue
                store.create_action(s, job_id=job.id, kind=ActionKind.ADMIT.value,
                                    state=Step.RELEASE.value, to_gpus=sj.gpus, now=now,
                                    from_gpus=sj.gpus, to_nodes=sj.node_count,
                                    restart_count_at_start=sj.restart_count,
                                    note="paused: releasing the daemon's hold")

    # ------------------------------------------------------------------ decide

    def _note_operator_settings(self, paused: bool, policy: tuple[str, dict] | None,
                                start: bool = False, who: Callable | None = None) -> None:
        """Take the operator's pause and policy choice as this poll read them, and log
        a change (`malleable pause`, `resume`, `policy set`, `policy reset` write only
        the store; the daemon's log is where an admin reads when they took effect).
        The first read logs a pause or an operator's policy in force only with
        ``start`` (the service starting); otherwise (e.g. `malleable plan`'s one
        dry-run cycle) it is silent. ``who``: `store.operator_change` on the poll's
        session, read only for a change, to name who made it."""
        first = not self._settings_read
        self._settings_read = True
        if first and not start:
            self.paused, self.operator_policy = paused, policy
            return

        def by(key: str, command: str) -> str:
            got = who(key, (command,)) if who is not None else None
            if got is None:
                return ""
            return f" (malleable {got['command']} by {got['by']} on {got['host']} at {got['time']})"

        # (Before the first read: not paused, no operator's policy; so at start a pause
        # or a policy in force is a change from those.)
        if paused and not self.paused:
            log.warning("%s%s: observing and planning, starting no action (malleable resume "
                        "ends it)", "starting paused by an operator" if first
                        else "paused by an operator", by(store.PAUSED_BY_KEY, "pause"))
        elif not paused and self.paused:
            log.warning("resumed by an operator%s: acting on decisions again",
                        by(store.PAUSED_BY_KEY, "resume"))
        if policy != self.operator_policy:
            if policy is not None:
                log.info("policy %s %s set by an operator%s%s: it decides from the next "
                         "decision", policy[0], json.dumps(policy[1], sort_keys=True),
                         by(store.POLICY_BY_KEY, "policy set"),
                         " (in force at start)" if first else "")
            else:
                log.info("the operator's policy choice was reset%s: the configuration's "
                         "policy %s %s decides from the next decision",
                         by(store.POLICY_BY_KEY, "policy reset"), self.config.policy.name,
                         json.dumps(dict(self.config.policy.params), sort_keys=True))
        self.paused, self.operator_policy = paused, policy

    def _policy(self):
        """The active policy (name, params, the policy wrapped in hysteresis): the
        operator's choice as the last successful poll read it, else the configuration's.

        Policies keep no state between calls, so one instance serves every cycle
        until the operator's choice or the configuration's thresholds change."""
        name, params = self.operator_policy or (self.config.policy.name,
                                                dict(self.config.policy.params))
        key = (name, json.dumps(params, sort_keys=True, default=repr),
               self.config.policy.min_gain, self.config.policy.cooldown_s,
               self.config.policy.min_run_restarts)
        if self._policy_cache is not None and self._policy_cache[0] == key:
            _, decides, policy = self._policy_cache
            return decides, params, policy
        try:
            policy = get_policy(name, **params)
            # Record the policy that decides ("pollux"), not its alias ("default").
            wrapped = with_hysteresis(policy, self.config.policy)
            self._policy_cache = (key, policy.name, wrapped)
            return policy.name, params, wrapped
        except ValueError as exc:
            log.error("policy %s %s unusable (%s); using `static` (no reallocation)",
                      name, params, exc)
            return "static", {}, with_hysteresis(get_policy("static"), self.config.policy)

    def decide(self, now: datetime, report: CycleReport) -> tuple[PolicyInputs, Allocation] | None:
        """Estimates and the policy; records the decision and its targets (one
        transaction). None: no node list, no decision."""
        if not self._nodes_for_decision(now):
            return None
        with self._decision_transaction(now) as s:
            return self._decide_in(s, now, report)

    @contextmanager
    def _decision_transaction(self, now: datetime):
        """A session in the transaction that records a decision and its estimates;
        `StoredEstimates` learns whether it committed (else it forgets what it kept)."""
        try:
            with self.sessions() as s, s.begin():
                yield s
        except BaseException:
            self.stored_estimates.clear()   # (not committed: they may not be stored)
            raise
        self.stored_estimates.committed(now)

    def _nodes_for_decision(self, now: datetime) -> bool:
        """The node list is current (re-read if old; an RPC); False, logged, if none."""
        if self.refresh_nodes(now):
            return True
        log.warning("no node list; no decision this cycle")
        return False

    def _decide_in(self, s, now: datetime, report: CycleReport
                   ) -> tuple[PolicyInputs, Allocation]:
        """`decide` in the caller's transaction, the node list already read."""
        t0 = self.timer()
        name, params, policy = self._policy()
        inputs = build_inputs(s, self.observed, self.nodes, self.book, now, self.config,
                              seed=self.seed, with_size_history=getattr(
                                  policy, "uses_size_history", True),
                              cache=self.inputs_cache,
                              known=self.job_rows.in_states(MANAGED_STATES))
        alloc = policy.allocate(inputs.jobset, inputs.capacity, inputs.context)
        duration = self.timer() - t0
        targets = [store.TargetIn(j.id, int(k), int(b) or None, why) for j, k, b, why in zip(
            inputs.jobs, np.asarray(alloc.gpus).tolist(), np.asarray(alloc.batch).tolist(),
            alloc.reason, strict=True)]
        objective = float(alloc.objective) if np.isfinite(alloc.objective) else None
        d = store.record_decision(s, time=now, policy=name, params=params,
                                  inputs_digest=inputs.digest, objective=objective,
                                  duration_s=duration, dry_run=self.dry_run,
                                  targets=targets)
        # Only the estimates that changed (`StoredEstimates`): a waiting job's stays
        # the same for many cycles.
        ids, keys = [j.id for j in inputs.jobs], estimate_keys(inputs.estimates)
        store.record_estimates(s, [estimate_row(ids[i], now, keys[i]) for i in
                                   self.stored_estimates.changed(
                                       ids, keys, now, self.config.daemon.lease_timeout_s)])
        report.decision_id = d
        report.objective = objective
        report.managed = len(inputs.jobs)
        log.info("decision %d: policy %s on %d jobs, %d GPUs free for malleable jobs, "
                 "%.1f ms", report.decision_id, name, len(inputs.jobs), inputs.capacity.total,
                 duration * 1e3)
        return inputs, alloc

    # ------------------------------------------------------------------ apply

    def apply(self, now: datetime, inputs: PolicyInputs, alloc: Allocation,
              report: CycleReport, paused: bool, session=None) -> None:
        """Reconcile the plan with what Slurm reports and record the actions it needs
        (they run when the actuator next drives).

        ``session``: the caller's read-write session, in a transaction (e.g. the one
        that recorded the decision); None: transactions of its own."""
        jobs = inputs.jobs
        g = inputs.capacity.gpus_per_node
        # One transaction: the superseded OBSERVE steps end first, then the reads see them.
        with self._transaction(session) as s:
            unfinished = store.unfinished_action_rows(s)
            if not (self.dry_run or paused):
                done = self._supersede_observing(s, now, jobs, alloc, report.decision_id,
                                                 unfinished)
                unfinished = [a for a in unfinished if a.id not in done]
            ids = [j.id for j in jobs]
            observed = [self.observed[j.slurm_job_id] for j in jobs]
            # Whose hold is the daemon's matters only for the held jobs, and the run a
            # job reports in only for the running ones (`JobView`): read only theirs.
            held = daemon_holds(s, [j.id for j, sj in zip(jobs, observed, strict=True)
                                    if sj.held])
            busy = {a.job_id for a in unfinished}
            # (oldest first: a job's newest unfinished action wins)
            bound = {a.job_id: start_shape(a.kind, a.to_gpus, a.to_nodes) for a in unfinished}
            backoff = requeue_backoff(s, ids, now, self.config.daemon.requeue_backoff_s)
            runs = reporting_runs(s, [j.id for j, sj in zip(jobs, observed, strict=True)
                                      if sj.state == JobState.RUNNING])
            in_flight = sum(1 for a in unfinished if a.kind == "requeue")
        views, targets = [], []
        pool = NodePool(inputs.free_by_node)   # less the managed jobs' GPUs where they run
        for i, (j, sj) in enumerate(zip(jobs, observed, strict=True)):
            spec = j.spec or {}
            shape = Shape(max(sj.node_count, 1 if sj.gpus else 0),
                          sj.gpus_per_node or sj.gpus)
            placement = placement_of(sj)
            pool.take(placement)
            views.append(JobView(
                job_id=j.slurm_job_id, state=sj.state, shape=shape, held=sj.held,
                held_by_daemon=j.id in held, shrink_inplace=bool(spec.get("shrink_inplace")),
                busy=j.id in busy, placement=placement, bound_for=bound.get(j.id),
                # Not ready to checkpoint until it has logged progress in this run.
                requeue_blocked=(j.id in backoff or not sj.requeueable or not sj.batch
                                 or (sj.state == JobState.RUNNING
                                     and runs.get(j.id, -1) < sj.restart_count))))
            targets.append(Target(j.slurm_job_id, int(alloc.gpus[i]), int(alloc.batch[i]),
                                  alloc.reason[i]))
        # Pending jobs beyond the queue depth stay held (after the plan's own targets):
        # only those not held yet need a view (just submitted, or requeued or released
        # by someone else; one the daemon is starting is not beyond it, `split_queue`),
        # and one with an action in flight is left to that action.
        for j in inputs.queued:
            sj = self.observed[j.slurm_job_id]
            if sj.held or j.id in busy:
                continue
            views.append(JobView(job_id=j.slurm_job_id, state=sj.state,
                                 shape=Shape(max(sj.node_count, 1 if sj.gpus else 0),
                                             sj.gpus_per_node or sj.gpus)))
            targets.append(Target(j.slurm_job_id, 0, 0, "waiting beyond the queue depth"))
        # Plan order is the JobSet's (FIFO by arrival): earlier jobs get freed GPUs first.
        running_malleable = sum(v.gpus for v in views if v.state == JobState.RUNNING)
        free = max(0, inputs.capacity.total - running_malleable)
        # Node by node only when every running job's nodes are known (else GPU counts).
        known = all(v.placement or v.state != JobState.RUNNING or not v.gpus for v in views)
        planned, skipped = plan_actions(views, targets, gpus_per_node=g, free_gpus=free,
                                        requeues_in_flight=in_flight,
                                        max_requeues=self.config.daemon.max_concurrent_requeues,
                                        free_by_node=pool.free if known else None)
        report.planned, report.skipped = planned, skipped
        # "No placement" (no node has room for the target, cycle after cycle) is logged
        # at info when the job first gets it, then at debug while it stays; other
        # reasons (an action in flight, the requeue cap) at debug.
        said, self._unplaced = self._unplaced, set()
        for sk in skipped:
            unplaced = sk.reason.startswith(NO_PLACEMENT)
            job_logger(log, sk.job_id).log(
                logging.INFO if unplaced and sk.job_id not in said else logging.DEBUG,
                "left alone this cycle: %s", sk.reason)
            if unplaced:
                self._unplaced.add(sk.job_id)
        for p in planned:
            job_logger(log, p.job_id).info("plan: %s %d -> %d GPUs (%s)%s", p.kind.value,
                                           p.from_gpus, p.to_gpus, p.reason,
                                           " [dry run]" if self.dry_run else
                                           " [paused]" if paused else "")
        if self.dry_run or paused or not planned:
            return
        # A batch size is advice only where the job's gradient statistics are known:
        # without them the estimators keep the batch the spec declares (m0), which
        # says nothing about the batch the job runs at.
        flags = np.asarray(inputs.estimates.flags)
        no_advice = {j.slurm_job_id for i, j in enumerate(jobs)
                     if int(flags[i]) & int(EstimateFlags.NO_GRADIENT_STATS)}
        for p in planned:
            if p.kind in (ActionKind.REQUEUE, ActionKind.ADMIT) and p.to_shape is not None:
                self._write_plan(p, now, advise_batch=p.job_id not in no_advice)
        self.actuator.create(planned, now, decision_id=report.decision_id,
                             observed=self.observed, session=session)

    @contextmanager
    def _transaction(self, session=None):
        """``session`` itself if given (the caller's transaction), else a new session
        in a transaction that commits when the block ends."""
        if session is not None:
            yield session
            return
        with self.sessions() as s, s.begin():
            yield s

    def _supersede_observing(self, s, now: datetime, jobs: list, alloc: Allocation,
                             decision_id: int | None, unfinished: list) -> set[int]:
        """End OBSERVE steps whose job the new plan wants at another size.

        At OBSERVE the daemon has released the job and only watches for it to run; a
        job Slurm keeps pending (e.g. its GPUs went to another job) would otherwise
        block the job's next action until the observe timeout.

        Args:
            s: the caller's read-write session (in a transaction; it commits).
            unfinished: the unfinished actions (rows of ``actions``, oldest first).

        Returns:
            The ids of the actions ended here.
        """
        target = {j.id: int(alloc.gpus[i]) for i, j in enumerate(jobs)}
        done: set[int] = set()
        for a in unfinished:
            k = target.get(a.job_id)
            if a.state != Step.OBSERVE.value or k is None or k == a.to_gpus:
                continue
            store.update_action(s, a.id, now=now, state=Step.DONE.value, finished=True,
                                note=f"superseded by decision {decision_id} (target {k} "
                                     f"GPUs) while waiting to run on {a.to_gpus}")
            done.add(a.id)
            log.info("action %d (%s) done: superseded by decision %s", a.id, a.kind,
                     decision_id, extra={"job": self._sid(s, a.job_id)})
        return done

    @staticmethod
    def _sid(s, job_db_id: int) -> str:
        job = s.get(Job, job_db_id)
        return job.slurm_job_id if job is not None else "-"

    def _write_plan(self, p: PlannedAction, now: datetime, advise_batch: bool = True) -> None:
        try:
            write_plan(self.spool_dir, Plan(job=p.job_id, t=now.timestamp(), gpus=p.to_gpus,
                                            nodes=p.to_shape.nodes,
                                            batch=(p.batch or None) if advise_batch else None))
        except (OSError, ValueError) as exc:
            job_logger(log, p.job_id).warning("plan file not written: %s", exc)

    # ------------------------------------------------------------------ cycles

    def _begin(self, kind: str) -> tuple[CycleReport, datetime, float, int]:
        self.number += 1
        set_cycle(self.number)
        now = self.clock()
        self._rpc_poll = self._rpc_nodes = 0
        return CycleReport(kind, self.number, now, dry_run=self.dry_run), now, self.timer(), \
            self.rpc_count()

    def _end(self, report: CycleReport, t0: float, rpc0: int) -> CycleReport:
        report.duration_s = self.timer() - t0
        report.rpc = self.rpc_count() - rpc0
        report.rpc_poll, report.rpc_nodes = self._rpc_poll, self._rpc_nodes
        self.last_report = report
        calls = report.drive.calls
        other = report.rpc - report.rpc_poll - report.rpc_nodes - report.drive.rpc_count
        log.info("%s cycle: %.3f s, %d Slurm RPCs (jobs %d, nodes %d, actions %d%s%s), "
                 "%d jobs, %d managed%s",
                 report.kind, report.duration_s, report.rpc, report.rpc_poll, report.rpc_nodes,
                 report.drive.rpc_count,
                 (" [" + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) + "]")
                 if calls else "",
                 f", other {other}" if other else "",
                 report.jobs, report.managed,
                 " (Slurm unavailable: stale, nothing changed)" if report.slurm_unavailable
                 else "")
        return report

    def read_operator_settings(self, start: bool = False) -> bool:
        """Read the operator's pause and policy choice from the store (also when Slurm
        does not answer: the log acknowledges a `pause` during a Slurm outage at once).
        ``start``: the service starting; a pause or an operator's policy in force is
        logged. Returns whether the daemon is paused."""
        with self.sessions() as s:
            self._note_operator_settings(*store.operator_settings(s), start=start,
                                         who=partial(store.operator_change, s))
        return self.paused

    def poll_cycle(self) -> CycleReport:
        """Poll, ingest, advance in-flight actions."""
        report, now, t0, rpc0 = self._begin("poll")
        if self.poll(now, ingest=True):
            report.paused = self.paused
            report.jobs = len(self.observed)
            report.ingest = self.last_ingest
            report.drive = self.drive(now, report.paused)
        else:
            report.paused = self.read_operator_settings()
            report.slurm_unavailable = True
        return self._end(report, t0, rpc0)

    def decide_cycle(self) -> CycleReport:
        """Poll, ingest, advance actions, decide, reconcile, act."""
        report, now, t0, rpc0 = self._begin("decide")
        if not self.poll(now, ingest=True):
            report.paused = self.read_operator_settings()
            report.slurm_unavailable = True
            return self._end(report, t0, rpc0)
        report.paused = self.paused
        report.jobs = len(self.observed)
        report.ingest = self.last_ingest
        report.drive = self.drive(now, report.paused)
        if report.drive.slurm_unavailable:
            report.slurm_unavailable = True
            return self._end(report, t0, rpc0)
        if not self._nodes_for_decision(now):   # (before the transaction: it may be an RPC)
            return self._end(report, t0, rpc0)
        # The decision, its targets and estimates, and the actions it needs: one
        # transaction.
        with self._decision_transaction(now) as s:
            inputs, alloc = self._decide_in(s, now, report)
            self.apply(now, inputs, alloc, report, report.paused, session=s)
        # Drive again only what apply created: every older action was driven as far
        # as it could go at this instant above (apply only ends some of them).
        if not (self.dry_run or report.paused) and report.planned:
            more = self.actuator.drive(now, self.observed, refresh=self._refresh())
            report.drive = _merge(report.drive, more)
        return self._end(report, t0, rpc0)

    def release_holds(self) -> int:
        """Release every job the daemon holds (graceful stop). Returns how many.

        * pending jobs it holds for admission (their release is recorded as a
          finished admission, so the hold is no longer the daemon's);
        * jobs it requeued and holds, whose checkpoint-requeue waits between
          requeue_hold and release (only when Slurm refused a resize and the retry is
          due later): the begin-time delay is cleared and the job released at the
          size Slurm has for it; the action goes on to OBSERVE.

        Other in-flight actions are left to the next start. Nothing is done in dry
        run or without a successful poll (the state would be unknown).
        """
        if self.dry_run or not self.poll_ok:
            return 0
        n = 0
        with self.sessions() as s:
            # The last poll as the actuator left it (a job it requeued since is pending).
            pending = [sid for sid, sj in self.observed.items()
                       if sj.state == JobState.PENDING and sj.held]
            pend: list[Job] = []
            for i in range(0, len(pending), 500):
                pend += s.scalars(select(Job).where(Job.malleable.is_(True),
                                                    Job.slurm_job_id.in_(pending[i:i + 500])))
            held = daemon_holds(s, [j.id for j in pend])
            unfinished = store.unfinished_action_rows(s)
            busy = {a.job_id for a in unfinished}
            requeued = {a.job_id: a.id for a in unfinished if a.kind == ActionKind.REQUEUE.value
                        and a.state in (Step.RESIZE.value, Step.START_NOW.value,
                                        Step.RELEASE.value)}
        for job in pend:
            sj = self.observed.get(job.slurm_job_id)
            if sj is None or not sj.held:
                continue
            mid_requeue = job.id in requeued
            if not (mid_requeue or (job.id in held and job.id not in busy)):
                continue
            jlog = job_logger(log, job.slurm_job_id)
            try:
                if mid_requeue:
                    self.slurm.start_now(job.slurm_job_id)
                self.slurm.release(job.slurm_job_id)
                n += 1
                jlog.info("released on daemon stop%s", " (mid-requeue, at the size Slurm has "
                          f"for it: {sj.gpus} GPUs)" if mid_requeue else "")
            except SlurmUnavailable as exc:
                log.warning("could not release holds on stop: %s", exc)
                break
            except SlurmError as exc:
                jlog.warning("release refused: %s", exc)
                continue
            with self.sessions() as s, s.begin():
                now = self.clock()
                if mid_requeue:
                    store.update_action(s, requeued[job.id], now=now, state=Step.OBSERVE.value,
                                        next_attempt_at=None, attempts=0,
                                        note="released on daemon stop")
                    continue
                a = store.create_action(s, job_id=job.id, kind=ActionKind.ADMIT.value,
                                        state=Step.DONE.value, to_gpus=sj.gpus, now=now,
                                        from_gpus=sj.gpus, note="released on daemon stop")
                store.update_action(s, a.id, now=now, finished=True)
        return n


def _merge(a: DriveReport, b: DriveReport) -> DriveReport:
    calls = dict(a.calls)
    for k, v in b.calls.items():
        calls[k] = calls.get(k, 0) + v
    return replace(a, calls=calls, finished=a.finished + b.finished,
                   abandoned_no_checkpoint=a.abandoned_no_checkpoint + b.abandoned_no_checkpoint,
                   slurm_unavailable=a.slurm_unavailable or b.slurm_unavailable)


__all__ = ["CycleReport", "Daemon", "SpecError", "spec_as_dict"]
