"""The actuator's state machine, as a pure function of (action, observation).

Each action is a sequence of steps (below). `advance` looks at where the action
is and at what Slurm and the job's progress file say now, and returns the next
Slurm call to make (if any) and the step to record after it. The imperative
shell (`malleable.daemon.actuator`) writes the step to the database BEFORE it
makes the call, so a daemon killed at any point finds the step again on
restart; every step checks the observed state first, so re-running it is
harmless (idempotent). In particular a requeue is never issued twice: once the
job is no longer RUNNING after the requeue step was recorded, the requeue
happened.

Steps by kind (`ActionKind`)::

    hold     HOLD -> DONE
    admit    RESIZE -> RELEASE -> DONE
    shrink   SHRINK -> OBSERVE -> DONE      (refused: falls back to requeue)
    requeue  SIGNAL -> WAIT_CHECKPOINT -> REQUEUE_HOLD
               -> RESIZE -> START_NOW -> RELEASE -> OBSERVE -> DONE
             (to 0 GPUs, a preemption: ... REQUEUE_HOLD -> DONE, the job stays held)

A job that does not write a ``checkpointed`` event within its grace period
after the signal is left running untouched: the action is ABANDONED and the
shell backs the job off from further requeues.

OBSERVE never blocks a job for good: an action still observing
``observe_timeout_s`` after it could have released the job (its creation, plus
the grace period for a checkpoint-requeue) is DONE with a note; the job is no
longer held, and Slurm starts it when it can. (The daemon also ends an
OBSERVE early when a newer plan wants another size for the job.)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from malleable.daemon.reconcile import ActionKind
from malleable.daemon.shapes import Shape
from malleable.slurm.records import JobState, SignalTarget, SlurmJob


class Step(enum.StrEnum):
    """Where an action is. DONE, ABANDONED and FAILED are terminal."""

    HOLD = "hold"
    SHRINK = "shrink"
    SIGNAL = "signal"
    WAIT_CHECKPOINT = "wait_checkpoint"
    REQUEUE_HOLD = "requeue_hold"
    RESIZE = "resize"
    START_NOW = "start_now"
    RELEASE = "release"
    OBSERVE = "observe"
    DONE = "done"
    ABANDONED = "abandoned"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Step.DONE, Step.ABANDONED, Step.FAILED)


FIRST_STEP = {
    ActionKind.HOLD: Step.HOLD,
    ActionKind.ADMIT: Step.RESIZE,
    ActionKind.SHRINK: Step.SHRINK,
    ActionKind.REQUEUE: Step.SIGNAL,
}


@dataclass(frozen=True)
class ActionState:
    """What the database holds about an action in flight.

    Attributes:
        job_id: the job.
        kind: `ActionKind`.
        step: the step to perform next (or the one in progress when the daemon stopped).
        to_gpus: target GPUs (0: stay held).
        to_shape: target shape (None when to_gpus is 0).
        restart_count_at_start: the job's restart count when the action was created.
        signal: the job's checkpoint signal (from its spec), e.g. "USR1".
        signal_target: which of the job's processes get it (from its spec; default the
            batch shell, which the contract's sbatch scripts trap and forward).
        grace_s: seconds the job has to checkpoint after the signal.
        signalled_at: when the signal step was first recorded (None before).
        created_at: when the action was recorded (None: unknown, OBSERVE never times out).
        observe_timeout_s: how long OBSERVE waits for the job to run at its new size,
            seconds after ``created_at`` (plus ``grace_s`` for a requeue).
    """

    job_id: str
    kind: ActionKind
    step: Step
    to_gpus: int
    to_shape: Shape | None
    restart_count_at_start: int = 0
    signal: str = "USR1"
    signal_target: SignalTarget = SignalTarget.BATCH
    grace_s: float = 120.0
    signalled_at: datetime | None = None
    created_at: datetime | None = None
    observe_timeout_s: float = 600.0


@dataclass(frozen=True)
class Observation:
    """What the actuator sees now.

    Attributes:
        job: the job as Slurm reports it (None: Slurm no longer knows it).
        checkpointed_at: time of the job's latest ``checkpointed`` progress event (None: none).
        now: the daemon's clock.
    """

    job: SlurmJob | None
    checkpointed_at: datetime | None
    now: datetime


@dataclass(frozen=True)
class Call:
    """A Slurm call: ``getattr(client, method)(job_id, *args)``."""

    method: str
    args: tuple = ()


@dataclass(frozen=True)
class Transition:
    """The outcome of `advance`: make ``call`` (if any), then record ``next_step``.

    ``wait`` means nothing can happen yet (the step stays, no call).
    """

    next_step: Step
    call: Call | None = None
    note: str = ""
    wait: bool = False


def _after_requeue(a: ActionState) -> Step:
    return Step.RESIZE if a.to_gpus > 0 else Step.DONE


def _requeued(a: ActionState, job: SlurmJob) -> bool:
    """The job has left RUNNING since the action began: the requeue happened."""
    return job.state != JobState.RUNNING or job.restart_count > a.restart_count_at_start


def _checkpointed(a: ActionState, obs: Observation) -> bool:
    """The job wrote a checkpoint since it was (first) signalled."""
    return (obs.checkpointed_at is not None and a.signalled_at is not None
            and obs.checkpointed_at >= a.signalled_at)


def _shape(job: SlurmJob) -> Shape:
    return Shape(job.node_count, job.gpus_per_node)


def advance(a: ActionState, obs: Observation) -> Transition:
    """The next call and step for action ``a`` given observation ``obs``.

    Returns:
        A `Transition`. Terminal steps return themselves with no call.

    Raises:
        ValueError: an action in a step that its kind does not have.
    """
    job = obs.job
    if a.step.terminal:
        return Transition(a.step)
    if job is None or job.state.finished:
        why = "job no longer known to Slurm" if job is None else f"job {job.state.value}"
        # A job that ended while we held it is not ours to worry about any more.
        return Transition(Step.ABANDONED, note=why)
    step = a.step

    if step == Step.HOLD:
        if job.state != JobState.PENDING:
            return Transition(Step.ABANDONED, note=f"job is {job.state.value}, not pending")
        if job.held:
            return Transition(Step.DONE, note="already held")
        return Transition(Step.DONE, Call("hold"))

    if step == Step.SHRINK:
        if job.state != JobState.RUNNING:
            return Transition(Step.ABANDONED, note=f"job is {job.state.value}, not running")
        if a.to_shape is None or _shape(job) == a.to_shape:
            return Transition(Step.OBSERVE, note="already at target size")
        return Transition(Step.OBSERVE, Call("shrink_running", (a.to_shape.nodes,)))

    if step == Step.SIGNAL:
        if job.state != JobState.RUNNING:
            if a.kind == ActionKind.REQUEUE and _requeued(a, job):
                return Transition(_after_requeue(a), note="already requeued")
            return Transition(Step.ABANDONED, note=f"job is {job.state.value}, not running")
        if _checkpointed(a, obs):
            # Signalled before a crash, and the job has answered: no second signal.
            return Transition(Step.REQUEUE_HOLD, note="checkpoint written")
        return Transition(Step.WAIT_CHECKPOINT, Call("signal", (a.signal, a.signal_target)))

    if step == Step.WAIT_CHECKPOINT:
        if _requeued(a, job):
            return Transition(_after_requeue(a), note="already requeued")
        if _checkpointed(a, obs):
            return Transition(Step.REQUEUE_HOLD, note="checkpoint written")
        started = a.signalled_at or obs.now
        # Seconds as floats: a grace too long for a timedelta (a spec stored before its
        # 7-day bound) must not raise here.
        if (obs.now - started).total_seconds() > a.grace_s:
            return Transition(Step.ABANDONED,
                              note=f"no checkpoint within {a.grace_s:.0f} s grace; job left running")
        return Transition(step, wait=True, note="waiting for checkpoint")

    if step == Step.REQUEUE_HOLD:
        if _requeued(a, job):
            return Transition(_after_requeue(a), note="already requeued")
        return Transition(_after_requeue(a), Call("requeue_hold"))

    if step == Step.RESIZE:
        if job.state == JobState.RUNNING:
            if a.kind == ActionKind.ADMIT:
                if a.to_shape is not None and _shape(job) == a.to_shape:
                    # Resized before a crash, and Slurm started it since.
                    return Transition(Step.DONE, note=f"running on {job.gpus} GPUs")
                return Transition(Step.ABANDONED, note="job started before it was resized")
            return Transition(Step.OBSERVE, note="job already running again")
        if job.state != JobState.PENDING:  # e.g. still COMPLETING after the requeue
            return Transition(step, wait=True, note=f"waiting for PENDING (is {job.state.value})")
        nxt = Step.START_NOW if a.kind == ActionKind.REQUEUE else Step.RELEASE
        if a.to_shape is None or _shape(job) == a.to_shape:
            return Transition(nxt, note="already at target size")
        return Transition(nxt, Call("resize_pending", (a.to_shape.nodes, a.to_shape.gpus_per_node)))

    if step == Step.START_NOW:
        if job.state != JobState.PENDING:
            return Transition(Step.RELEASE, note=f"job is {job.state.value}")
        return Transition(Step.RELEASE, Call("start_now"))

    if step == Step.RELEASE:
        nxt = Step.OBSERVE if a.kind == ActionKind.REQUEUE else Step.DONE
        if job.state != JobState.PENDING or not job.held:
            return Transition(nxt, note="not held")
        return Transition(nxt, Call("release"))

    if step == Step.OBSERVE:
        if job.state == JobState.RUNNING and job.gpus == a.to_gpus:
            return Transition(Step.DONE, note=f"running on {job.gpus} GPUs")
        if job.state == JobState.PENDING and job.held:
            # Someone (an admin) held it after we released it: not ours any more.
            return Transition(Step.DONE, note="held by someone else after release")
        if a.created_at is not None:
            limit = a.observe_timeout_s + (a.grace_s if a.kind == ActionKind.REQUEUE else 0.0)
            if obs.now - a.created_at > timedelta(seconds=limit):
                return Transition(Step.DONE, note=(
                    f"not running on {a.to_gpus} GPUs {limit:.0f} s after the action began "
                    f"({job.state.value}, {job.gpus} GPUs); left to Slurm"))
        if job.state == JobState.RUNNING and a.kind == ActionKind.SHRINK:
            return Transition(step, wait=True, note=f"running on {job.gpus} GPUs, expecting "
                              f"{a.to_gpus}")
        return Transition(step, wait=True, note=f"{job.state.value}, waiting to run")

    raise ValueError(f"action for job {a.job_id}: step {step!r} is not a step of {a.kind}")
