"""Learning curves: when will a job's validation metric reach its target?

Model: a power law in progress p (samples at m0),

    metric(p) = a + b * (p / p_s)^(-alpha),        alpha > 0,

the "pow3" family that Domhan et al. (IJCAI'15) found among the best single
models of DL learning curves; ``a`` is the asymptote and ``p_s`` a per-job
scale (the progress at its first metric sample). For a fixed alpha the model
is linear in (a, b), so a job's curve is kept as sufficient statistics
(sums of w, x, x^2, y, xy, y^2 with ``x = (p/p_s)^-alpha``) for every alpha
of a fixed grid: adding samples is O(samples x grid), and fitting every job
is a closed-form 2x2 solve per alpha, vectorised over jobs.

Uncertainty: the alphas are weighted by their profile likelihood
``RSS_alpha^(-n/2)`` (with a small prior noise so that a curve of 3 points
does not pick one alpha with certainty); within an alpha, the covariance of
(a, b) carries to the crossing point by the delta method. The result is the
mean and standard deviation of the progress at which the metric reaches
the target, and the probability that it reaches it at all.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class CurveStats(NamedTuple):
    """Sufficient statistics of J jobs' learning curves (see module docstring).

    Attributes:
        count: (J,) int64 metric samples added.
        scale: (J,) p_s, progress of the first metric sample with p > 0 (NaN: none yet).
        sw, sy, syy: (J,) sums of 1, y, y^2.
        sx, sxx, sxy: (J, G) sums of x, x^2, x*y per exponent.
        best_max, best_min: (J,) highest and lowest metric so far.
    """

    count: np.ndarray
    scale: np.ndarray
    sw: np.ndarray
    sy: np.ndarray
    syy: np.ndarray
    sx: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray
    best_max: np.ndarray
    best_min: np.ndarray

    @classmethod
    def empty(cls, J: int, G: int) -> CurveStats:
        z = np.zeros(J)
        return cls(count=np.zeros(J, dtype=np.int64), scale=np.full(J, np.nan), sw=z.copy(),
                   sy=z.copy(), syy=z.copy(), sx=np.zeros((J, G)), sxx=np.zeros((J, G)),
                   sxy=np.zeros((J, G)), best_max=np.full(J, -np.inf),
                   best_min=np.full(J, np.inf))


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def add_points(stats: CurveStats, job: np.ndarray, p: np.ndarray, y: np.ndarray,
               alphas: np.ndarray) -> CurveStats:
    """Add metric samples (progress p, metric y) of some jobs to their statistics.

    Args:
        stats: statistics of J jobs.
        job: (N,) int row of each sample, ascending (samples of a job in time
            order); rows in [0, J).
        p: (N,) progress (samples at m0) when the metric was measured.
        y: (N,) metric value.
        alphas: (G,) exponents of the grid (the ones ``stats`` was built with).

    Returns:
        New `CurveStats` (inputs are not modified). Samples with non-finite p
        or y, or p <= 0, are ignored.
    """
    ok = np.isfinite(p) & np.isfinite(y) & (p > 0)
    job, p, y = job[ok], p[ok], y[ok]
    if job.size == 0:
        return stats
    # The scale of a job: its first usable sample's progress, fixed once set.
    first = np.concatenate(([True], job[1:] != job[:-1]))
    scale = stats.scale.copy()
    new_scale = np.isnan(scale[job[first]])
    scale[job[first][new_scale]] = p[first][new_scale]
    lx = np.log(p / scale[job])                                   # (N,)
    # (G, N): samples along the contiguous axis, so the segment sums are fast;
    # float32 within this batch (a job's few new points; 2x faster, 1e-7
    # relative), added to the float64 totals.
    f32 = np.float32
    x = np.exp(-np.outer(alphas.astype(f32), np.maximum(lx, -50.0).astype(f32)))
    y32 = y.astype(f32)
    starts = np.flatnonzero(first)
    rows = job[starts]

    def seg(v):
        return np.add.reduceat(v, starts, axis=-1)
    sw, sy, syy = stats.sw.copy(), stats.sy.copy(), stats.syy.copy()
    sx, sxx, sxy = stats.sx.copy(), stats.sxx.copy(), stats.sxy.copy()
    sw[rows] += seg(np.ones_like(y))
    sy[rows] += seg(y)
    syy[rows] += seg(y * y)
    sx[rows] += seg(x).T
    sxx[rows] += seg(x * x).T
    sxy[rows] += seg(x * y32).T
    count = stats.count.copy()
    count[rows] += np.diff(np.append(starts, job.size))
    best_max = stats.best_max.copy()
    best_min = stats.best_min.copy()
    best_max[rows] = np.maximum(best_max[rows], np.maximum.reduceat(y, starts))
    best_min[rows] = np.minimum(best_min[rows], np.minimum.reduceat(y, starts))
    return CurveStats(count, scale, sw, sy, syy, sx, sxx, sxy, best_max, best_min)


class CurvePrediction(NamedTuple):
    """Where J jobs' fitted curves reach their target metric.

    Attributes:
        progress: (J,) progress (samples at m0) at which the target is reached,
            given that it is: the posterior geometric mean (a median, robust to
            the long right tail); NaN where not fitted or unreachable.
        progress_std: (J,) the posterior standard deviation (of the mixture
            of log-normals, so it carries that tail).
        log_std: (J,) standard deviation of the log of that progress: the
            range ``progress * exp(+-log_std)`` holds about 68 % of the
            posterior (a quantile range that the tail does not inflate).
        p_reach: (J,) probability (over the exponent grid) that the curve
            reaches the target at all.
        reached: (J,) bool, the best metric so far already meets the target.
        fitted: (J,) bool, enough points to fit (``count >= min_points``).
        asymptote: (J,) the likeliest exponent's asymptote ``a``.
    """

    progress: np.ndarray
    progress_std: np.ndarray
    log_std: np.ndarray
    p_reach: np.ndarray
    reached: np.ndarray
    fitted: np.ndarray
    asymptote: np.ndarray


def predict_target(stats: CurveStats, alphas: np.ndarray, target: np.ndarray,
                   direction: np.ndarray, progress_now: np.ndarray, min_points: int = 3,
                   max_ratio: float = 1000.0, noise_dof: float = 2.0) -> CurvePrediction:
    """Fit every job's learning curve and solve for the progress at its target.

    Args:
        stats: `CurveStats` of J jobs.
        alphas: (G,) the exponent grid used to build ``stats``.
        target: (J,) target metric value (NaN: no target).
        direction: (J,) +1 if the metric must rise to the target (accuracy),
            -1 if it must fall (loss, error rate).
        progress_now: (J,) the job's attained progress (samples at m0).
        min_points: metric samples needed to fit (>= 3: a, b and alpha).
        max_ratio: a crossing beyond ``max_ratio * max(progress_now, p_s)`` is
            treated as never.
        noise_dof: pseudo-observations of the prior noise (1 % of the observed
            metric range).

    Returns:
        `CurvePrediction`. Never raises on bad numbers.
    """
    with np.errstate(all="ignore"):     # non-finite intermediate values are masked below
        return _predict_target(stats, np.asarray(alphas, dtype=np.float64),
                               np.asarray(target, dtype=np.float64), direction,
                               np.asarray(progress_now, dtype=np.float64), min_points,
                               max_ratio, noise_dof)


def _predict_target(stats, alphas, target, direction, progress_now, min_points, max_ratio,
                    noise_dof) -> CurvePrediction:
    direction = np.where(np.asarray(direction) < 0, -1.0, 1.0)
    n = stats.sw[:, None]
    reached = np.where(direction > 0, stats.best_max >= target, stats.best_min <= target)
    reached &= np.isfinite(target)
    fitted = (stats.count >= min_points) & np.isfinite(stats.scale) & np.isfinite(target)
    # Per-exponent least squares of y on (1, x).
    det = n * stats.sxx - stats.sx ** 2
    okdet = det > 1e-12 * np.maximum(n * stats.sxx, 1e-300)
    det_s = np.where(okdet, det, 1.0)
    b = (n * stats.sxy - stats.sx * stats.sy[:, None]) / det_s
    a = (stats.sy[:, None] - b * stats.sx) / np.maximum(n, 1.0)
    # Residual sum of squares from centred sums (less cancellation than raw ones).
    nn = np.maximum(n, 1.0)
    syy_c = stats.syy[:, None] - stats.sy[:, None] ** 2 / nn
    sxy_c = stats.sxy - stats.sx * stats.sy[:, None] / nn
    sxx_c = np.where(okdet, det_s / nn, 1.0)
    rss = np.maximum(syy_c - sxy_c ** 2 / sxx_c, 0.0)
    y_range = np.where(np.isfinite(stats.best_max - stats.best_min),
                       stats.best_max - stats.best_min, 0.0)
    y_mean = stats.sy / np.maximum(n[:, 0], 1.0)
    s0 = 0.01 * y_range + 1e-4 * np.abs(y_mean) + 1e-12
    prior_ss = (noise_dof * s0 ** 2)[:, None]
    dof = np.maximum(n - 2.0, 0.0) + noise_dof
    sigma2 = (rss + prior_ss) / dof
    loglik = np.where(okdet, -0.5 * (n + noise_dof) * np.log(rss + prior_ss), -np.inf)
    loglik = np.where(fitted[:, None], loglik, -np.inf)
    mx = np.max(loglik, axis=1, keepdims=True)
    wts = np.where(np.isfinite(loglik), np.exp(loglik - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    wsum = wts.sum(axis=1, keepdims=True)
    wts = np.where(wsum > 0, wts / np.where(wsum > 0, wsum, 1.0), 0.0)
    # Covariance of (a, b) per exponent: sigma2 * inv([[n, sx], [sx, sxx]]).
    var_a = sigma2 * stats.sxx / det_s
    var_b = sigma2 * n / det_s
    cov_ab = -sigma2 * stats.sx / det_s
    # Crossing: target = a + b * z with z = (p*/p_s)^-alpha, need 0 < z.
    tgt = target[:, None]
    z = (tgt - a) / b
    scale = stats.scale[:, None]
    x_now = (np.maximum(progress_now, 0.0)[:, None] / scale) ** (-alphas[None, :])
    x_now = np.where(np.isfinite(x_now), x_now, np.inf)
    zc = np.minimum(z, x_now)                           # model says passed already: now
    logp = np.log(scale) - np.log(zc) / alphas[None, :]
    d_a = (1.0 / alphas[None, :]) / (tgt - a)
    d_b = (1.0 / alphas[None, :]) / b
    var_l = d_a ** 2 * var_a + d_b ** 2 * var_b + 2 * d_a * d_b * cov_ab
    var_l = np.where(z < x_now, var_l, 0.0)
    limit = np.log(max_ratio * np.maximum(np.maximum(progress_now, 0.0), stats.scale))[:, None]
    reach = okdet & (z > 0) & np.isfinite(logp) & (logp <= limit) & np.isfinite(var_l)
    var_l = np.clip(np.where(reach, var_l, 0.0), 0.0, 4.0)
    w_r = np.where(reach, wts, 0.0)
    p_reach = w_r.sum(axis=1)
    wn = np.where(p_reach[:, None] > 0, w_r / np.where(p_reach > 0, p_reach, 1.0)[:, None], 0.0)
    lp = np.where(reach, logp, 0.0)
    lp = _refine_best(lp, loglik, reach)
    m1 = np.sum(wn * np.exp(lp + 0.5 * var_l), axis=1)
    m2 = np.sum(wn * np.exp(2 * lp + 2 * var_l), axis=1)
    ok = fitted & (p_reach > 0)
    # Point estimate: the geometric mean (median of a log-normal), not the mean,
    # which the long right tail of a near-asymptote crossing would dominate.
    mean_log = np.sum(wn * lp, axis=1)
    progress = np.where(ok, np.exp(mean_log), np.nan)
    log_std = np.sqrt(np.maximum(np.sum(wn * (var_l + (lp - mean_log[:, None]) ** 2), axis=1),
                                 0.0))
    log_std = np.where(ok, log_std, np.nan)
    std = np.where(ok, np.sqrt(np.maximum(m2 - m1 ** 2, 0.0)), np.nan)
    best = np.argmax(wts, axis=1)
    asym = np.where(fitted, a[np.arange(a.shape[0]), best], np.nan)
    return CurvePrediction(progress=progress, progress_std=std, log_std=log_std,
                           p_reach=np.where(fitted, p_reach, 0.0), reached=reached,
                           fitted=fitted, asymptote=asym)


def _refine_best(lp: np.ndarray, loglik: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Move the likeliest exponent's crossing between grid points.

    A curve with little noise puts nearly all weight on one grid exponent, and
    the grid's spacing (7.5 % in alpha by default) then biases a long extrapolation. A
    parabola through the log-likelihood at the best exponent and its two
    neighbours locates the maximum between them, and the best component's log
    crossing is interpolated there (only where all three reach the target).
    """
    J, G = lp.shape
    if G < 3:
        return lp
    rows = np.arange(J)
    i = np.clip(np.argmax(np.where(np.isfinite(loglik), loglik, -np.inf), axis=1), 1, G - 2)
    lo, mid, hi = loglik[rows, i - 1], loglik[rows, i], loglik[rows, i + 1]
    curv = lo - 2 * mid + hi
    ok = (np.isfinite(lo) & np.isfinite(mid) & np.isfinite(hi) & (curv < 0)
          & reach[rows, i - 1] & reach[rows, i] & reach[rows, i + 1])
    delta = np.clip(0.5 * (lo - hi) / curv, -0.5, 0.5)
    delta = np.where(ok, delta, 0.0)
    side = np.where(delta > 0, i + 1, i - 1)
    out = lp.copy()
    out[rows, i] = lp[rows, i] + np.abs(delta) * (lp[rows, side] - lp[rows, i])
    return out
