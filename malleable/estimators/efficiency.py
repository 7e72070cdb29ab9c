"""Statistical efficiency E(m), goodput X * E, and the goodput-optimal batch size.

Gradient noise scale. McCandlish et al., "An Empirical Model of Large-Batch
Training" (arXiv:1812.06162, 2018), section 2.2, eq. 2.8: the simple noise
scale is ``B_simple = tr(Sigma) / |G|^2`` with ``G`` the true gradient and
``Sigma`` the per-example gradient covariance. A mini-batch of b samples has
gradient covariance ``Sigma / b``; so if a job reports ``grad_var``, the trace
of its gradient estimate's covariance at batch b, and ``grad_sqr``, an
estimate of ``|G|^2``, then

    phi = b * grad_var / grad_sqr                                   (samples)

``b`` is the batch the variance refers to. adaptdl (and so Pollux's profiles)
normalises ``grad_var`` to the initial batch m0, so ``b = m0`` there
(adaptdl ``goodput.py``: "PGNS is grad_var / grad_sqr * init_batch_size");
a job that reports the variance of its own mini-batch gradient has ``b = m``,
its batch at the time. `JobSpecs.grad_ref_batch` says which.

Statistical efficiency (Pollux, Qiao et al., OSDI'21, section 3.1): the
progress per sample at batch m relative to the initial batch m0,

    E(m) = (phi + m0) / (phi + m)                                   (<= 1 for m >= m0)

and goodput = X(k, n, m) * E(m), in samples-at-m0 per second.
"""

from __future__ import annotations

import functools

import numpy as np

from malleable.estimators.params import GAMMA_MAX
from malleable.estimators.throughput import log_iteration_time


def noise_scale(grad_sqr, grad_var, ref_batch) -> np.ndarray:
    """Gradient noise scale phi = ref_batch * grad_var / grad_sqr (samples).

    Args:
        grad_sqr: estimate of the squared norm of the true gradient, |G|^2.
        grad_var: trace of the covariance of the gradient estimate at batch
            ``ref_batch``.
        ref_batch: the batch size (samples) that ``grad_var`` refers to.

    Returns:
        phi (samples), same shape as the broadcast inputs; NaN where the inputs
        are not finite or grad_sqr <= 0 or grad_var < 0 (unknown).

    Source: McCandlish et al. 2018, eq. 2.8 (B_simple); the normalisation by
    the reference batch as in adaptdl/Pollux.
    """
    sqr = np.asarray(grad_sqr, dtype=np.float64)
    var = np.asarray(grad_var, dtype=np.float64)
    ref = np.asarray(ref_batch, dtype=np.float64)
    ok = np.isfinite(sqr) & np.isfinite(var) & np.isfinite(ref) & (sqr > 0) & (var >= 0) & (ref > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = ref * var / sqr
    return np.where(ok & np.isfinite(phi), phi, np.nan)


def efficiency(m, m0, phi) -> np.ndarray:
    """Statistical efficiency E(m) = (phi + m0) / (phi + m), dimensionless.

    Args:
        m: global batch size (samples), > 0.
        m0: initial batch size (samples), > 0.
        phi: gradient noise scale (samples), >= 0; NaN means unknown, and
            then E = 1 (the caller keeps the batch at m0).

    Returns:
        E, broadcast shape of the inputs; in (0, 1] for m >= m0. As phi grows
        (late in training) E tends to 1: large batches lose nothing.

    Source: Pollux (OSDI'21) section 3.1.
    """
    m = np.asarray(m, dtype=np.float64)
    m0 = np.asarray(m0, dtype=np.float64)
    phi = np.asarray(phi, dtype=np.float64)
    known = np.isfinite(phi) & (phi >= 0)
    p = np.where(known, phi, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = (p + m0) / (p + m)
    return np.where(known, e, 1.0)


def _iteration_time_grid32(u: np.ndarray, k: np.ndarray, n: np.ndarray,
                           m: np.ndarray) -> np.ndarray:
    """T_iter (s, float32) for J jobs at K GPU counts (on n nodes) and (J, K, B) batches.

    The equation of `throughput.log_iteration_time`, in float32 (several times
    faster for the powers; 1e-7 relative precision is plenty to rank batch
    sizes) and with the synchronisation time computed once per (job, k).
    """
    f32 = np.float32
    th = np.exp(u[:, :6]).astype(f32)
    gamma = (1.0 + (GAMMA_MAX - 1.0) / (1.0 + np.exp(-u[:, 6]))).astype(f32)[:, None, None]
    kf = np.maximum(k, 1.0).astype(f32)
    inter = (k > 1) & (n > 1)
    intra = (k > 1) & ~inter
    extra = np.maximum(k - 2.0, 0.0).astype(f32)
    ts = np.where(inter, th[:, 4:5] + th[:, 5:6] * extra,
                  np.where(intra, th[:, 2:3] + th[:, 3:4] * extra, f32(0.0)))      # (J, K)
    tc = th[:, 0, None, None] + th[:, 1, None, None] * (m / kf[None, :, None])    # (J, K, B)
    ratio = ts[..., None] / tc
    return tc * (f32(1.0) + ratio ** gamma) ** (f32(1.0) / gamma)


@functools.cache
def _grid_fractions(candidates: int) -> np.ndarray:
    """(candidates,) float32 0..1, evenly spaced: the batch grid's positions in log space."""
    frac = np.linspace(0.0, 1.0, candidates, dtype=np.float32)
    frac.flags.writeable = False
    return frac


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def optimal_batch(u: np.ndarray, k: np.ndarray, n: np.ndarray, m0: np.ndarray,
                  max_batch: np.ndarray, max_local_batch: np.ndarray, phi: np.ndarray,
                  candidates: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The goodput-optimal global batch for each job at each candidate GPU count.

    Searches a geometric grid of ``candidates`` global batch sizes (rounded to
    integers) between ``max(m0, k)`` and ``min(max_batch, k * max_local_batch)``
    and returns the best, as Pollux's PolluxAgent does (section 4.1). Where
    phi is unknown the batch stays at m0 (nothing says larger batches are
    worth their samples): the smallest batch that fits, ``max(m0, k)``.

    Args:
        u: (J, 7) throughput parameters (`ThroughputParams.to_u`).
        k: (K,) candidate GPU counts (0 allowed: goodput 0, batch 0).
        n: (K,) nodes used at each count.
        m0: (J,) initial (smallest) global batch.
        max_batch: (J,) largest global batch the job accepts (>= m0).
        max_local_batch: (J,) largest per-GPU batch (inf: no limit).
        phi: (J,) gradient noise scale (NaN: unknown).
        candidates: grid size.

    Returns:
        (goodput, batch, x): (J, K) goodput in samples-at-m0 per second,
        (J, K) int64 batch, (J, K) throughput X at that batch in samples/s.
        Goodput and batch are 0 where k == 0 or no batch fits
        (``k * max_local_batch < m0``).

    Source: goodput = X * E, Pollux section 3 (eq. for GOODPUT); the search as
    in adaptdl ``GoodputFunction.optimize``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    J, K = m0.shape[0], k.shape[0]
    known = np.isfinite(phi) & (phi >= 0)
    lo = np.maximum(m0[:, None], np.maximum(k[None, :], 1.0))
    hi = np.minimum(np.maximum(max_batch, m0)[:, None],
                    np.maximum(k[None, :], 1.0) * max_local_batch[:, None])
    # phi unknown: the smallest batch that fits (m0, or one sample per GPU).
    hi = np.where(known[:, None], hi, np.minimum(lo, hi))
    fits = (hi >= lo) & (k[None, :] > 0)
    hi = np.where(fits, hi, lo)
    # Grid search in float32 ...
    f32 = np.float32
    lower = np.ceil(lo - 1e-9)
    upper = np.maximum(np.floor(hi + 1e-9), lower)
    frac = _grid_fractions(candidates)
    llo = np.log(lo).astype(f32)
    span = (np.log(hi) - np.log(lo)).astype(f32)
    cand = np.round(np.exp(llo[..., None] + span[..., None] * frac))
    cand = np.clip(cand, lower.astype(f32)[..., None], upper.astype(f32)[..., None])
    phi32 = np.where(known, phi, np.inf).astype(f32)[:, None, None]
    m0_32 = m0.astype(f32)[:, None, None]
    eff = np.where(np.isfinite(phi32), (phi32 + m0_32) / (phi32 + cand), f32(1.0))
    gp = cand / _iteration_time_grid32(u, k, n, cand) * eff
    gp = np.where(np.isfinite(gp), gp, f32(0.0))
    best = np.argmax(gp, axis=2)
    batch = cand[np.arange(J)[:, None], np.arange(K)[None, :], best].astype(np.float64)
    batch = np.where(fits, np.clip(batch, lower, upper), 0.0)
    # ... then goodput and throughput at the chosen batch in float64.
    kk = np.broadcast_to(np.maximum(k, 1.0)[None, :], (J, K))
    nn = np.broadcast_to(np.maximum(n, 1.0)[None, :], (J, K))
    mm = np.where(fits, batch, 1.0)
    xbest = mm / np.exp(log_iteration_time(u, kk, nn, mm))
    goodput = xbest * efficiency(mm, m0[:, None], phi[:, None])
    ok = fits & np.isfinite(goodput)
    goodput = np.where(ok, goodput, 0.0)
    xbest = np.where(ok, xbest, 0.0)
    batch = np.where(ok, batch, 0.0).astype(np.int64)
    return goodput, batch, xbest
