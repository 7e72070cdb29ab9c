"""`cycle_changed`: only the jobs whose inputs changed are estimated again."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators import (
    EstimatorState,
    ProgressBatch,
    ThroughputParams,
    WorkHistory,
    candidate_grid,
    cycle,
)
from malleable.estimators.incremental import (
    REMAINING_FLAGS,
    SETTLE_TOL,
    cycle_changed,
    take_prior,
    take_specs,
)
from malleable.estimators.params import EstimateFlags, ThroughputPrior
from malleable.estimators.pipeline import estimate, speedup_table
from malleable.estimators.state import update
from tests.unit.test_estimators_state import batch_of, job_samples, specs_for

P = ThroughputParams(alpha_c=0.05, beta_c=0.004, alpha_r=0.02, beta_r=0.002,
                     alpha_n=0.08, beta_n=0.01, gamma=1.5)
K = candidate_grid(np.array([16, 16, 16, 16]), 4, 16)
_Z = np.zeros(0)
EMPTY = ProgressBatch(job=_Z.astype(np.int64), t=_Z, step=_Z, samples=_Z, gpus=_Z, nodes=_Z,
                      batch=_Z)


def _samples(jobs, t0=0.0, count=6):
    return batch_of(*[job_samples(j, [(1 + j % 3, 1, 64, count), (2, 1, 128, count)],
                                  params=P, t0=t0, noise=0.05, rng=np.random.default_rng(j))
                      for j in jobs])


def _settle(state, specs, memo, cycles=30, **kw):
    """Cycles without new samples until every row's fit has settled."""
    for _ in range(cycles):
        state, est, table, memo = cycle_changed(state, EMPTY, specs, K, 4, memo=memo, **kw)
        if memo.settled.all():
            return state, est, table, memo
    raise AssertionError(f"fits not settled after {cycles} cycles: {memo.settled}")


def _first(J=4, **spec):
    """J jobs, the last without samples, after their fits settled."""
    specs = specs_for(J, 64.0, max_gpus=np.full(J, 16, np.int64), **spec)
    state, est, table, memo = cycle_changed(EstimatorState.empty(J), _samples(range(J - 1)),
                                            specs, K, 4)
    assert not memo.settled.any()      # a first fit has nothing to compare with
    return (specs, *_settle(state, specs, memo))


def test_without_a_memo_it_is_cycle():
    specs = specs_for(3, 64.0, max_gpus=np.full(3, 16, np.int64))
    b = _samples([0, 2])
    s1, e1, t1 = cycle(EstimatorState.empty(3), b, specs, K, 4)
    s2, e2, t2, memo = cycle_changed(EstimatorState.empty(3), b, specs, K, 4)
    for a, c in zip(e1, e2, strict=True):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(t1.goodput, t2.goodput)
    np.testing.assert_array_equal(s1.u, s2.u)
    assert memo.valid.all()


def test_jobs_with_new_samples_get_the_full_estimate_and_the_others_keep_theirs():
    specs, state, est0, table0, memo = _first()
    b = _samples([1], t0=10_000.0, count=3)
    state2, est, table, _ = cycle_changed(state, b, specs, K, 4, memo=memo)
    # Row 1 as a fit of every job over the same state would give it.
    full = estimate(update(state, b, specs), specs)
    np.testing.assert_allclose(est.u[1], full.u[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(table.goodput[1],
                               speedup_table(full, specs, K, 4).goodput[1], rtol=1e-12)
    assert not np.array_equal(est.u[1], est0.u[1])
    # Rows 0, 2 (samples before, none now) and 3 (never any) keep theirs, bit for bit.
    for r in (0, 2, 3):
        assert est.u[r].tolist() == est0.u[r].tolist()
        assert est.cov[r].tolist() == est0.cov[r].tolist()
        assert table.goodput[r].tolist() == table0.goodput[r].tolist()
    np.testing.assert_array_equal(state2.u, est.u)   # the next fit starts from these


def test_a_refit_without_new_samples_would_have_moved_the_estimate():
    """Why the rows are kept: `cycle` fits again from the last fit and moves it."""
    specs, state, est0, _, memo = _first()
    _, again, _ = cycle(state, EMPTY, specs, K, 4)
    kept = cycle_changed(state, EMPTY, specs, K, 4, memo=memo)[1]
    assert kept.u.tolist() == est0.u.tolist()
    assert not np.array_equal(again.u[:3], est0.u[:3])


def test_a_changed_spec_or_prior_row_is_estimated_again():
    specs, state, est0, _, memo = _first()
    bigger = specs_for(4, 64.0, max_gpus=np.array([16, 16, 8, 16], np.int64))
    _, est, table, memo2 = cycle_changed(state, EMPTY, bigger, K, 4, memo=memo)
    assert table.feasible[2, K > 8].sum() == 0 and table.feasible[0, K > 8].any()
    assert est.u[0].tolist() == est0.u[0].tolist()
    mean = ThroughputParams(*(np.full(4, v) for v in (0.1, 0.008, 0.04, 0.004, 0.16, 0.02,
                                                       1.5)))
    prior = ThroughputPrior(mean, np.full((4, 7), 0.3), np.array([False, False, False, True]))
    _, est2, _, _ = cycle_changed(state, EMPTY, bigger, K, 4, prior=prior, memo=memo2)
    full = estimate(state, bigger, prior=prior)
    # Every row's prior row changed (from no prior at all to rows of one), so all are
    # estimated again; row 3, with no samples, now sits on the supplied prior.
    np.testing.assert_allclose(est2.u, full.u, rtol=1e-12, atol=1e-12)
    assert est2.flags[3] & int(EstimateFlags.PRIOR_SUPPLIED)
    sub = take_prior(prior, np.array([3, 0]))
    assert sub.given.tolist() == [True, False] and sub.log_sd.shape == (2, 7)


def test_new_history_updates_the_remaining_work_of_jobs_without_a_target():
    target = np.array([np.nan, 5e5, np.nan, np.nan])
    specs, state, est0, table0, memo = _first(target_samples=target)
    history = WorkHistory(np.array([2e5, 3e5, 4e5, 6e5, 8e5]))
    _, est, table, _ = cycle_changed(state, EMPTY, specs, K, 4, history=history, memo=memo)
    full = estimate(state, specs, history=history)
    np.testing.assert_allclose(est.remaining_work, full.remaining_work, rtol=1e-12)
    np.testing.assert_array_equal(est.flags, full.flags)
    np.testing.assert_array_equal(table.remaining_work, est.remaining_work)
    assert est.flags[0] & int(EstimateFlags.REMAINING_HISTORY)
    assert not est0.flags[0] & int(EstimateFlags.REMAINING_HISTORY)
    assert est.remaining_work[1] == est0.remaining_work[1]      # declared: no history
    assert est.u.tolist() == est0.u.tolist()                     # the fits stay
    assert table.goodput.tolist() == table0.goodput.tolist()
    assert (est.flags & ~REMAINING_FLAGS).tolist() == (est0.flags & ~REMAINING_FLAGS).tolist()


def test_another_grid_gives_every_row_a_new_table_from_the_same_fits():
    specs, state, est0, _, memo = _first()
    k2 = candidate_grid(np.array([8, 8, 8, 8]), 4, 8)
    _, est, table, memo2 = cycle_changed(state, EMPTY, specs, k2, 4, memo=memo)
    assert table.goodput.shape == (4, k2.shape[0])
    np.testing.assert_array_equal(memo2.k, k2)
    assert est.u.tolist() == est0.u.tolist()           # a fit does not depend on the grid
    want = speedup_table(est0, specs, k2, 4)
    np.testing.assert_array_equal(table.goodput, want.goodput)
    np.testing.assert_array_equal(table.feasible, want.feasible)


def test_fits_are_repeated_until_they_settle_then_kept():
    """A fit stops after a few iterations: the rows are fitted again, cycle after
    cycle, until a fit moves u by at most SETTLE_TOL; from then on they are kept."""
    specs = specs_for(3, 64.0, max_gpus=np.full(3, 16, np.int64))
    state, est, _, memo = cycle_changed(EstimatorState.empty(3), _samples([0, 1, 2]), specs,
                                        K, 4)
    moves = []
    for _ in range(30):
        before = est.u
        state, est, _, memo = cycle_changed(state, EMPTY, specs, K, 4, memo=memo)
        moves.append(float(np.abs(est.u - before).max()))
        if memo.settled.all():
            break
    assert memo.settled.all() and moves[-1] <= SETTLE_TOL
    assert moves[0] > 0.0              # the second cycle fitted again (not settled yet)
    kept = cycle_changed(state, EMPTY, specs, K, 4, memo=memo)[1]
    assert kept.u.tolist() == est.u.tolist()
    # Where `cycle`, fitting every cycle, ends up: close to the settled fit.
    s2 = state
    for _ in range(40):
        s2, full, _ = cycle(s2, EMPTY, specs, K, 4)
    np.testing.assert_allclose(est.u, full.u, atol=0.05)


def test_memo_rows_follow_a_reordering_and_new_rows_are_estimated():
    specs, state, est0, _, memo = _first()
    order = np.array([2, 0])
    moved = memo.take(np.array([2, 0, -1]))
    assert moved.valid.tolist() == [True, True, False]
    new_state = EstimatorState.concat([state.take(order), EstimatorState.empty(1)])
    specs3 = take_specs(specs, np.array([2, 0, 3]))
    _, est, _, _ = cycle_changed(new_state, EMPTY, specs3, K, 4, memo=moved)
    assert est.u[0].tolist() == est0.u[2].tolist() and est.u[1].tolist() == est0.u[0].tolist()
    assert est.flags[2] & int(EstimateFlags.NO_SAMPLES)
    with pytest.raises(IndexError):
        memo.take(np.array([7]))
