"""The speedup table's feasibility rules and grid (shared by estimators and policies)."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators.table import SpeedupTable, candidate_grid, feasible_mask


def test_grid_is_within_node_then_whole_nodes():
    assert candidate_grid(np.array([16, 3]), 4, 64).tolist() == [0, 1, 2, 3, 4, 8, 12, 16]
    assert candidate_grid(np.array([100]), 4, 12).tolist() == [0, 1, 2, 3, 4, 8, 12]
    assert candidate_grid(np.array([2]), 8, 64).tolist() == [0, 1, 2]


def test_feasible_mask_bounds_step_and_nodes():
    k = candidate_grid(np.array([16]), 4, 64)  # 0 1 2 3 4 8 12 16
    m = feasible_mask(k, np.array([2, 1, 1]), np.array([16, 3, 16]), np.array([4, 1, 2]), 4)
    allowed = [k[row].tolist() for row in m]
    assert allowed[0] == [0, 2, 4, 8, 12, 16]      # min 2 allowed, then multiples of 4
    assert allowed[1] == [0, 1, 2, 3]
    assert allowed[2] == [0, 1, 2, 4, 8, 12, 16]    # 3 is off-step; 6 is not whole nodes


def test_feasible_mask_rejects_bad_inputs():
    with pytest.raises(ValueError, match="gpus_per_node"):
        feasible_mask(np.array([0, 1]), np.array([1]), np.array([1]), np.array([1]), 0)
    with pytest.raises(ValueError, match="one shape"):
        feasible_mask(np.array([0, 1]), np.array([1, 1]), np.array([1]), np.array([1]), 4)


def test_table_shapes_and_remaining_time():
    k = np.array([0, 1, 2])
    t = SpeedupTable(k=k, feasible=np.ones((2, 3), bool),
                     goodput=np.array([[0, 1.0, 1.5], [0, 2.0, 4.0]]),
                     batch=np.array([[0, 32, 64], [0, 32, 64]]),
                     remaining_work=np.array([30.0, 8.0]), remaining_std=np.zeros(2))
    rt = t.remaining_time
    assert rt[0, 0] == np.inf and rt[0, 2] == pytest.approx(20.0) and rt[1, 1] == 4.0
    assert t.at(np.array([2, 1])).tolist() == [1.5, 2.0]
    with pytest.raises(ValueError, match="not on the candidate grid"):
        t.column(np.array([3, 1]))
    with pytest.raises(ValueError, match="batch must have shape"):
        SpeedupTable(k=k, feasible=np.ones((2, 3), bool), goodput=np.zeros((2, 3)),
                     batch=np.zeros((2, 2)), remaining_work=np.zeros(2), remaining_std=np.zeros(2))
