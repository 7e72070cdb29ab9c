"""Properties every policy must have, over random clusters and jobs (hypothesis).

* capacity is never exceeded, node by node (checked by exhaustive packing),
  and every target respects min/max/step, node granularity and the grid;
* the same input (and seed) gives the same output, and the input is not changed;
* the same holds behind the hysteresis wrapper;
* work conservation: a policy other than `static` leaves no GPU idle that a
  job could grow into (checked on one-GPU nodes, where packing cannot get in
  the way, with no job running yet, so no restart penalty applies);
* no starvation under `las`, `gittins` and `default` (and `pollux`): over a
  sequence of decisions, with attained service, age and remaining work
  advancing between calls, every job that fits the cluster is without GPUs
  for at most ceil(starve_s / dt) + J consecutive decisions (the bound
  `malleable.policies.starvation` proves), and behind hysteresis for at most
  ceil(starve_s / dt) + J * ceil(cooldown_s / dt) + 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.policies.feasibility import Grid
from malleable.policies.hysteresis import Hysteresis
from malleable.policies.registry import available, get_policy
from malleable.policies.synthetic import random_instance
from tests.unit.policy_cases import (
    PROFILE,
    assert_valid,
    copy_arrays,
    instances,
    longest_waits,
)

ALL = available()


@pytest.mark.parametrize("name", ALL)
@settings(PROFILE)
@given(case=instances())
def test_capacity_bounds_granularity(name, case):
    jobs, cap, ctx = case
    before = copy_arrays(jobs)
    alloc = get_policy(name).allocate(jobs, cap, ctx)
    assert_valid(alloc, jobs, cap)
    after = copy_arrays(jobs)
    assert all(np.array_equal(before[k], after[k]) for k in before), "policy mutated its input"


@pytest.mark.parametrize("name", ALL)
@settings(PROFILE)
@given(case=instances())
def test_deterministic(name, case):
    jobs, cap, ctx = case
    a = get_policy(name).allocate(jobs, cap, ctx)
    b = get_policy(name).allocate(jobs, cap, ctx)
    assert np.array_equal(a.gpus, b.gpus)
    assert np.array_equal(a.batch, b.batch)
    assert a.reason == b.reason
    assert (math.isnan(a.objective) and math.isnan(b.objective)) or a.objective == b.objective


@pytest.mark.parametrize("name", ALL)
@settings(PROFILE)
@given(case=instances(), min_gain=st.sampled_from([0.0, 0.05, 0.5]),
       cooldown=st.sampled_from([0.0, 300.0, 1e9]), lease=st.sampled_from([0.0, 10.0, 1e3]))
def test_hysteresis_keeps_invariants(name, case, min_gain, cooldown, lease):
    jobs, cap, ctx = case
    alloc = Hysteresis(get_policy(name), min_gain=min_gain, cooldown_s=cooldown,
                       min_run_restarts=lease).allocate(jobs, cap, ctx)
    assert_valid(alloc, jobs, cap)
    # A running job inside its cool-down is never changed.
    cool = (jobs.current > 0) & (jobs.since_change < cooldown)
    assert np.array_equal(alloc.gpus[cool], jobs.current[cool])
    # Nor preempted inside its lease.
    leased = (jobs.current > 0) & (jobs.since_change < lease * jobs.restart_cost)
    assert (alloc.gpus[leased] > 0).all()


@pytest.mark.parametrize("name", [n for n in ALL if n != "static"])
@settings(PROFILE)
@given(seed=st.integers(0, 2**32 - 1), J=st.integers(1, 12), nodes=st.integers(1, 40))
def test_work_conserving(name, seed, J, nodes):
    rng = np.random.default_rng(seed)
    # Nothing runs yet: with running jobs, pollux and gittins may rightly leave a GPU idle
    # rather than restart a job for less than the restart penalty.
    jobs, cap = random_instance(rng, J, nodes, 1, partial=False, running=False)
    alloc = get_policy(name).allocate(jobs, cap)
    assert_valid(alloc, jobs, cap)
    idle = cap.total - int(alloc.gpus.sum())
    grid = Grid.build(jobs, cap)
    for j in range(J):
        nxt = grid.nxt[j][int(jobs.table.column(alloc.gpus[j : j + 1])[0])]
        if nxt >= 0:
            assert grid.klist[nxt] - alloc.gpus[j] > idle, (
                f"job {j} at {alloc.gpus[j]} could grow to {grid.klist[nxt]} into {idle} idle GPUs")


STARVATION_FREE = ["las", "gittins", "pollux", "default"]


@pytest.mark.parametrize("name", STARVATION_FREE)
@settings(PROFILE, max_examples=max(PROFILE.max_examples // 2, 10))
@given(case=instances(max_jobs=12, max_nodes=3))
def test_no_starvation(name, case):
    jobs, cap, ctx = case
    dt, starve = 600.0, 3600.0
    policy = get_policy(name, starve_s=starve)
    worst = longest_waits(policy, jobs, cap, ctx, calls=40, dt=dt)
    bound = math.ceil(starve / dt) + len(jobs)
    assert all(w <= bound for w in worst.values()), (worst, bound)


@pytest.mark.parametrize("name", STARVATION_FREE)
@settings(PROFILE, max_examples=max(PROFILE.max_examples // 4, 5))
@given(case=instances(max_jobs=10, max_nodes=3))
def test_no_starvation_behind_hysteresis(name, case):
    """Behind hysteresis a job that is served holds its GPUs for its whole cool-down and
    lease, so each job ahead of a starving one may take ceil(max(cooldown, lease) / dt)
    decisions instead of one."""
    jobs, cap, ctx = case
    dt, starve, cooldown, lease = 600.0, 3600.0, 1800.0, 10.0
    policy = Hysteresis(get_policy(name, starve_s=starve), min_gain=0.05, cooldown_s=cooldown,
                        min_run_restarts=lease)
    worst = longest_waits(policy, jobs, cap, ctx, calls=40, dt=dt)
    hold = max(cooldown, lease * float(jobs.restart_cost.max(initial=0.0)))
    bound = math.ceil(starve / dt) + len(jobs) * max(1, math.ceil(hold / dt)) + 1
    assert all(w <= bound for w in worst.values()), (worst, bound)
