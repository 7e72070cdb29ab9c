"""The actuator's state machine (pure): every step is idempotent under re-observation."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from malleable.daemon.actions import ActionState, Call, Observation, Step, advance
from malleable.daemon.reconcile import ActionKind
from malleable.daemon.shapes import Shape
from malleable.slurm.records import JobState, SignalTarget, SlurmJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def job(state=JobState.RUNNING, nodes=2, gpn=4, held=False, restarts=0) -> SlurmJob:
    return SlurmJob(job_id="7", job_id_num=7, state=state, node_count=nodes, gpus_per_node=gpn,
                    gpus=nodes * gpn, held=held, restart_count=restarts, requeueable=True)


TO = Shape(3, 2)


def requeue(step: Step, to=TO, **kw) -> ActionState:
    return ActionState("7", ActionKind.REQUEUE, step, to.gpus if to else 0, to, **kw)


def obs(j, ckpt=None, now=T0) -> Observation:
    return Observation(j, ckpt, now)


def test_requeue_happy_path():
    a = requeue(Step.SIGNAL)
    t = advance(a, obs(job()))
    assert t.call == Call("signal", ("USR1", SignalTarget.BATCH)) and t.next_step == Step.WAIT_CHECKPOINT
    a = replace(a, step=Step.WAIT_CHECKPOINT, signalled_at=T0)
    assert advance(a, obs(job(), now=T0 + timedelta(seconds=5))).wait
    t = advance(a, obs(job(), ckpt=T0 + timedelta(seconds=3)))
    assert t.next_step == Step.REQUEUE_HOLD and t.call is None
    t = advance(replace(a, step=Step.REQUEUE_HOLD), obs(job()))
    assert t.call == Call("requeue_hold") and t.next_step == Step.RESIZE
    pending = job(JobState.PENDING, held=True, restarts=1)
    t = advance(replace(a, step=Step.RESIZE), obs(pending))
    assert t.call == Call("resize_pending", (3, 2)) and t.next_step == Step.START_NOW
    t = advance(replace(a, step=Step.START_NOW), obs(pending))
    assert t.call == Call("start_now") and t.next_step == Step.RELEASE
    t = advance(replace(a, step=Step.RELEASE), obs(pending))
    assert t.call == Call("release") and t.next_step == Step.OBSERVE
    assert advance(replace(a, step=Step.OBSERVE), obs(job(JobState.PENDING, 3, 2))).wait
    t = advance(replace(a, step=Step.OBSERVE), obs(job(JobState.RUNNING, 3, 2, restarts=1)))
    assert t.next_step == Step.DONE


def test_requeue_is_never_issued_twice():
    # The daemon recorded REQUEUE_HOLD, called Slurm, and died before recording RESIZE.
    a = requeue(Step.REQUEUE_HOLD)
    for seen in (job(JobState.PENDING, held=True, restarts=1), job(JobState.COMPLETING),
                 job(JobState.PENDING, held=True)):
        t = advance(a, obs(seen))
        assert t.call is None and t.next_step == Step.RESIZE


def test_resize_waits_for_pending_and_skips_when_done():
    a = requeue(Step.RESIZE)
    assert advance(a, obs(job(JobState.COMPLETING))).wait
    t = advance(a, obs(job(JobState.PENDING, 3, 2, held=True, restarts=1)))
    assert t.call is None and t.next_step == Step.START_NOW


def test_no_checkpoint_within_grace_abandons_without_touching_job():
    a = requeue(Step.WAIT_CHECKPOINT, signalled_at=T0, grace_s=60)
    t = advance(a, obs(job(), now=T0 + timedelta(seconds=61)))
    assert t.next_step == Step.ABANDONED and t.call is None
    # A checkpoint from before the signal does not count.
    t = advance(a, obs(job(), ckpt=T0 - timedelta(seconds=1), now=T0 + timedelta(seconds=61)))
    assert t.next_step == Step.ABANDONED


def test_a_grace_too_long_for_a_timedelta_waits_instead_of_raising():
    # A spec stored before grace had its 7-day bound: the wait must not overflow.
    a = requeue(Step.WAIT_CHECKPOINT, signalled_at=T0, grace_s=1e20)
    t = advance(a, obs(job(), now=T0 + timedelta(days=30)))
    assert t.wait and t.next_step == Step.WAIT_CHECKPOINT and t.call is None


def test_preemption_stays_held():
    a = requeue(Step.REQUEUE_HOLD, to=None)
    t = advance(a, obs(job()))
    assert t.call == Call("requeue_hold") and t.next_step == Step.DONE


def test_job_gone_or_finished_ends_action():
    a = requeue(Step.RELEASE)
    assert advance(a, obs(None)).next_step == Step.ABANDONED
    assert advance(a, obs(job(JobState.COMPLETED))).next_step == Step.ABANDONED


def test_admit_and_hold_and_shrink():
    admit = ActionState("7", ActionKind.ADMIT, Step.RESIZE, 4, Shape(1, 4))
    t = advance(admit, obs(job(JobState.PENDING, 1, 2, held=True)))
    assert t.call == Call("resize_pending", (1, 4)) and t.next_step == Step.RELEASE
    t = advance(replace(admit, step=Step.RELEASE), obs(job(JobState.PENDING, 1, 4, held=True)))
    assert t.call == Call("release") and t.next_step == Step.DONE
    assert advance(admit, obs(job(JobState.RUNNING, 1, 2))).next_step == Step.ABANDONED

    hold = ActionState("7", ActionKind.HOLD, Step.HOLD, 0, None)
    assert advance(hold, obs(job(JobState.PENDING))).call == Call("hold")
    assert advance(hold, obs(job(JobState.PENDING, held=True))).call is None

    shrink = ActionState("7", ActionKind.SHRINK, Step.SHRINK, 4, Shape(1, 4))
    t = advance(shrink, obs(job()))
    assert t.call == Call("shrink_running", (1,)) and t.next_step == Step.OBSERVE
    assert advance(replace(shrink, step=Step.OBSERVE), obs(job(nodes=1))).next_step == Step.DONE


def test_terminal_steps_stay():
    for s in (Step.DONE, Step.ABANDONED, Step.FAILED):
        t = advance(requeue(s), obs(job()))
        assert t.next_step == s and t.call is None
