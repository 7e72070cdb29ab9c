"""The shared feasibility repair: the packer and the rounding of wishes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.policies.base import Capacity
from malleable.policies.feasibility import Grid, Packer, order_from_keys, realize
from malleable.policies.synthetic import make_jobset, power_law
from tests.unit.policy_cases import PROFILE, packs_exactly


def jobs_on(cap, J, **kw):
    return make_jobset(cap, power_law, np.full(J, 0.8), np.ones(J), np.full(J, 1000.0), **kw)


def test_packer_best_fit_keeps_whole_nodes_whole():
    pk = Packer(4, np.array([4, 4, 1, 3]))
    assert pk.cap() == 8
    assert pk.place(0, 1)            # best fit: the node with 1 free, not a whole node
    assert pk.free == [4, 4, 0, 3]
    assert pk.place(1, 2)            # the node with 3 free
    assert pk.free == [4, 4, 0, 1]
    assert pk.place(2, 8)            # two whole nodes
    assert pk.free == [0, 0, 0, 1] and pk.cap() == 1
    assert not pk.place(3, 2) and pk.free == [0, 0, 0, 1]
    assert not pk.place(4, 6)        # not a multiple of g: never placed
    with pytest.raises(ValueError, match="already placed"):
        pk.place(0, 1)


def test_packer_resize_restores_on_failure():
    pk = Packer(4, np.array([4, 4]))
    assert pk.place(0, 3) and pk.place(1, 4)
    before = (list(pk.free), dict(pk.where))
    assert not pk.resize(0, 8)
    assert (pk.free, pk.where) == before
    assert pk.resize(0, 4) and pk.size(0) == 4 and pk.cap() == 0


@settings(PROFILE, max_examples=100)
@given(g=st.sampled_from([1, 2, 4, 8]), free=st.lists(st.integers(0, 8), min_size=1, max_size=8),
       sizes=st.lists(st.integers(1, 24), min_size=1, max_size=12))
def test_packer_is_sound_and_cap_without_is_exact(g, free, sizes):
    free = np.minimum(np.asarray(free), g)
    pk = Packer(g, free)
    placed = {}
    for j, k in enumerate(sizes):
        k = k if k <= g else (k // g) * g
        if pk.place(j, k):
            placed[j] = k
    gpus = np.array(list(placed.values()), dtype=np.int64)
    cap = Capacity(g, free)
    assert packs_exactly(gpus, cap)
    used = np.zeros(len(free), dtype=np.int64)
    for spots in pk.placement().values():
        for node, n in spots:
            used[node] += n
    assert np.array_equal(used + np.asarray(pk.free), free)   # bookkeeping adds up
    for j in placed:
        predicted = pk.cap_without(j)
        old = pk.remove(j)
        assert pk.cap() == predicted
        pk.restore(j, old)


def test_largest_remainder_rounding_loses_no_gpu():
    cap = Capacity.uniform(1, 8)
    jobs = jobs_on(cap, 3)
    gpus = realize(jobs, cap, np.array([2.7, 3.3, 2.0]), np.arange(3))
    assert gpus.tolist() == [3, 3, 2]


@settings(PROFILE, max_examples=100)
@given(shares=st.lists(st.floats(0.001, 1.0), min_size=1, max_size=20),
       N=st.integers(1, 64))
def test_rounding_one_gpu_nodes_uses_every_gpu(shares, N):
    """On one-GPU nodes with min 1 and step 1 nothing blocks packing: every GPU is used."""
    cap = Capacity.uniform(N, 1)
    J = len(shares)
    jobs = jobs_on(cap, J)
    wish = np.asarray(shares) / np.sum(shares) * N
    gpus = realize(jobs, cap, wish, order_from_keys(-wish))
    assert gpus.sum() == min(N, J * N)
    assert np.all(np.abs(gpus - wish) < 1.0 + 1e-9)   # each job within one GPU of its wish


def test_node_granularity_and_value_fill():
    cap = Capacity.uniform(4, 4)
    jobs = jobs_on(cap, 2, max_gpus=np.array([16, 16]))
    # 5.3 GPUs is not a legal size on 4-GPU nodes: 4; the leftover goes where it helps most.
    value = -jobs.table.remaining_time
    gpus = realize(jobs, cap, np.array([5.3, 2.0]), np.arange(2), fill="value", value=value)
    assert gpus.sum() == 16 and set(gpus.tolist()) <= set(jobs.table.k.tolist())
    assert packs_exactly(gpus, cap)
    none = realize(jobs, cap, np.array([5.3, 2.0]), np.arange(2))
    assert none.tolist() == [4, 2]


def test_exact_and_blocking_follow_plain_slurm():
    cap = Capacity.uniform(1, 8)
    jobs = jobs_on(cap, 3)
    exact = np.array([True, True, True])
    wish = np.array([6.0, 4.0, 2.0])
    assert realize(jobs, cap, wish, np.arange(3), exact=exact).tolist() == [6, 0, 2]
    assert realize(jobs, cap, wish, np.arange(3), exact=exact, blocking=True).tolist() == [6, 0, 0]
    assert realize(jobs, cap, wish, np.arange(3)).tolist() == [6, 2, 0]


def test_level_fill_equalises():
    cap = Capacity.uniform(1, 8)
    jobs = jobs_on(cap, 3)
    gpus = realize(jobs, cap, np.zeros(3), np.arange(3), fill="level")
    assert sorted(gpus.tolist()) == [2, 3, 3]


def test_bad_wish_and_fill_are_rejected():
    cap = Capacity.uniform(1, 8)
    jobs = jobs_on(cap, 2)
    with pytest.raises(ValueError, match="wish"):
        realize(jobs, cap, np.array([1.0, np.nan]), np.arange(2))
    with pytest.raises(ValueError, match="fill = 'most'"):
        realize(jobs, cap, np.ones(2), np.arange(2), fill="most")
    with pytest.raises(ValueError, match="value matrix"):
        realize(jobs, cap, np.ones(2), np.arange(2), fill="value")


def test_grid_fastest_is_the_best_feasible_column_and_capped_drops_the_rest():
    cap = Capacity.uniform(2, 4)
    jobs = jobs_on(cap, 3, max_gpus=np.array([8, 8, 2]))
    grid = Grid.build(jobs, cap)
    k = grid.klist
    assert k == [0, 1, 2, 3, 4, 8]
    goodput = np.array([[0, 1, 2, 3, 2.5, 1],      # peaks at 3 GPUs
                        [0, 1, 2, 2, 2, 2],        # ties from 2 GPUs: the smallest
                        [0, 1, 2, 9, 9, 9]])       # 3 and more are not feasible for it
    best = grid.fastest(goodput)
    assert [k[c] for c in best] == [3, 2, 2]
    capped = grid.capped(best)
    allowed = [[kk for kk, ok in zip(k, row, strict=True) if ok] for row in capped.mask]
    assert allowed == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2]]
    assert capped.top == best.tolist()
    assert capped.nxt[0][3] == -1 and capped.prev[0][5] == 3
    # NaN goodput is the lowest; NaN everywhere: the largest feasible column.
    nan = np.array([[0, np.nan, 1, 2, np.nan, 1], [np.nan] * 6, [0, np.nan, np.nan, 1, 1, 1]])
    assert [k[c] for c in grid.fastest(nan)] == [3, 8, 2]   # (job 2: 1 and 2 are NaN)
    # A job with no feasible size above 0 stays at column 0.
    none = Grid.build(jobs_on(cap, 1, min_gpus=np.array([16]), max_gpus=np.array([16])), cap)
    assert none.fastest(np.ones((1, len(none.k)))).tolist() == [0]


def test_grid_respects_spec_and_capacity():
    cap = Capacity(4, np.array([4, 4, 2]))
    jobs = jobs_on(cap, 2, min_gpus=np.array([2, 1]), max_gpus=np.array([16, 3]),
                   step=np.array([2, 1]))
    grid = Grid.build(jobs, cap)
    allowed = [[k for k, ok in zip(grid.klist, row, strict=True) if ok] for row in grid.mask]
    assert allowed[0] == [0, 2, 4, 8]     # 12 and 16 need more whole nodes than exist
    assert allowed[1] == [0, 1, 2, 3]
