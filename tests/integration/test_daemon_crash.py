"""Issue 8, crash test: SIGKILL at every step of the actuator, restart, nothing lost or doubled.

How the crash is made: the daemon runs as a real ``malleable daemon`` process with
the test hook ``MALLEABLE_TEST_CRASH_AT`` (malleable/daemon/testhook.py) listing
kill points ``<kind>.<step>:<before|after>``. At the first listed point it reaches,
the daemon sends SIGKILL to itself: "before" is after the step's attempt was
committed to the database and before its Slurm call, "after" is after the Slurm
call returned and before the next step was committed (for the waiting steps
wait_checkpoint and observe: found waiting / left, committed). No clean-up runs;
the lease stays taken by a dead process. The test then restarts the daemon with
the remaining points, so one sequence of restarts walks every point of every
action while the jobs keep running in Slurm. Each point kills exactly once.

Scenario (4 nodes x 4 GPUs, policy equi):

* phase 1: a rigid job (node 1), S (8 GPUs, shrink=inplace), P and Q (2 GPUs each):
  equi gives each malleable job 4 GPUs, so S is shrunk in place and P and Q go
  through the whole checkpoint-requeue (signal, wait_checkpoint, requeue_hold,
  resize, start_now, release, observe). Two requeues make every point reachable:
  after a kill at ``release:after`` that job is running when the daemon comes
  back, and it is the other job's uninterrupted release that waits in observe;
* phase 2: X (pending, 8-12 GPUs, asks for 12) does not fit next to S, P and Q: it
  is held; the test then cancels S and Q, and X is admitted: resized to 8 GPUs and
  released by the daemon.

After it settles: every point fired once and killed the daemon, no job is lost,
none is left held, P and Q were requeued exactly once each (Slurm's restart count
is 1 and the log shows one ``requeue_hold`` each), every job runs at its target
size, the rigid job was never touched, and every action finished ``done``.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import wait_until
from tests.integration.daemon_support import (
    JOBS,
    DaemonProcess,
    environ_for,
    job_view,
    sbatch,
    squeue,
    store_of,
    submit_emulated,
    submit_rigid,
    wait_running,
    write_config,
)

pytestmark = pytest.mark.slurm

REQUEUE_STEPS = ("signal", "wait_checkpoint", "requeue_hold", "resize", "start_now", "release",
                 "observe")
PHASE1 = (["shrink.shrink:before", "shrink.shrink:after", "shrink.observe:after"]
          + [f"requeue.{step}:{phase}" for step in REQUEUE_STEPS for phase in ("before", "after")])
HOLD = ["hold.hold:before", "hold.hold:after"]
ADMIT = ["admit.resize:before", "admit.resize:after", "admit.release:before",
         "admit.release:after"]


def crash_through(daemon: DaemonProcess, points: list[str], check) -> list[str]:
    """Restart the daemon until every point in ``points`` has killed it once; returns
    the points in the order they fired. ``check()`` runs after each crash."""
    left = list(points)
    fired = []
    while left:
        daemon.start(extra_env={"MALLEABLE_TEST_CRASH_AT": ",".join(left)}, ready=False)
        rc = daemon.wait_exit(timeout=60)
        m = re.search(r"test hook MALLEABLE_TEST_CRASH_AT: SIGKILL at (\S+)", daemon.text())
        assert rc == -9 and m is not None, \
            f"rc {rc}, points left {left}:\n{daemon.text()[-3000:]}"
        point = m.group(1)
        assert point in left, point
        left.remove(point)
        fired.append(point)
        check()
    return fired


def test_sigkill_at_every_actuator_step_loses_nothing_and_requeues_once(slurm, tmp_path):
    rigid = submit_rigid(slurm, tmp_path, nodes=1, gpus_per_node=4)
    wait_running(slurm, [rigid])
    s = submit_emulated(slurm, tmp_path, "gpus=4-8,step=4,shrink=inplace,grace=30",
                        nodes=2, gpus_per_node=4)
    # P and Q save their checkpoint in 3 s, so that a daemon restarted after the signal
    # finds them still checkpointing (the kill point "wait_checkpoint:before").
    p, q = (submit_emulated(slurm, tmp_path, "gpus=2-8,step=2,grace=30", nodes=1,
                            gpus_per_node=2, job_args="--save-s 300") for _ in range(2))
    start = wait_running(slurm, [rigid, s, p, q])
    rigid_view = job_view(start[rigid])
    live = [rigid, s, p, q]

    def never_lost_or_doubled():
        jobs = squeue(slurm)
        for j in live:
            assert jobs[j].state.value in ("RUNNING", "PENDING", "COMPLETING"), jobs[j]
        assert jobs[p].restart_count <= 1 and jobs[q].restart_count <= 1
        assert jobs[s].restart_count == 0
        assert job_view(jobs[rigid]) == rigid_view

    config = write_config(tmp_path, poll=2, decide=3)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", environ_for(slurm))
    store = store_of(tmp_path)
    try:
        fired = crash_through(daemon, PHASE1, never_lost_or_doubled)
        # Settle: a daemon without kill points finishes what is left.
        daemon.start()

        def phase1_done():
            jobs = squeue(slurm)
            sizes = {j: (jobs[j].state.value, jobs[j].gpus, jobs[j].restart_count)
                     for j in (s, p, q)}
            return all(a["finished"] for a in store.actions()) and \
                sizes == {s: ("RUNNING", 4, 0), p: ("RUNNING", 4, 1), q: ("RUNNING", 4, 1)}
        wait_until(phase1_done, timeout=60, what="phase 1 settled at 4/4/4 GPUs")
        assert daemon.stop() == 0

        # Phase 2: X (8-12 GPUs, asks for 12) does not fit: held; then admitted at 8.
        x = sbatch(slurm, tmp_path, JOBS / "rigid.sbatch", nodes=3, gpus_per_node=4,
                   comment="malleable:gpus=8-12,step=4,grace=30,batch=512,restart_cost=0",
                   name="x")
        live.append(x)
        fired += crash_through(daemon, HOLD, never_lost_or_doubled)
        held = squeue(slurm)[x]
        assert held.state.value == "PENDING" and held.held and held.gpus == 12
        slurm.run("scancel", s, q)
        live.remove(s)
        live.remove(q)
        fired += crash_through(daemon, ADMIT, never_lost_or_doubled)
        daemon.start()
        wait_until(lambda: (j := squeue(slurm)[x]).state.value == "RUNNING" and j.gpus == 8,
                   timeout=60, what="X admitted and running on 8 GPUs")
        wait_until(lambda: all(a["finished"] for a in store.actions()), timeout=30,
                   what="every action finished")
        assert daemon.stop() == 0
    finally:
        daemon.kill()

    assert sorted(fired) == sorted(PHASE1 + HOLD + ADMIT)
    end = squeue(slurm)
    # No job lost, none held; sizes are the plan's; the rigid job untouched.
    assert {j: end[j].state.value for j in (rigid, p, x)} == dict.fromkeys((rigid, p, x),
                                                                          "RUNNING")
    assert not any(j.held for j in end.values())
    assert (end[p].gpus, end[x].gpus, end[x].node_count) == (4, 8, 2)
    assert job_view(end[rigid]) == rigid_view
    assert store.actions(rigid) == []
    # P and Q: one requeue action each, one requeue in Slurm, one requeue_hold call.
    log = daemon.text(whole=True)
    assert end[p].restart_count == 1 and end[x].restart_count == 0
    for j in (p, q):
        assert len(re.findall(rf"job={j} \S+: requeue_hold: done", log)) == 1
    acts = store.actions()
    assert all(a["state"] == "done" for a in acts), acts
    kinds = sorted((a["job"], a["kind"]) for a in acts)
    assert kinds == sorted([(s, "shrink"), (p, "requeue"), (q, "requeue"), (x, "hold"),
                            (x, "admit")]), kinds
    # Every kill was followed by a start that took the dead daemon's lease over at once.
    kills = len(PHASE1 + HOLD + ADMIT)
    assert log.count("SIGKILL at") == kills
    assert log.count("taking the lease over") == kills
    store.close()
