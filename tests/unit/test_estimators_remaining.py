"""Remaining work: declared targets, learning curves, and finished jobs' history."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators import (
    CurveStats,
    EstimateFlags,
    EstimatorConfig,
    EstimatorState,
    WorkHistory,
    estimate,
    predict_target,
    remaining_from_history,
    update,
)
from malleable.estimators.learning_curve import add_points
from tests.unit.test_estimators_state import batch_of, job_samples, specs_for

F = EstimateFlags
ALPHAS = np.asarray(EstimatorConfig().curve_exponents)


def curve_stats(p, y):
    return add_points(CurveStats.empty(1, ALPHAS.size), np.zeros(len(p), np.int64),
                      np.asarray(p, float), np.asarray(y, float), ALPHAS)


def test_declared_targets_give_exact_remaining_work():
    spec = specs_for(4, 32.0, target_samples=np.array([1e6, np.nan, np.nan, 5e5]),
                     target_epochs=np.array([np.nan, 10.0, np.nan, 3.0]),
                     samples_per_epoch=np.array([np.nan, 5e4, np.nan, 1e5]),
                     target_steps=np.array([np.nan, np.nan, 1000.0, np.nan]))
    assert spec.declared_work().tolist() == [1e6, 5e5, 32000.0, 5e5]   # samples first
    parts = [job_samples(j, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0) for j in range(4)]
    st = update(EstimatorState.empty(4), batch_of(*parts), spec)
    est = estimate(st, spec)
    done = st.progress
    np.testing.assert_allclose(est.remaining_work, np.maximum(spec.declared_work() - done, 0))
    assert est.remaining_std.tolist() == [0.0] * 4
    assert np.all(est.flags & F.REMAINING_EXACT)
    assert est.remaining_work[2] == pytest.approx(2000.0)   # 1000 steps x 32 - 30,000 done


def test_a_step_target_counts_the_jobs_own_steps_at_the_batch_it_logs():
    """target_steps=2000 with a spec batch of 64, and a job that logs batch 256: at
    step 500 a quarter of its steps are done (the target converted at the spec's
    batch, 128,000 samples, said none were left). Without gradient statistics E = 1,
    so what is left is 1,500 steps of 256 samples."""
    spec = specs_for(1, 64.0, target_steps=np.array([2000.0]))
    part = job_samples(0, [(1, 1, 256, 5)], rate=lambda k, n, m: 256.0 / 60 * 100)
    st = update(EstimatorState.empty(1), batch_of(part), spec)
    assert st.last[0, 1] == pytest.approx(500.0)          # 100 steps a minute, 5 minutes
    est = estimate(st, spec)
    assert est.remaining_work[0] == pytest.approx(1500 * 256.0)
    assert est.flags[0] & F.REMAINING_EXACT


def test_history_gives_the_conditional_expectation_of_what_is_left():
    hist = WorkHistory(np.array([10.0, 20.0, 30.0, 40.0, 100.0, 200.0]),
                       np.array([1, 1, 1, 1, 2, 2]))
    r = remaining_from_history(np.array([15.0, 0.0, 35.0, 150.0]), np.array([1, 1, 1, -1]), hist,
                               min_tail=2)
    # Group 1, a = 15: totals 20, 30, 40 -> mean 30 - 15; sd of (20, 30, 40).
    assert r.mean[0] == pytest.approx(15.0) and r.std[0] == pytest.approx(np.std([20, 30, 40]))
    assert r.mean[1] == pytest.approx(25.0) and r.count[1] == 4
    # Group 1 has only 40 above 35: the whole history (40, 100, 200) is used.
    assert r.mean[2] == pytest.approx(np.mean([40, 100, 200]) - 35) and r.count[2] == 3
    # Whole history above 150: only 200 -> too few.
    assert not r.ok[3] and np.isnan(r.mean[3])


def test_no_target_and_no_history_falls_back_to_attained_work():
    spec = specs_for(2, 32.0)
    st = update(EstimatorState.empty(2),
                batch_of(job_samples(0, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0)), spec)
    est = estimate(st, spec, config=EstimatorConfig(default_total_work=1234.0))
    assert est.remaining_work[0] == pytest.approx(st.progress[0])
    assert est.remaining_std[0] == pytest.approx(st.progress[0])
    assert est.remaining_work[1] == 1234.0                   # nothing at all: the default
    assert np.all(est.flags & F.REMAINING_DEFAULT)


def power_curve(p, a=0.9, b=-0.5, alpha=0.5, ps=1e4):
    return a + b * (np.asarray(p) / ps) ** -alpha


def test_learning_curve_predicts_when_an_exact_power_law_reaches_its_target():
    p = np.linspace(1e4, 3e5, 30)
    target = 0.85                       # 0.9 - 0.5 (p/1e4)^-0.5 = 0.85 at p = 1e6
    pred = predict_target(curve_stats(p, power_curve(p)), ALPHAS, np.array([target]),
                          np.array([1]), np.array([p[-1]]))
    assert pred.fitted[0] and pred.p_reach[0] > 0.99
    assert pred.progress[0] == pytest.approx(1e6, rel=0.03)
    assert pred.asymptote[0] == pytest.approx(0.9, abs=0.01)


def test_falling_metric_with_direction_minus_one():
    p = np.linspace(1e4, 3e5, 30)
    loss = 2.0 + 3.0 * (p / 1e4) ** -0.7
    target = 2.0 + 3.0 * (1e6 / 1e4) ** -0.7
    pred = predict_target(curve_stats(p, loss), ALPHAS, np.array([target]), np.array([-1]),
                          np.array([p[-1]]))
    assert pred.progress[0] == pytest.approx(1e6, rel=0.05)


def test_curve_estimate_from_few_points_is_wider_than_from_many():
    """Acceptance (remaining work): fewer metric samples, wider uncertainty."""
    rng = np.random.default_rng(2)
    stds = []
    for count in (4, 50):
        p = np.linspace(1e4, 3e5, count)
        y = power_curve(p) + rng.normal(0, 0.003, count)
        pred = predict_target(curve_stats(p, y), ALPHAS, np.array([0.85]), np.array([1]),
                              np.array([3e5]))
        assert pred.fitted[0] and np.isfinite(pred.progress[0])
        stds.append(pred.progress_std[0])
    assert stds[0] > stds[1] > 0


def test_target_reached_and_target_unreachable_and_too_short():
    spec = specs_for(3, 32.0, target_metric=np.array([0.5, 0.99, 0.85]))
    metric = lambda s: float(power_curve(s))          # noqa: E731 - asymptote 0.9
    parts = [job_samples(0, [(1, 1, 32, 30)], rate=lambda k, n, m: 100.0, metric=metric,
                         interval=100.0),
             job_samples(1, [(1, 1, 32, 30)], rate=lambda k, n, m: 100.0, metric=metric,
                         interval=100.0),
             job_samples(2, [(1, 1, 32, 2)], rate=lambda k, n, m: 100.0, metric=metric,
                         interval=100.0)]
    est = estimate(update(EstimatorState.empty(3), batch_of(*parts), spec), spec)
    assert est.flags[0] & F.TARGET_REACHED and est.remaining_work[0] == 0.0
    assert est.flags[1] & F.TARGET_UNREACHABLE and est.flags[1] & F.REMAINING_DEFAULT
    assert est.flags[2] & F.CURVE_TOO_SHORT
    assert np.all(np.isfinite(est.remaining_work)) and np.all(est.remaining_std >= 0)


def test_metric_target_end_to_end_through_the_state():
    spec = specs_for(1, 32.0, target_metric=np.array([0.85]))
    # 100 samples/s, a metric every interval; the power law's scale is 1e4 samples.
    b = batch_of(job_samples(0, [(1, 1, 32, 40)], rate=lambda k, n, m: 100.0, interval=60.0,
                             metric=lambda s: float(power_curve(s))))
    st = update(EstimatorState.empty(1), b, spec)
    est = estimate(st, spec)
    assert est.flags[0] & F.REMAINING_CURVE
    # p_s is the first metric's progress (6,000), the curve is the same function.
    assert est.remaining_work[0] == pytest.approx(1e6 - st.progress[0], rel=0.05)
