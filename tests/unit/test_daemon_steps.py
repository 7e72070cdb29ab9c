"""Step rules added after the crash and gap tests (pure), the test hook, the dead lease holder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from malleable.daemon.actions import ActionState, Call, Observation, Step, advance
from malleable.daemon.reconcile import ActionKind
from malleable.daemon.shapes import Shape
from malleable.daemon.testhook import CrashPoints, crash_points_from_env
from malleable.db.lease import dead_local_holder as _dead_local
from malleable.slurm.records import JobState, SignalTarget, SlurmJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def job(state=JobState.RUNNING, nodes=1, gpn=2, held=False, restarts=0) -> SlurmJob:
    return SlurmJob(job_id="7", job_id_num=7, state=state, node_count=nodes, gpus_per_node=gpn,
                    gpus=nodes * gpn, held=held, restart_count=restarts, requeueable=True)


TO = Shape(1, 4)


def action(kind=ActionKind.REQUEUE, step=Step.OBSERVE, to=TO, **kw) -> ActionState:
    return ActionState("7", kind, step, to.gpus, to, created_at=T0, grace_s=60,
                       observe_timeout_s=600, **kw)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_observe_waits_then_times_out_to_done_with_a_note():
    pending = job(JobState.PENDING, 1, 4, restarts=1)
    a = action()
    # A requeue may take its grace to checkpoint: its observe limit counts from creation
    # plus the grace.
    assert advance(a, Observation(pending, None, at(659))).wait
    t = advance(a, Observation(pending, None, at(661)))
    assert t.next_step == Step.DONE and t.call is None
    assert t.note == "not running on 4 GPUs 660 s after the action began (PENDING, 4 GPUs); " \
                     "left to Slurm"
    # An in-place shrink that Slurm reports at another size: the same limit, no grace.
    s = action(ActionKind.SHRINK)
    big = job(JobState.RUNNING, 2, 4)
    assert advance(s, Observation(big, None, at(599))).wait
    assert advance(s, Observation(big, None, at(601))).next_step == Step.DONE
    # Without a creation time (an old row), it waits as before.
    assert advance(replace(a, created_at=None), Observation(pending, None, at(10 ** 6))).wait


def test_a_signal_step_redone_after_a_crash_signals_again_unless_the_job_checkpointed():
    a = action(step=Step.SIGNAL, signalled_at=at(0))
    t = advance(a, Observation(job(), None, at(5)))
    assert t.call == Call("signal", ("USR1", SignalTarget.BATCH))
    t = advance(a, Observation(job(), at(3), at(5)))      # checkpointed after the 1st signal
    assert t.call is None and t.next_step == Step.REQUEUE_HOLD
    t = advance(a, Observation(job(), at(-10), at(5)))    # an older checkpoint does not count
    assert t.call is not None


def test_an_admit_killed_after_its_resize_is_done_when_slurm_started_the_job_at_that_size():
    a = action(ActionKind.ADMIT, Step.RESIZE)
    t = advance(a, Observation(job(JobState.RUNNING, 1, 4), None, at(1)))
    assert t.next_step == Step.DONE and t.note == "running on 4 GPUs"
    t = advance(a, Observation(job(JobState.RUNNING, 2, 4), None, at(1)))
    assert t.next_step == Step.ABANDONED


def test_crash_points_are_checked_and_do_nothing_unless_listed():
    assert crash_points_from_env({}) is None
    assert crash_points_from_env({"MALLEABLE_TEST_CRASH_AT": " "}) is None
    hook = crash_points_from_env({"MALLEABLE_TEST_CRASH_AT": "requeue.signal:after, hold.hold:before"})
    assert hook.points == {"requeue.signal:after", "hold.hold:before"}
    hook("requeue", "signal", "before")                   # not listed: returns
    for bad in ("requeue.signal", "signal:after", "requeue.signal:during"):
        with pytest.raises(ValueError, match="MALLEABLE_TEST_CRASH_AT"):
            CrashPoints({bad})


def test_a_listed_crash_point_sigkills_the_process():
    code = ("from malleable.daemon.testhook import CrashPoints\n"
            "CrashPoints({'shrink.shrink:after'})('shrink', 'shrink', 'after')\n"
            "print('survived')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9 and "survived" not in proc.stdout


def test_a_lease_holder_is_dead_only_when_it_names_this_host_and_no_process():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    assert _dead_local(f"{host}:{gone.pid}")
    assert not _dead_local(f"{host}:{os.getpid()}")
    assert not _dead_local(f"not-{host}:{gone.pid}")
    assert not _dead_local(f"{host}:abc")
