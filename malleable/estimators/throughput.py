"""Throughput X(k, n, m): the Pollux iteration-time model, fitted to many jobs at once.

Equations, units and parameters: `malleable.estimators.params` (module
docstring and `ThroughputParams`). Source: Qiao et al., "Pollux: Co-adaptive
Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI'21, section 3.2.

Fitting. Each job's observations are a small table of configurations
(k, n, m) with a recency weight ``w`` and the weighted mean ``y`` of the log
iteration time observed there (`malleable.estimators.state`). The fit is the
maximum a posteriori estimate of ``u`` (see `params`) under

    sum_c w_c (f_c(u) - y_c)^2 / s2  +  sum_i ((u_i - mu_i) / sd_i)^2

with ``f = log T_iter`` and a Gaussian prior (mu, sd) per parameter: the prior
fills in what the data cannot identify (e.g. cross-node synchronisation for a
job that never ran across nodes). It runs as a batched Levenberg-Marquardt
over all J jobs together (one (J, 7, 7) solve per iteration), warm-started
from the previous cycle, so its cost is a few array passes over J x C
entries rather than J calls to an optimiser. The posterior covariance
(Laplace approximation) gives the predictive standard deviation of log X at
any configuration (delta method).

The power-law fit ``X ~ k^p`` (the speedup model of heSRPT, Berg et al.,
SIGMETRICS'20) is closed-form weighted least squares on the same tables.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malleable.estimators.params import GAMMA_MAX, NUM_PARAMS, ThroughputParams

_U_MIN, _U_MAX = -50.0, 50.0  # bounds of log-times in u (2e-22 s .. 5e21 s)
_G_MIN, _G_MAX = -12.0, 12.0  # bounds of the gamma logit


def log_iteration_time(u: np.ndarray, k: np.ndarray, n: np.ndarray, m: np.ndarray,
                       jacobian: bool = False):
    """log T_iter (log seconds) of the Pollux model, and optionally its Jacobian in u.

    Args:
        u: (J, 7) parameter vectors (`ThroughputParams.to_u`).
        k, n, m: (J, C) GPUs, nodes and global batch of each entry (k >= 1,
            n >= 1, m > 0); broadcast against ``u[:, None, :]``.
        jacobian: also return d log T / du.

    Returns:
        f: (J, C) log iteration time; and with ``jacobian`` a (J, C, 7) array.
    """
    return _log_time(np.asarray(u, dtype=np.float64), _Geometry.of(k, n, m), jacobian)


class _Geometry(NamedTuple):
    """What `log_iteration_time` needs of the configurations (k, n, m) alone, so that
    a fit evaluating many ``u`` at the same configurations derives it once."""

    local: np.ndarray   # per-GPU batch m / max(k, 1)
    inter: np.ndarray   # bool: synchronisation across nodes
    intra: np.ndarray   # bool: synchronisation within a node
    sync: np.ndarray    # bool: intra | inter
    extra: np.ndarray   # replicas beyond 2, max(k - 2, 0)

    @classmethod
    def of(cls, k, n, m) -> _Geometry:
        k = np.asarray(k, dtype=np.float64)
        n = np.asarray(n, dtype=np.float64)
        m = np.asarray(m, dtype=np.float64)
        inter = (k > 1) & (n > 1)
        intra = (k > 1) & ~inter
        return cls(m / np.maximum(k, 1.0), inter, intra, intra | inter,
                   np.maximum(k - 2.0, 0.0))

    def take(self, rows: np.ndarray) -> _Geometry:
        """The geometry of rows ``rows`` (all fields must have J rows)."""
        return _Geometry(*(a[rows] for a in self))


def _log_time(u: np.ndarray, geo: _Geometry, jacobian: bool):
    """`log_iteration_time` on a precomputed `_Geometry` (u: (J, 7) float64)."""
    local, inter, intra, sync, extra = geo
    th = np.exp(u[:, :6])[:, None, :]                                  # (J,1,6)
    gamma = 1.0 + (GAMMA_MAX - 1.0) / (1.0 + np.exp(-u[:, 6]))[:, None]  # (J,1)
    tc = th[..., 0] + th[..., 1] * local
    a_s = np.where(inter, th[..., 4], th[..., 2])
    b_s = np.where(inter, th[..., 5], th[..., 3])
    ts = np.where(sync, a_s + b_s * extra, 0.0)
    ltc = np.log(tc)
    with np.errstate(divide="ignore"):
        lts = np.log(ts)                                                # -inf where Ts = 0
    f = np.logaddexp(gamma * ltc, gamma * lts) / gamma
    if not jacobian:
        return f
    # Shares of the two terms in S = Tc^g + Ts^g.
    pos = ts > 0
    lts0 = np.where(pos, lts, 0.0)
    sc = np.exp(gamma * (ltc - f))
    ss = np.where(pos, np.exp(gamma * (lts0 - f)), 0.0)
    dtc = sc / tc                      # d f / d Tc
    dts = np.where(pos, ss / np.where(pos, ts, 1.0), 0.0)  # d f / d Ts
    jac = np.empty(f.shape + (NUM_PARAMS,))
    jac[..., 0] = dtc * th[..., 0]
    jac[..., 1] = dtc * th[..., 1] * local
    da = dts * a_s
    db = dts * b_s * extra
    jac[..., 2] = np.where(intra, da, 0.0)
    jac[..., 3] = np.where(intra, db, 0.0)
    jac[..., 4] = np.where(inter, da, 0.0)
    jac[..., 5] = np.where(inter, db, 0.0)
    dgamma = (sc * ltc + np.where(pos, ss * lts0, 0.0) - f) / gamma
    frac = (gamma - 1.0) / (GAMMA_MAX - 1.0)
    jac[..., 6] = dgamma * (GAMMA_MAX - 1.0) * frac * (1.0 - frac)
    return f, jac


def iteration_time(params: ThroughputParams, k, n, m) -> np.ndarray:
    """T_iter in seconds per iteration, for parameters of J jobs at (J, C) configurations.

    Args:
        params: `ThroughputParams` with (J,) fields, or scalar fields for one job.
        k, n, m: GPUs (>= 1), nodes (>= 1) and global batch (> 0), arrays
            broadcastable to (J, C).

    Returns:
        T_iter in seconds: (J, C); for scalar parameters and 1-d (C,) inputs, (C,).

    Source: Pollux (OSDI'21) section 3.2; see `malleable.estimators.params`.
    """
    u = np.atleast_2d(params.to_u())
    scalar = np.ndim(params.alpha_c) == 0
    k2, n2, m2 = (np.atleast_2d(np.asarray(a, dtype=np.float64)) for a in (k, n, m))
    out = np.exp(log_iteration_time(u, k2, n2, m2))
    return out[0] if scalar and np.ndim(k) <= 1 else out


def throughput(params: ThroughputParams, k, n, m) -> np.ndarray:
    """X = m / T_iter, samples per second (same shapes as `iteration_time`)."""
    return np.asarray(m, dtype=np.float64) / iteration_time(params, k, n, m)


class ThroughputFit(NamedTuple):
    """Result of `fit_throughput` for J jobs.

    Attributes:
        u: (J, 7) MAP parameter vectors.
        cov: (J, 7, 7) posterior covariance of u (Laplace approximation).
        noise_var: (J,) variance of one interval's log iteration time around
            the model (posterior estimate, (log s)^2).
        ok: (J,) bool, the fit produced finite values (else u is the prior mean
            and cov the prior covariance).
    """

    u: np.ndarray
    cov: np.ndarray
    noise_var: np.ndarray
    ok: np.ndarray

    @property
    def params(self) -> ThroughputParams:
        return ThroughputParams.from_u(self.u)


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def fit_throughput(k: np.ndarray, n: np.ndarray, m: np.ndarray, w: np.ndarray, y: np.ndarray,
                   within_ss: np.ndarray, prior_mu: np.ndarray, prior_sd: np.ndarray,
                   u_init: np.ndarray | None = None, iterations: int = 12,
                   noise_log_sd: float = 0.1, noise_dof: float = 4.0,
                   tol: float = 1e-3) -> ThroughputFit:
    """Fit the Pollux model to J jobs' configuration tables at once (batched MAP).

    Args:
        k, n, m: (J, C) GPUs, nodes, global batch of each remembered
            configuration; entries with ``w == 0`` are empty and ignored.
        w: (J, C) recency weight of each configuration (sum of its intervals'
            weights).
        y: (J, C) weighted mean of log iteration time (log seconds) there.
        within_ss: (J,) weighted sum of squared deviations of the intervals'
            log times from their configuration's mean (scatter within configs).
        prior_mu, prior_sd: (J, 7) Gaussian prior on u.
        u_init: (J, 7) starting point (previous solution), default prior_mu.
        iterations: at most this many Levenberg-Marquardt iterations; a job
            leaves the loop once its step is below ``tol`` in every entry.
        noise_log_sd, noise_dof: prior on the noise of one interval's log time
            (scaled-inverse-chi-square with ``noise_dof`` pseudo-observations).

    Returns:
        `ThroughputFit`. Never raises on bad numbers: a job whose fit is not
        finite gets its prior (``ok`` False).
    """
    k = np.asarray(k, dtype=np.float64)
    J = k.shape[0]
    w = np.where(np.isfinite(w) & (w > 0), w, 0.0)
    y = np.where(w > 0, y, 0.0)
    n = np.where(w > 0, n, 1.0)
    m = np.where(w > 0, m, 1.0)
    k = np.where(w > 0, k, 1.0)
    mu = np.asarray(prior_mu, dtype=np.float64)
    inv_var = 1.0 / np.asarray(prior_sd, dtype=np.float64) ** 2
    u = mu.copy() if u_init is None else np.where(np.isfinite(u_init), u_init, mu)
    u = _clip_u(u)
    wsum = w.sum(axis=1)
    s0 = noise_dof * noise_log_sd ** 2
    ss_within = np.where(np.isfinite(within_ss), np.maximum(within_ss, 0.0), 0.0)
    eye = np.eye(NUM_PARAMS)

    geo = _Geometry.of(k, n, m)
    f, jac = _log_time(u, geo, True)   # the loop's fa and ja always belong to its ua
    ssr = np.sum(w * (f - y) ** 2, axis=1)
    pri = np.sum((u - mu) ** 2 * inv_var, axis=1)
    s2 = (s0 + ss_within + ssr) / (noise_dof + wsum)
    lam = np.full(J, 1e-3)
    # The loop works on the rows still iterating (suffix a), compacted; a row that
    # stops is written back to u, s2 and jac.
    rows = np.arange(J)
    ua, fa, ja, ssra, pria, s2a, lama = u, f, jac, ssr, pri, s2, lam
    wa, ya, mua, iva, ssw_a, wsum_a, ga = w, y, mu, inv_var, ss_within, wsum, geo
    for _ in range(iterations):
        if rows.size == 0:
            break
        wj = ja * (wa / s2a[:, None])[..., None]                         # (A,C,7)
        grad = np.einsum("jci,jc->ji", wj, fa - ya) + (ua - mua) * iva
        hess = np.matmul(wj.transpose(0, 2, 1), ja) + iva[:, :, None] * eye
        diag = np.diagonal(hess, axis1=1, axis2=2)
        damp = hess + lama[:, None, None] * (diag[:, :, None] * eye)
        bad = ~np.isfinite(damp).all(axis=(1, 2)) | ~np.isfinite(grad).all(axis=1)
        if bad.any():
            damp[bad] = eye
            grad[bad] = 0.0
        step = np.linalg.solve(damp, -grad[..., None])[..., 0]
        u_new = _clip_u(ua + step)
        # The Jacobian at u_new too: the next iteration starts there if it is better.
        f_new, j_new = _log_time(u_new, ga, True)
        ssr_new = np.sum(wa * (f_new - ya) ** 2, axis=1)
        pri_new = np.sum((u_new - mua) ** 2 * iva, axis=1)
        obj = ssra / s2a + pria
        obj_new = ssr_new / s2a + pri_new
        better = np.isfinite(obj_new) & (obj_new <= obj)
        ua = np.where(better[:, None], u_new, ua)
        fa = np.where(better[:, None], f_new, fa)
        ja = np.where(better[:, None, None], j_new, ja)
        ssra = np.where(better, ssr_new, ssra)
        pria = np.where(better, pri_new, pria)
        lama = np.clip(np.where(better, lama * 0.3, lama * 10.0), 1e-9, 1e9)
        # Noise from the residuals too (within + between configurations).
        s2_new = (s0 + ssw_a + ssra) / (noise_dof + wsum_a)
        s2a = np.where(np.isfinite(s2_new) & (s2_new > 0), s2_new, s2a)
        done = (better & (np.abs(step) < tol).all(axis=1)) | bad | (lama >= 1e9)
        if done.any():
            stop = rows[done]
            u[stop], s2[stop], jac[stop] = ua[done], s2a[done], ja[done]
            keep = ~done
            rows = rows[keep]
            ua, fa, ja, ssra, pria, s2a, lama = (x[keep] for x in (ua, fa, ja, ssra, pria,
                                                                   s2a, lama))
            wa, ya, mua, iva, ssw_a, wsum_a = (x[keep] for x in (wa, ya, mua, iva, ssw_a,
                                                                 wsum_a))
            ga = ga.take(keep)
    u[rows], s2[rows], jac[rows] = ua, s2a, ja
    wj = jac * (w / s2[:, None])[..., None]
    hess = np.matmul(wj.transpose(0, 2, 1), jac) + inv_var[:, :, None] * eye
    ok = np.isfinite(u).all(axis=1) & np.isfinite(hess).all(axis=(1, 2))
    hess[~ok] = inv_var[~ok, :, None] * eye
    u[~ok] = mu[~ok]
    cov = np.linalg.inv(hess)
    cov = 0.5 * (cov + cov.transpose(0, 2, 1))
    return ThroughputFit(u=u, cov=cov, noise_var=s2, ok=ok)


def _clip_u(u: np.ndarray) -> np.ndarray:
    out = np.clip(u, _U_MIN, _U_MAX)
    out[..., 6] = np.clip(u[..., 6], _G_MIN, _G_MAX)
    return np.where(np.isfinite(out), out, 0.0)


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def log_throughput_std(fit: ThroughputFit, k: np.ndarray, n: np.ndarray,
                       m: np.ndarray) -> np.ndarray:
    """Standard deviation of the predicted log X at (J, C) configurations.

    The delta method on the posterior covariance: sqrt(g' cov g) with g the
    gradient of log T_iter in u (log X = log m - log T_iter). It is the
    uncertainty of the model's mean, not of one interval's noise.

    Returns:
        (J, C) float64, >= 0 (natural-log units: 0.1 ~ 10 %).
    """
    kk = np.maximum(np.asarray(k, dtype=np.float64), 1.0)
    nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    mm = np.maximum(np.asarray(m, dtype=np.float64), 1e-9)
    _, jac = log_iteration_time(fit.u, kk, nn, mm, jacobian=True)
    var = np.einsum("jci,jil,jcl->jc", jac, fit.cov, jac)
    return np.sqrt(np.maximum(var, 0.0))


class PowerLawFit(NamedTuple):
    """Result of `fit_power_law`: ``log X = a + p log k + q log(m/k)``.

    Attributes:
        p: (J,) speedup exponent (``s(k) = k^p`` at a fixed per-GPU batch).
        p_std: (J,) posterior standard deviation of p.
        log_x1: (J,) a: log samples/s on one GPU at per-GPU batch 1 (q scales it).
        q: (J,) exponent of the per-GPU batch.
    """

    p: np.ndarray
    p_std: np.ndarray
    log_x1: np.ndarray
    q: np.ndarray


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def fit_power_law(k: np.ndarray, m: np.ndarray, w: np.ndarray, y: np.ndarray,
                  within_ss: np.ndarray, p_prior: tuple[float, float] = (0.8, 0.5),
                  q_prior: tuple[float, float] = (0.5, 1.0), noise_log_sd: float = 0.1,
                  noise_dof: float = 4.0) -> PowerLawFit:
    """Closed-form fit of the power-law speedup model to J jobs' configuration tables.

    Model: ``log X = a + p log k + q log(m/k)`` (X in samples/s, X = m / T,
    so ``log X = log m - y``). Weighted Bayesian linear regression with
    Gaussian priors on p and q (flat on a): with one GPU count observed, p is
    the prior's (the heSRPT assumption ``s(k) = k^p``, Berg et al.,
    SIGMETRICS'20; a typical p for DL training is 0.6..0.9).

    Args:
        k, m, w, y: (J, C) configuration tables as for `fit_throughput`.
        within_ss: (J,) scatter within configurations.
        p_prior, q_prior: (mean, sd) of the priors on p and q.

    Returns:
        `PowerLawFit` with (J,) arrays.
    """
    w = np.where(np.isfinite(w) & (w > 0), w, 0.0)
    k = np.where(w > 0, np.asarray(k, dtype=np.float64), 1.0)
    m = np.where(w > 0, np.asarray(m, dtype=np.float64), 1.0)
    logx = np.where(w > 0, np.log(m) - y, 0.0)
    X = np.stack([np.ones_like(k), np.log(k), np.log(m / k)], axis=-1)  # (J,C,3)
    wsum = w.sum(axis=1)
    s0 = noise_dof * noise_log_sd ** 2
    ssw = np.maximum(np.nan_to_num(within_ss), 0.0)
    s2 = (s0 + ssw) / (noise_dof + wsum)
    prec = np.zeros((k.shape[0], 3, 3))
    prec[:, 0, 0] = 1e-8
    prec[:, 1, 1] = 1.0 / p_prior[1] ** 2
    prec[:, 2, 2] = 1.0 / q_prior[1] ** 2
    rhs_prior = np.array([0.0, p_prior[0] / p_prior[1] ** 2, q_prior[0] / q_prior[1] ** 2])
    xtw = X * (w / s2[:, None])[..., None]
    A = np.matmul(xtw.transpose(0, 2, 1), X) + prec
    b = np.einsum("jci,jc->ji", xtw, logx) + rhs_prior
    coef = np.linalg.solve(A, b[..., None])[..., 0]
    # Second pass: noise from the residuals too.
    resid = np.where(w > 0, logx - np.einsum("jci,ji->jc", X, coef), 0.0)
    s2 = (s0 + ssw + np.sum(w * resid ** 2, axis=1)) / (
        noise_dof + wsum)
    xtw = X * (w / s2[:, None])[..., None]
    A = np.matmul(xtw.transpose(0, 2, 1), X) + prec
    b = np.einsum("jci,jc->ji", xtw, logx) + rhs_prior
    coef = np.linalg.solve(A, b[..., None])[..., 0]
    cov = np.linalg.inv(A)
    return PowerLawFit(p=coef[:, 1], p_std=np.sqrt(np.maximum(cov[:, 1, 1], 0.0)),
                       log_x1=coef[:, 0], q=coef[:, 2])
