"""The actuator: drives each action's state machine against Slurm, crash-safely.

The pure transitions live in `malleable.daemon.actions`; this module is the
imperative shell around them. For every unfinished action it repeats:

1. observe: the job as Slurm reported it in this cycle's poll (updated locally
   with the expected effect of each call made since), and the time of the
   job's latest ``checkpointed`` progress event;
2. ``advance`` -> (call, next step);
3. record the attempt in the database and COMMIT, before the call (for the
   signal step, also ``signalled_at``, so the grace period survives a crash);
4. make the Slurm call;
5. record the next step and commit.

A daemon killed between 3 and 5 finds the step again on restart, and
``advance`` re-checks Slurm's state first, so nothing happens twice (a job
that has already left RUNNING is never requeued again). A signal step redone
after a crash may signal the job a second time (harmless: the job is already
checkpointing or waiting for its requeue) and keeps the first ``signalled_at``,
so a checkpoint written after the first signal counts. Errors:

* `SlurmUnavailable`: the step stays; every action waits for the next cycle.
* `SlurmRejected` at SHRINK: the in-place shrink becomes a checkpoint-requeue
  (a new action; the old one is marked failed with Slurm's message).
* `SlurmRejected` elsewhere: retried with back-off up to ``max_attempts``;
  then an action that has requeued the job skips to releasing it (at its old
  size if the resize was refused), and a release is retried until it
  succeeds, so a job the daemon held is always released; an action that has
  not yet touched the job fails harmlessly.
* A job that does not checkpoint within its grace: the action is abandoned
  and the job backed off from requeues (`malleable.daemon.history`).
* A job missing from the poll whose state cannot be looked up (``refresh``
  raised `SlurmError`): its action waits for the next cycle.

Test hook: ``step_hook(kind, step, phase)`` is called before and after each
step's effect (see `malleable.daemon.testhook`); None (the default) in
production and in the simulator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, sessionmaker

from malleable.daemon.actions import FIRST_STEP, ActionState, Call, Observation, Step, advance
from malleable.daemon.logs import job_logger
from malleable.daemon.reconcile import ActionKind, PlannedAction
from malleable.daemon.shapes import Shape
from malleable.db import store
from malleable.db.models import Action, Job, JobEvent
from malleable.slurm.client import SlurmClient, SlurmError, SlurmRejected, SlurmUnavailable
from malleable.slurm.records import JobState, SignalTarget, SlurmJob

log = logging.getLogger(__name__)

# Steps after which the job is (or may be) held by us: a failure must still release it.
_AFTER_REQUEUE = (Step.RESIZE, Step.START_NOW, Step.RELEASE)
# Steps that make no Slurm call but wait for the job (kill points "before"/"after").
_WAITING_STEPS = (Step.WAIT_CHECKPOINT, Step.OBSERVE)


@dataclass
class DriveReport:
    """What one `Actuator.drive` did.

    Attributes:
        calls: Slurm calls made, by method name.
        finished: actions that reached a terminal step, as (job id, step).
        abandoned_no_checkpoint: jobs whose checkpoint did not come within grace.
        slurm_unavailable: Slurm stopped answering; remaining actions wait.
    """

    calls: dict[str, int] = field(default_factory=dict)
    finished: list[tuple[str, str]] = field(default_factory=list)
    abandoned_no_checkpoint: list[str] = field(default_factory=list)
    slurm_unavailable: bool = False

    @property
    def rpc_count(self) -> int:
        return sum(self.calls.values())


def _spec_value(job: Job, key: str, default):
    spec = job.spec or {}
    value = spec.get(key)
    return default if value is None else value


def _expected_after(job: SlurmJob, call: Call) -> SlurmJob:
    """The job as Slurm will report it after ``call`` succeeds (for the next step's check)."""
    m = call.method
    if m == "requeue_hold":
        return replace(job, state=JobState.PENDING, held=True, nodes="",
                       restart_count=job.restart_count + 1)
    if m == "resize_pending":
        nodes, gpn = call.args
        return replace(job, node_count=nodes, gpus_per_node=gpn, gpus=nodes * gpn)
    if m == "shrink_running":
        (nodes,) = call.args
        return replace(job, node_count=nodes, gpus=nodes * job.gpus_per_node)
    if m == "hold":
        return replace(job, held=True)
    if m == "release":
        return replace(job, held=False)
    return job


# Built once (building a statement costs more than running it); IN lists expand at run time.
_CHECKPOINTED_ONE = select(func.max(JobEvent.time)).where(
    JobEvent.job_id == bindparam("job"), JobEvent.kind == "checkpointed")
_ACTION_JOBS = select(Job.id, Job.slurm_job_id, Job.spec).where(
    Job.id.in_(bindparam("ids", expanding=True)))
_ACTION_JOB = select(Job.id, Job.slurm_job_id, Job.spec).where(Job.id == bindparam("id"))
_CHECKPOINTED = (select(JobEvent.job_id, func.max(JobEvent.time))
                 .where(JobEvent.job_id.in_(bindparam("ids", expanding=True)),
                        JobEvent.kind == "checkpointed").group_by(JobEvent.job_id))


class Actuator:
    """Creates actions from the reconciler's plan and drives them to completion.

    Args:
        slurm: the Slurm port (real or simulated).
        sessions: a read-write `sessionmaker` of the state store.
        max_attempts: Slurm refusals tolerated per step before giving up on it.
        retry_after_s: back-off after a refused call, doubled per attempt.
        observe_timeout_s: how long OBSERVE waits for the job to run at its new
            size (`ActionState.observe_timeout_s`), seconds.

    Attributes:
        step_hook: None, or a callable ``(kind, step, phase)`` run at every step
            boundary (phase "before"/"after"; the crash tests' kill points,
            `malleable.daemon.testhook`).
    """

    def __init__(self, slurm: SlurmClient, sessions: sessionmaker, *, max_attempts: int = 4,
                 retry_after_s: float = 15.0, observe_timeout_s: float = 600.0) -> None:
        self.slurm = slurm
        self.sessions = sessions
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.observe_timeout_s = observe_timeout_s
        self.step_hook: Callable[[str, str, str], None] | None = None

    # ------------------------------------------------------------------ create

    def create(self, planned: Iterable[PlannedAction], now: datetime, *,
               decision_id: int | None, observed: dict[str, SlurmJob],
               session: Session | None = None) -> list[int]:
        """Record planned actions (one committed transaction, before any of them runs).

        Args:
            session: the caller's read-write session in a transaction, which must
                commit before `drive` runs the actions; None: a transaction of its own.

        Returns:
            The new actions' ids, in execution order.
        """
        if session is not None:
            return self._create_in(session, planned, now, decision_id, observed)
        with self.sessions() as s, s.begin():
            return self._create_in(s, planned, now, decision_id, observed)

    @staticmethod
    def _create_in(s: Session, planned: Iterable[PlannedAction], now: datetime,
                   decision_id: int | None, observed: dict[str, SlurmJob]) -> list[int]:
        ids: list[int] = []
        db_ids = store.job_ids(s, [p.job_id for p in planned])
        for p in planned:
            jid = db_ids.get(p.job_id)
            if jid is None:
                continue
            sj = observed.get(p.job_id)
            a = store.create_action(
                s, job_id=jid, kind=p.kind.value, state=FIRST_STEP[p.kind].value,
                to_gpus=p.to_gpus, now=now, from_gpus=p.from_gpus,
                from_nodes=sj.node_count if sj else None,
                to_nodes=p.to_shape.nodes if p.to_shape else None,
                decision_id=decision_id,
                restart_count_at_start=sj.restart_count if sj else 0,
                note=p.reason)
            ids.append(a.id)
        return ids

    # ------------------------------------------------------------------ drive

    def drive(self, now: datetime, observed: dict[str, SlurmJob],
              refresh: Callable[[str], SlurmJob | None] | None = None) -> DriveReport:
        """Advance every unfinished action as far as it can go now.

        Args:
            now: the daemon's clock.
            observed: this cycle's poll, by Slurm job id (updated in place with
                the expected effect of each successful call).
            refresh: optional lookup of one job's current state for actions whose
                job is missing from ``observed`` (e.g. a poll that skipped the job's
                record); None: missing means gone. If it raises `SlurmError` the
                action waits for the next cycle.

        Returns:
            A `DriveReport`.
        """
        report = DriveReport()
        with self.sessions() as s:
            actions, jobs, checkpointed = self._unfinished(s)
        for a in actions:
            if report.slurm_unavailable:
                break
            job = jobs.get(a.job_id)
            if job is not None and self._waits(a, job, checkpointed.get(a.job_id), now,
                                               observed, refresh):
                continue
            self._drive_one(a.id, now, observed, refresh, report, job=job,
                            checkpointed_at=checkpointed.get(a.job_id))
        return report

    @staticmethod
    def _unfinished(s: Session) -> tuple[list, dict[int, object], dict[int, datetime]]:
        """Unfinished actions (oldest first), their jobs (``jobs.id`` -> row) and each
        job's latest ``checkpointed`` event time, as read-only table rows (three queries)."""
        actions = store.unfinished_action_rows(s)
        ids = sorted({a.job_id for a in actions})
        jobs: dict[int, object] = {}
        checkpointed: dict[int, datetime] = {}
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            jobs.update((j.id, j) for j in store.run_core(s, _ACTION_JOBS, {"ids": part}))
            checkpointed.update(store.run_core(s, _CHECKPOINTED, {"ids": part}).all())
        return actions, jobs, checkpointed

    def _waits(self, a, job, checkpointed_at: datetime | None, now: datetime,
               observed: dict[str, SlurmJob], refresh) -> bool:
        """Whether `_drive_one` would change nothing for this action now (it is backing
        off, or it waits with the note it has), judged from rows read before the loop
        (a drive changes only its own action's row and its own job's ``observed``
        entry, so the rows of the actions after it stay current). Runs the step hook
        as `_drive_one` would. False: drive it (`_drive_one` reads everything again)."""
        if a.next_attempt_at is not None and a.next_attempt_at > now:
            return True
        sj = observed.get(job.slurm_job_id)
        if sj is None and refresh is not None:
            return False
        try:
            state = self._state(a, job)
            t = advance(state, Observation(sj, checkpointed_at, now))
        except ValueError:
            return False
        if t.call is not None or not t.wait or a.note != t.note:
            return False
        if state.step in _WAITING_STEPS:
            self._hook(state, state.step, "before")
        return True

    def _load(self, s: Session, action_id: int) -> tuple[Action, object, ActionState]:
        """The action (entity: its step writes it), its job (a read-only row: id,
        slurm_job_id, spec) and the state machine's view of the two."""
        a = s.get(Action, action_id)
        job = store.run_core(s, _ACTION_JOB, {"id": a.job_id}).one()
        return a, job, self._state(a, job)

    def _state(self, a, job) -> ActionState:
        """The state machine's view of action ``a`` of ``job`` (entities or rows)."""
        to_shape = None
        if a.to_gpus > 0 and a.to_nodes:
            to_shape = Shape(a.to_nodes, a.to_gpus // a.to_nodes)
        return ActionState(
            job_id=job.slurm_job_id, kind=ActionKind(a.kind), step=Step(a.state),
            to_gpus=a.to_gpus, to_shape=to_shape,
            restart_count_at_start=a.restart_count_at_start,
            signal=str(_spec_value(job, "signal", "USR1")),
            signal_target=SignalTarget(_spec_value(job, "signal_target", "batch")),
            grace_s=float(_spec_value(job, "grace_s", 120.0)),
            signalled_at=a.signalled_at, created_at=a.created_at,
            observe_timeout_s=self.observe_timeout_s)

    @staticmethod
    def _checkpointed_at(s: Session, job_db_id: int) -> datetime | None:
        return store.run_core(s, _CHECKPOINTED_ONE, {"job": job_db_id}).scalar()

    def _hook(self, state: ActionState, step: Step, phase: str) -> None:
        if self.step_hook is not None:
            self.step_hook(state.kind.value, step.value, phase)

    def _drive_one(self, action_id: int, now: datetime, observed: dict[str, SlurmJob],
                   refresh, report: DriveReport, *, job=None,
                   checkpointed_at: datetime | None = None) -> None:
        """Drive one action step by step. One committed transaction per step: it ends
        the previous step (after its Slurm call succeeded) and records this step's
        attempt before its call, so a crash between two calls leaves the same rows as
        a transaction for each. The action and its job are read once: only this
        process (the lease holder) writes unfinished actions, and nothing writes a
        job's ``checkpointed`` events during a drive.

        ``job`` (a row: id, slurm_job_id, spec) and ``checkpointed_at`` (its latest
        ``checkpointed`` event) as `drive` read them before its loop, or None: read here.
        """
        finishing: tuple | None = None   # (state, next step, note) of the last call
        jlog = job_logger(log, job.slurm_job_id) if job is not None else None
        with self.sessions() as s:
            for _ in range(16):  # every kind has fewer steps than this
                with s.begin():
                    if finishing is not None:
                        a = s.get(Action, action_id)
                        self._finish_step(s, a, *finishing, now, report, jlog,
                                          attempts=0)
                        finishing = None
                    if job is None:
                        a, job, state = self._load(s, action_id)
                        checkpointed_at = self._checkpointed_at(s, job.id)
                        jlog = job_logger(log, job.slurm_job_id)
                    else:
                        a = s.get(Action, action_id)
                        state = self._state(a, job)
                    if a.finished_at is not None:
                        return
                    if a.next_attempt_at is not None and a.next_attempt_at > now:
                        return
                    sj = observed.get(job.slurm_job_id)
                    if sj is None and refresh is not None:
                        try:
                            sj = refresh(job.slurm_job_id)
                        except SlurmError as exc:
                            jlog.warning("action %d waits: job missing from the poll and its "
                                         "state unreadable (%s)", action_id, exc)
                            return
                        if sj is not None:
                            observed[job.slurm_job_id] = sj
                    t = advance(state, Observation(sj, checkpointed_at, now))
                    if t.wait and a.note != t.note:
                        store.update_action(s, a.id, now=now, note=t.note)
                    if t.call is None:
                        if not t.wait:
                            self._finish_step(s, a, state, t.next_step, t.note, now, report,
                                              jlog)
                    else:
                        # Record the attempt before making the call (the first signal time
                        # is kept: a checkpoint written after it counts).
                        extra = ({"signalled_at": now} if state.step == Step.SIGNAL
                                 and a.signalled_at is None else {})
                        store.update_action(s, a.id, now=now, add_attempt=True,
                                            note=t.note or None, **extra)
                if t.call is None:
                    # A step without a Slurm call: waiting, or a transition already committed.
                    if state.step in _WAITING_STEPS:
                        self._hook(state, state.step, "before" if t.wait else "after")
                    if t.wait:
                        return
                    continue
                self._hook(state, state.step, "before")
                call = t.call
                try:
                    getattr(self.slurm, call.method)(state.job_id, *call.args)
                except SlurmUnavailable as exc:
                    report.slurm_unavailable = True
                    jlog.warning("%s: Slurm unavailable (%s); will retry", call.method, exc)
                    with s.begin():
                        store.update_action(s, action_id, now=now, last_error=str(exc))
                    return
                except SlurmRejected as exc:
                    report.calls[call.method] = report.calls.get(call.method, 0) + 1
                    self._rejected(action_id, state, call, exc, now, observed, jlog)
                    return
                report.calls[call.method] = report.calls.get(call.method, 0) + 1
                jlog.info("%s%s: done (action %d, %s -> %s)", call.method,
                          "(" + ", ".join(str(x) for x in call.args) + ")" if call.args else "",
                          action_id, state.step, t.next_step)
                self._hook(state, state.step, "after")
                if sj is not None:
                    observed[state.job_id] = _expected_after(sj, call)
                finishing = (state, t.next_step, t.note)
            if finishing is not None:
                with s.begin():
                    self._finish_step(s, s.get(Action, action_id), *finishing, now, report,
                                      jlog, attempts=0)

    def _finish_step(self, s: Session, a: Action, state: ActionState, step: Step, note: str,
                     now: datetime, report: DriveReport, jlog, attempts: int | None = None,
                     ) -> None:
        kw = {} if attempts is None else {"attempts": attempts}
        store.update_action(s, a.id, now=now, state=step.value, note=note or a.note,
                            next_attempt_at=None, finished=step.terminal, **kw)
        if step.terminal:
            report.finished.append((state.job_id, step.value))
            no_checkpoint = (step == Step.ABANDONED and state.step == Step.WAIT_CHECKPOINT
                             and "grace" in (note or ""))
            # A job that did not checkpoint in time is an operator's concern: a warning.
            (jlog.warning if no_checkpoint else jlog.info)(
                "action %d (%s) %s%s", a.id, a.kind, step.value, f": {note}" if note else "")
            if no_checkpoint:
                report.abandoned_no_checkpoint.append(state.job_id)
                store.add_job_event(s, a.job_id, now, "no_checkpoint",
                                    f"no checkpoint within {state.grace_s:.0f} s")

    def _rejected(self, action_id: int, state: ActionState, call: Call, exc: SlurmRejected,
                  now: datetime, observed: dict[str, SlurmJob], jlog) -> None:
        msg = exc.slurm_message or str(exc)
        jlog.warning("%s refused by Slurm: %s", call.method, msg)
        with self.sessions() as s, s.begin():
            a = s.get(Action, action_id)
            if state.step == Step.SHRINK:
                # 22.05 refuses e.g. a second shrink of the same job: checkpoint-requeue instead.
                store.update_action(s, a.id, now=now, state=Step.FAILED.value, last_error=msg,
                                    note="in-place shrink refused; falling back to requeue",
                                    finished=True)
                sj = observed.get(state.job_id)
                store.create_action(
                    s, job_id=a.job_id, kind=ActionKind.REQUEUE.value,
                    state=Step.SIGNAL.value, to_gpus=a.to_gpus, now=now,
                    from_gpus=a.from_gpus, from_nodes=a.from_nodes, to_nodes=a.to_nodes,
                    decision_id=a.decision_id,
                    restart_count_at_start=sj.restart_count if sj else a.restart_count_at_start,
                    note="fallback after refused in-place shrink")
                return
            # A release is retried for as long as it takes: a job the daemon held is
            # always released.
            if a.attempts < self.max_attempts or state.step == Step.RELEASE:
                delay = min(self.retry_after_s * 2 ** max(0, a.attempts - 1), 600.0)
                store.update_action(s, a.id, now=now, last_error=msg,
                                    next_attempt_at=now + timedelta(seconds=delay))
                return
            if state.kind == ActionKind.REQUEUE and state.step in _AFTER_REQUEUE:
                # The job is requeued and held: never leave it so. Skip to the release
                # (it restarts at whatever size Slurm has for it).
                store.update_action(s, a.id, now=now, state=Step.RELEASE.value, attempts=0,
                                    last_error=msg, next_attempt_at=None,
                                    note=f"{state.step} refused; releasing at the old size")
                return
            store.update_action(s, a.id, now=now, state=Step.FAILED.value, last_error=msg,
                                finished=True)
