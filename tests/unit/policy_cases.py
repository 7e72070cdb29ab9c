"""Helpers for the policy tests: random instances, an exact packing check, a call sequence.

The packing check here is independent of `malleable.policies.feasibility.Packer`:
an exhaustive bin-packing search, so a bug in the packer cannot hide itself.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cache

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from malleable.estimators.table import feasible_mask
from malleable.policies.base import Capacity, Context, JobSet, Policy
from malleable.policies.synthetic import random_instance

# Hypothesis profiles for the policy tests (applied per test, so other areas' tests are
# unaffected): "policies" keeps CI fast; MALLEABLE_POLICY_PROFILE=policies-thorough for more.
settings.register_profile("policies", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("policies-thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = settings.get_profile(os.environ.get("MALLEABLE_POLICY_PROFILE", "policies"))


def packs_exactly(gpus: np.ndarray, capacity: Capacity) -> bool:
    """True iff the allocation can be placed: multi-node jobs on whole free nodes,
    every sub-node job inside one node. Exhaustive (for small instances)."""
    g = capacity.gpus_per_node
    gpus = np.asarray(gpus, dtype=np.int64)
    free = sorted(int(x) for x in capacity.free_per_node)
    multi = gpus[gpus > g]
    if np.any(multi % g):
        return False
    need = int(multi.sum()) // g
    whole = [f for f in free if f == g]
    if need > len(whole):
        return False
    bins = [f for f in free if f != g] + whole[need:]
    items = tuple(sorted((int(x) for x in gpus if 0 < x <= g), reverse=True))
    if sum(items) > sum(bins):
        return False

    @cache
    def fit(i: int, bins_t: tuple[int, ...]) -> bool:
        if i == len(items):
            return True
        tried = set()
        for b, room in enumerate(bins_t):
            if room >= items[i] and room not in tried:
                tried.add(room)
                nb = list(bins_t)
                nb[b] = room - items[i]
                if fit(i + 1, tuple(sorted(nb))):
                    return True
        return False

    return fit(0, tuple(sorted(bins)))


def assert_valid(alloc, jobs: JobSet, capacity: Capacity) -> None:
    """Every invariant a policy promises, checked from first principles."""
    J = len(jobs)
    gpus = alloc.gpus
    assert gpus.shape == (J,) and gpus.dtype == np.int64
    assert alloc.batch.shape == (J,) and len(alloc.reason) == J
    assert all(isinstance(r, str) and r for r in alloc.reason)
    g = capacity.gpus_per_node
    run = gpus > 0
    assert np.all(gpus >= 0)
    assert np.all(gpus[run] >= jobs.min_gpus[run]), "below min"
    assert np.all(gpus[run] <= jobs.max_gpus[run]), "above max"
    on_step = (gpus == jobs.min_gpus) | (gpus % jobs.step == 0)
    assert np.all(on_step[run]), "off step"
    assert np.all(((gpus <= g) | (gpus % g == 0))[run]), "not node granular"
    assert np.all(np.isin(gpus, jobs.table.k)), "not on the table's grid"
    mask = feasible_mask(jobs.table.k, jobs.min_gpus, jobs.max_gpus, jobs.step, g)
    assert np.all(mask[np.arange(J), jobs.table.column(gpus)])
    assert int(gpus.sum()) <= capacity.total, "over capacity"
    assert packs_exactly(gpus, capacity), f"does not pack: {gpus.tolist()} into " \
                                          f"{capacity.free_per_node.tolist()} (g={g})"
    assert np.all(alloc.batch[~run] == 0) and np.all(alloc.batch[run] > 0)


@st.composite
def instances(draw, max_jobs: int = 10, max_nodes: int = 5):
    """(JobSet, Capacity, Context): small random clusters (exact packing is checkable)."""
    g = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.integers(0, max_nodes))
    J = draw(st.integers(1, max_jobs))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    jobs, cap = random_instance(rng, J, nodes, g, max_choices=(1, 2, 3, 4, 8, 16))
    hist = rng.lognormal(9.0, 1.5, size=draw(st.sampled_from([0, 3, 40])))
    return jobs, cap, Context(now=0.0, seed=seed, size_history=hist)


def copy_arrays(jobs: JobSet) -> dict:
    """A deep copy of every array of a JobSet (to check a policy does not mutate it)."""
    out = {f: np.array(getattr(jobs, f), copy=True) for f in (
        "min_gpus", "max_gpus", "step", "current", "attained", "age", "restart_cost",
        "since_change", "weight", "requested", "restarts")}
    out["goodput"] = jobs.table.goodput.copy()
    out["remaining_work"] = jobs.table.remaining_work.copy()
    return out


def advance(jobs: JobSet, gpus: np.ndarray, dt: float) -> tuple[JobSet, np.ndarray]:
    """The job set dt seconds after applying ``gpus``: service, work, age and
    since_change advance; finished jobs are dropped.

    Returns:
        (next JobSet, mask of the jobs of ``jobs`` that are still present).
    """
    t = jobs.table
    rate = t.at(gpus)
    work = np.maximum(t.remaining_work - rate * dt, 0.0)
    changed = gpus != jobs.current
    since = np.where(changed, dt, jobs.since_change + dt)
    keep = work > 0
    moved = replace(jobs, current=gpus, attained=jobs.attained + gpus * dt, age=jobs.age + dt,
                    since_change=since, restarts=jobs.restarts + ((jobs.current > 0) & changed),
                    table=replace(t, remaining_work=work))
    nxt = moved.subset(keep)
    return nxt, keep


def longest_waits(policy: Policy, jobs: JobSet, capacity: Capacity, ctx: Context, calls: int,
                  dt: float) -> dict[str, int]:
    """Run ``calls`` decisions dt seconds apart; per job id that could ever run,
    the longest run of consecutive decisions that left it without GPUs while it
    had work left. Every allocation along the way is also checked valid."""
    from malleable.policies.feasibility import Grid

    can = set(jobs.ids[np.asarray(Grid.build(jobs, capacity).top) > 0].tolist())
    streak: dict[str, int] = {i: 0 for i in can}
    worst: dict[str, int] = {i: 0 for i in can}
    for _ in range(calls):
        if len(jobs) == 0:
            break
        alloc = policy.allocate(jobs, capacity, ctx)
        assert_valid(alloc, jobs, capacity)
        for jid, k in zip(jobs.ids.tolist(), alloc.gpus.tolist(), strict=True):
            if jid in can:
                streak[jid] = 0 if k > 0 else streak[jid] + 1
                worst[jid] = max(worst[jid], streak[jid])
        jobs, _ = advance(jobs, alloc.gpus, dt)
    return worst
