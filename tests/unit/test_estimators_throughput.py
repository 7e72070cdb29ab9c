"""The throughput model X(k, n, m): known values, fits, priors, uncertainty, recency."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators import (
    EstimateFlags,
    EstimatorConfig,
    EstimatorState,
    ThroughputParams,
    candidate_grid,
    cycle,
    estimate,
    fit_throughput,
    iteration_time,
    prior_from_finished,
    update,
)
from malleable.estimators.throughput import log_iteration_time, throughput
from tests.unit.test_estimators_state import batch_of, job_samples, specs_for

P = ThroughputParams(alpha_c=0.02, beta_c=0.004, alpha_r=0.05, beta_r=0.01, alpha_n=0.3,
                     beta_n=0.02, gamma=2.0)


def test_iteration_time_matches_hand_computation():
    k = np.array([1, 2, 4, 8])
    n = np.array([1, 1, 1, 2])
    m = np.array([32.0, 64.0, 128.0, 256.0])          # per-GPU batch 32 everywhere
    tc = 0.02 + 0.004 * 32                            # 0.148 s
    ts = np.array([0.0, 0.05, 0.05 + 0.01 * 2, 0.3 + 0.02 * 6])
    want = np.sqrt(tc ** 2 + ts ** 2)                  # gamma = 2
    np.testing.assert_allclose(iteration_time(P, k, n, m), want, rtol=1e-12)
    np.testing.assert_allclose(throughput(P, k, n, m), m / want, rtol=1e-12)


def test_gamma_near_one_adds_and_near_ten_takes_the_max():
    add = P._replace(gamma=1.0 + 1e-9)
    mx = P._replace(gamma=10.0 - 1e-9)
    tc, ts = 0.02 + 0.004 * 32, 0.05
    assert iteration_time(add, np.array([2]), np.array([1]), np.array([64.0]))[0] == \
        pytest.approx(tc + ts, rel=1e-6)
    assert iteration_time(mx, np.array([2]), np.array([1]), np.array([64.0]))[0] == \
        pytest.approx((tc ** 10 + ts ** 10) ** 0.1, rel=1e-6)


def test_jacobian_matches_finite_differences():
    rng = np.random.default_rng(0)
    u = rng.normal(-3, 1, (4, 7))
    k = rng.choice([1, 2, 3, 4, 8, 16], (4, 6))
    n = np.where(k > 4, k // 4, 1)
    m = k * rng.choice([8.0, 16.0, 32.0], (4, 6))
    _, jac = log_iteration_time(u, k, n, m, jacobian=True)
    num = np.zeros_like(jac)
    for i in range(7):
        d = np.zeros(7)
        d[i] = 1e-6
        num[..., i] = (log_iteration_time(u + d, k, n, m) - log_iteration_time(u - d, k, n, m)) / 2e-6
    np.testing.assert_allclose(jac, num, atol=1e-7)


def test_batched_fit_recovers_parameters_from_noiseless_configurations():
    cfgs = [(k, n, k * b) for k, n in ((1, 1), (2, 1), (4, 1), (8, 2), (16, 4))
            for b in (16.0, 32.0, 64.0)]
    k, n, m = (np.array([[c[i] for c in cfgs]], dtype=float) for i in range(3))
    y = log_iteration_time(P.to_u()[None], k, n, m)
    fit = fit_throughput(k, n, m, np.full_like(m, 20.0), y, np.zeros(1), np.full((1, 7), -2.0),
                         np.full((1, 7), 5.0), iterations=200)
    got = fit.params
    for name in P._fields:
        assert float(getattr(got, name)[0]) == pytest.approx(getattr(P, name), rel=0.02), name


def test_fitting_jobs_together_equals_fitting_each_alone():
    rng = np.random.default_rng(5)
    parts = [job_samples(j, [(1, 1, 32, 8), (2, 1, 64, 8), (4, 1, 128, 8)],
                         params=P._replace(alpha_c=0.01 * (j + 1)), noise=0.03, rng=rng)
             for j in range(3)]
    spec = specs_for(3, 32.0)
    together = estimate(update(EstimatorState.empty(3), batch_of(*parts), spec), spec)
    for j in range(3):
        alone_spec = specs_for(1, 32.0)
        p = dict(parts[j])
        p["job"] = [0] * len(p["job"])
        alone = estimate(update(EstimatorState.empty(1), batch_of(p), alone_spec), alone_spec)
        np.testing.assert_allclose(together.u[j], alone.u[0], rtol=1e-6, atol=1e-8)


def test_power_law_job_is_fitted_to_p_within_002():
    """Acceptance: samples that follow exactly X(k) = X1 * k^0.7 give p = 0.7 +- 0.02."""
    sched = [(k, 1 if k <= 4 else k // 4, 64.0 * k, 6) for k in (1, 2, 4, 8, 16)]
    b = batch_of(job_samples(0, sched, rate=lambda k, n, m: 500.0 * k ** 0.7))
    spec = specs_for(1, 64.0)
    state, est, table = cycle(EstimatorState.empty(1), b, spec,
                              candidate_grid(np.array([16]), 4, 16), 4)
    assert abs(est.power_p[0] - 0.7) < 0.02
    assert table.speedup_exponent[0] == pytest.approx(est.power_p[0])
    # The Pollux model fitted to the same samples reproduces the speedup too.
    ks = np.array([1, 2, 4, 8, 16])
    x = throughput(est.params, ks, np.where(ks <= 4, 1, ks // 4), 64.0 * ks)[0]
    np.testing.assert_allclose(x / x[0], ks ** 0.7, rtol=0.05)


def test_one_sample_gives_wider_uncertainty_than_fifty():
    """Acceptance: an estimate from one interval per configuration is less certain."""
    rng = np.random.default_rng(7)
    few = job_samples(0, [(1, 1, 64, 2), (2, 1, 128, 2)], params=P, noise=0.05, rng=rng)
    many = job_samples(1, [(1, 1, 64, 51), (2, 1, 128, 51)], params=P, noise=0.05, rng=rng)
    spec = specs_for(2, 64.0)
    k = candidate_grid(np.array([16, 16]), 4, 16)
    _, est, table = cycle(EstimatorState.empty(2), batch_of(few, many), spec, k, 4)
    rel = table.goodput_std / np.where(table.goodput > 0, table.goodput, 1)
    for col in (1, 2, 4, 6):                                # k = 1, 2 (seen), 4, 12 (unseen)
        assert rel[0, col] > rel[1, col]
    assert est.power_p_std[0] > est.power_p_std[1]


def test_recency_weighting_follows_a_drift():
    """A job whose iteration time doubles: newer samples dominate the estimate."""
    slow = P._replace(alpha_c=P.alpha_c * 2, beta_c=P.beta_c * 2)
    spec = specs_for(1, 32.0)

    def fitted_time(half_life):
        cfg = EstimatorConfig(half_life_s=half_life)
        a = job_samples(0, [(1, 1, 32, 60)], params=P)
        b = job_samples(0, [(1, 1, 32, 20)], params=slow, t0=a["t"][-1],
                        samples0=a["samples"][-1], steps0=a["step"][-1])
        st = update(EstimatorState.empty(1, cfg), batch_of(a, b), spec, cfg)
        est = estimate(st, spec, config=cfg)
        return float(iteration_time(est.params, np.array([1]), np.array([1]),
                                    np.array([32.0]))[0, 0])

    t_old = float(iteration_time(P, np.array([1]), np.array([1]), np.array([32.0]))[0])
    short, long_ = fitted_time(300.0), fitted_time(1e9)
    assert short == pytest.approx(2 * t_old, rel=0.05)      # 20 new intervals, 5 half-lives
    assert long_ < short                                     # no recency: mostly the old level
    assert long_ == pytest.approx(t_old * 2 ** (20 / 79), rel=0.05)   # geometric mean of intervals


def test_single_node_job_takes_cross_node_sync_from_the_supplied_prior():
    finished = P._replace(alpha_n=0.5, beta_n=0.03)
    prior = prior_from_finished(ThroughputParams(*(np.atleast_1d(v) for v in finished)),
                                np.array([0]), np.array([0]), min_log_sd=0.1)
    b = batch_of(job_samples(0, [(1, 1, 32, 10), (2, 1, 64, 10), (4, 1, 128, 10)], params=P))
    spec = specs_for(1, 32.0)
    est = estimate(update(EstimatorState.empty(1), b, spec), spec, prior=prior)
    assert est.flags[0] & EstimateFlags.PRIOR_SUPPLIED
    assert est.flags[0] & EstimateFlags.NO_MULTI_NODE
    assert float(est.params.alpha_n[0]) == pytest.approx(0.5, rel=0.01)
    assert float(est.params.alpha_r[0]) == pytest.approx(P.alpha_r, rel=0.1)


def test_prior_from_a_cross_node_only_job_does_not_overrule_the_jobs_own_samples():
    """A finished job that only ran across nodes cannot split compute from sync (gamma ~ 1).

    Its prior, with its posterior sd (`Estimates.log_sd`), must leave the new
    job's single-node samples in charge of what they show. With only the
    0.3 floor as sd, the unidentified compute time (far too small in the
    finished job's fit) overrules them: the job's own 1-GPU time is
    predicted about 10 times too short.
    """
    q = ThroughputParams(alpha_c=0.006, beta_c=2e-7, alpha_r=0.004, beta_r=0.001,
                         alpha_n=0.012, beta_n=0.0002, gamma=1.05)
    spec = specs_for(1, 256.0)
    cross = [(k, n, k * lb, 8) for k, n in ((2, 2), (3, 2), (6, 2), (12, 3), (24, 6), (48, 12))
             for lb in (256.0, 2048.0, 16384.0)]
    fb = batch_of(job_samples(0, cross, params=q, noise=0.05, rng=np.random.default_rng(1)))
    fin = estimate(update(EstimatorState.empty(1), fb, spec), spec)
    assert fin.log_sd.shape == (1, 7) and fin.log_sd[0, 2] > 0.5   # in-node sync: unknown
    own = [(k, 1, k * lb, 8) for k in (1, 2, 4) for lb in (256.0, 2048.0, 16384.0)]
    b = batch_of(job_samples(0, own, params=q, noise=0.05, rng=np.random.default_rng(2)))
    k, n, m = np.array([1, 2, 4, 1, 4]), np.ones(5), np.array([256.0, 512.0, 1024.0, 16384.0,
                                                                 65536.0])
    truth = iteration_time(q, k, n, m)

    def fitted(**kw):
        prior = prior_from_finished(fin.params, np.array([0]), np.array([0]), min_log_sd=0.3,
                                    **kw)
        est = estimate(update(EstimatorState.empty(1), b, spec), spec, prior=prior)
        return iteration_time(est.params, k, n, m)[0] / truth

    np.testing.assert_allclose(fitted(log_sd=fin.log_sd), 1.0, rtol=0.1)
    assert fitted()[0] < 0.5        # the overconfident prior: the failure this guards against


def test_params_round_trip_and_reject_out_of_domain_values():
    back = ThroughputParams.from_u(P.to_u())
    for name in P._fields:
        assert float(getattr(back, name)) == pytest.approx(getattr(P, name))
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        P._replace(alpha_c=0.0).to_u()
    with pytest.raises(ValueError, match="gamma must be in"):
        P._replace(gamma=11.0).to_u()
