"""Every kill point of the actuator, one at a time, in-process against the simulator's Slurm.

The harness test (tests/integration/test_daemon_crash.py) kills a real daemon
process with SIGKILL at every point in one chain of restarts. This one isolates
each point in its own run, so a failure names the point: the actuator's step
hook raises at the point instead of killing the process. The hook runs where no
transaction is open (after the commit before a Slurm call, after the call, or
after a committed transition), so the store is left exactly as a SIGKILL leaves
it; the "restarted" daemon is a new `Daemon` on the same store and the same
simulated Slurm (tests/unit/test_daemon_cycle.py has the scaffolding).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from malleable.daemon.cycle import Daemon
from malleable.db.models import Action
from malleable.sim.jobs import ProfileJob, RigidJob
from malleable.sim.profiles import load_profile
from tests.unit.test_daemon_cycle import Cluster

REQUEUE = [f"requeue.{step}:{phase}" for step in
           ("signal", "wait_checkpoint", "requeue_hold", "resize", "start_now", "release",
            "observe") for phase in ("before", "after")]
SHRINK = ["shrink.shrink:before", "shrink.shrink:after", "shrink.observe:after"]
HOLD_ADMIT = ["hold.hold:before", "hold.hold:after", "admit.resize:before", "admit.resize:after",
              "admit.release:before", "admit.release:after"]


class Crash(Exception):
    """Stands for the SIGKILL at a kill point."""


def restart(c: Cluster, point: str | None, fired: list[str]) -> Daemon:
    """A new daemon process on the same store and Slurm, with the kill point armed once."""
    d = Daemon(slurm=c.slurm, sessions=c.sessions, clock=c.engine.datetime_at,
               spool_dir=str(c.spool), config=c.daemon.config)

    def hook(kind: str, step: str, phase: str) -> None:
        if f"{kind}.{step}:{phase}" == point and not fired:
            fired.append(point)
            raise Crash(point)
    d.actuator.step_hook = hook
    c.daemon = d
    return d


def run_cycles(c: Cluster, point: str | None, fired: list[str], n: int) -> None:
    """n decide cycles 10 s apart (with a poll between), restarting after a crash."""
    for _ in range(n):
        for cycle in (c.daemon.decide_cycle, c.daemon.poll_cycle):
            try:
                cycle()
            except Crash:
                restart(c, point, fired)
            c.advance(5)


@pytest.mark.parametrize("point", SHRINK + REQUEUE + HOLD_ADMIT)
def test_a_crash_at_each_point_loses_nothing_and_requeues_once(tmp_path, point):
    c = Cluster(tmp_path, nodes=4)
    fired: list[str] = []
    restart(c, point, fired)
    rigid = c.submit(1, 4, RigidJob(1e6))                           # node1
    s = c.submit(2, 4, ProfileJob(load_profile("cifar10"), spool_dir=c.spool, batch=512),
                 "malleable:gpus=4-8,step=4,shrink=inplace,grace=60,batch=512,restart_cost=0")
    p, q = c.malleable(), c.malleable()                             # node4, 2 + 2 GPUs
    c.advance(60)
    run_cycles(c, point, fired, 5)
    assert {j: (c.job(j).gpus, c.job(j).restart_count) for j in (s, p, q)} == \
        {s: (4, 0), p: (4, 1), q: (4, 1)}

    assert not any(j.held for j in c.slurm.jobs())
    with c.sessions() as ses:
        assert set(ses.scalars(select(Action.state)).all()) == {"done"}
    if point not in HOLD_ADMIT:
        assert fired == [point]
        return

    # Phase 2: X does not fit (held), then S and Q leave and X is admitted at 8 GPUs.
    x = c.submit(3, 4, RigidJob(1e6),
                 "malleable:gpus=8-12,step=4,grace=60,batch=512,restart_cost=0")
    c.advance(1)
    run_cycles(c, point, fired, 2)
    assert c.job(x).held
    c.slurm.cancel(s)
    c.slurm.cancel(q)
    c.advance(1)
    run_cycles(c, point, fired, 3)

    assert fired == [point]
    assert c.job(x).state.value == "RUNNING" and (c.job(x).gpus, c.job(x).node_count) == (8, 2)
    assert c.job(p).state.value == "RUNNING" and c.job(p).gpus == 4
    assert c.job(p).restart_count == 1 and c.job(x).restart_count == 0
    assert c.job(rigid).restart_count == 0 and c.job(rigid).gpus == 4
    assert not any(j.held for j in c.slurm.jobs())
    with c.sessions() as ses:
        states = ses.scalars(select(Action.state)).all()
    assert states and set(states) == {"done"}, states
