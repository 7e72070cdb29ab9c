"""Statistical efficiency, the gradient noise scale and the goodput-optimal batch size."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators import ThroughputParams, noise_scale, optimal_batch
from malleable.estimators.efficiency import efficiency
from malleable.estimators.throughput import throughput

P = ThroughputParams(alpha_c=0.02, beta_c=0.004, alpha_r=0.05, beta_r=0.01, alpha_n=0.3,
                     beta_n=0.02, gamma=2.0)


def test_efficiency_matches_hand_computed_values():
    """Acceptance: E(m) = (phi + m0) / (phi + m)."""
    # phi = 96, m0 = 32: E(32) = 1, E(128) = 128/224, E(1024) = 128/1120.
    np.testing.assert_allclose(efficiency(np.array([32.0, 128.0, 1024.0]), 32.0, 96.0),
                               [1.0, 128 / 224, 128 / 1120], rtol=1e-15)
    assert efficiency(64.0, 32.0, 0.0) == pytest.approx(0.5)        # no noise: m0/m
    assert efficiency(4096.0, 32.0, 1e12) == pytest.approx(1.0)     # pure noise: no loss
    assert efficiency(64.0, 32.0, np.nan) == 1.0                     # unknown phi


def test_noise_scale_is_reference_batch_times_variance_over_square():
    # McCandlish et al. 2018: B_simple = tr(Sigma)/|G|^2 = b * grad_var(b) / grad_sqr.
    assert noise_scale(2.0, 6.0, 32.0) == pytest.approx(96.0)
    assert noise_scale(4.0, 1.0, 128.0) == pytest.approx(32.0)
    bad = noise_scale(np.array([0.0, -1.0, 1.0, np.nan]), np.array([1.0, 1.0, -1.0, 1.0]), 32.0)
    assert np.all(np.isnan(bad))


def test_efficiency_equals_pollux_gain_over_scale():
    # adaptdl/Pollux write E as gain/scale with scale = m/m0 and
    # gain = (var + sqr) / (var/scale + sqr), var normalised to m0.
    sqr, var, m0 = 0.37, 2.9, 64.0
    m = np.array([64.0, 100.0, 256.0, 2048.0])
    scale = m / m0
    pollux = (var + sqr) / (var / scale + sqr) / scale
    np.testing.assert_allclose(efficiency(m, m0, noise_scale(sqr, var, m0)), pollux, rtol=1e-12)


def _brute_force(u, k, n, m0, mb, ml, phi):
    ms = np.arange(max(m0, k), min(mb, k * ml) + 1, dtype=float)
    params = ThroughputParams.from_u(u)
    gp = throughput(params, np.full(ms.shape, k), np.full(ms.shape, n), ms) * \
        efficiency(ms, m0, phi)
    return gp.max()


def test_optimal_batch_is_close_to_the_brute_force_optimum_and_within_limits():
    u = P.to_u()[None]
    k = np.array([0, 1, 2, 4, 8, 16])
    n = np.array([1, 1, 1, 1, 2, 4])
    for phi, mb, ml in ((50.0, 2048.0, np.inf), (500.0, 4096.0, 96.0), (5000.0, 1024.0, 40.0)):
        gp, batch, x = optimal_batch(u, k, n, np.array([32.0]), np.array([mb]), np.array([ml]),
                                     np.array([phi]), candidates=16)
        assert gp[0, 0] == 0 and batch[0, 0] == 0
        for c in range(1, len(k)):
            best = _brute_force(u[0], k[c], n[c], 32.0, mb, ml, phi)
            assert gp[0, c] >= 0.99 * best
            assert gp[0, c] <= best * (1 + 1e-6)      # float32 overlap factor
            assert 32 <= batch[0, c] <= min(mb, k[c] * ml)
            assert x[0, c] == pytest.approx(float(throughput(P, k[c:c + 1], n[c:c + 1],
                                                             batch[0, c:c + 1].astype(float))[0]))


def test_optimal_batch_grows_with_the_noise_scale():
    u = P.to_u()[None]
    k = np.array([4])
    n = np.array([1])
    batches = [optimal_batch(u, k, n, np.array([32.0]), np.array([8192.0]), np.array([np.inf]),
                             np.array([phi]))[1][0, 0] for phi in (10.0, 100.0, 1000.0, 10000.0)]
    assert batches == sorted(batches) and batches[0] < batches[-1]


def test_unknown_phi_keeps_the_smallest_batch_that_fits_and_limits_can_exclude_k():
    u = P.to_u()[None]
    k = np.array([0, 1, 8, 64])
    n = np.array([1, 1, 2, 16])
    gp, batch, _ = optimal_batch(u, k, n, np.array([32.0]), np.array([4096.0]),
                                 np.array([np.inf]), np.array([np.nan]))
    assert batch[0].tolist() == [0, 32, 32, 64]          # 64 GPUs need at least 64 samples
    gp, batch, _ = optimal_batch(u, k, n, np.array([256.0]), np.array([4096.0]),
                                 np.array([16.0]), np.array([100.0]))
    assert batch[0, 1] == 0 and gp[0, 1] == 0             # 1 GPU x 16 < m0 = 256
    assert batch[0, 2] == 0 and gp[0, 2] == 0             # 8 GPUs x 16 = 128 < 256
    assert 256 <= batch[0, 3] <= 64 * 16 and gp[0, 3] > 0
