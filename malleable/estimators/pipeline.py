"""From the state to the estimates and the speedup table the policies consume.

One scheduling cycle, for J jobs:

    state = update(state, batch, specs)                  # fold in new samples
    est = estimate(state, specs, prior=..., history=...)  # fit all jobs at once
    state = state.with_fit(est.u)                        # warm start next time
    table = speedup_table(est, specs, k, gpus_per_node)  # goodput, batch, W

(`cycle` does all four.) Every job gets a defined estimate: where its own
samples say too little, the prior fills in and ``flags`` says so; no job's
bad data raises.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from malleable.estimators.efficiency import efficiency, optimal_batch
from malleable.estimators.inputs import JobSpecs, ProgressBatch, WorkHistory
from malleable.estimators.learning_curve import CurvePrediction, CurveStats, predict_target
from malleable.estimators.params import (
    NUM_PARAMS,
    EstimateFlags,
    EstimatorConfig,
    ThroughputParams,
    ThroughputPrior,
)
from malleable.estimators.remaining import remaining_default, remaining_from_history
from malleable.estimators.state import EstimatorState, update
from malleable.estimators.table import SpeedupTable, feasible_mask
from malleable.estimators.throughput import (
    ThroughputFit,
    fit_power_law,
    fit_throughput,
    log_iteration_time,
    log_throughput_std,
)

F = EstimateFlags


class Estimates(NamedTuple):
    """What the estimators believe about J jobs, (J,) arrays unless stated.

    Attributes:
        u: (J, 7) throughput parameter vectors (`ThroughputParams.from_u`).
        cov: (J, 7, 7) their posterior covariance.
        noise_sd: per-interval noise of log iteration time (natural log).
        power_p, power_p_std: speedup exponent of ``X ~ k^p`` and its sd.
        phi: gradient noise scale (samples; NaN: unknown).
        progress: attained work, samples at m0.
        remaining_work, remaining_std: remaining work W and its sd (samples at m0).
        flags: int64 `EstimateFlags` bitmask.
        m0, max_batch, max_local_batch: the sanitised batch limits used.
    """

    u: np.ndarray
    cov: np.ndarray
    noise_sd: np.ndarray
    power_p: np.ndarray
    power_p_std: np.ndarray
    phi: np.ndarray
    progress: np.ndarray
    remaining_work: np.ndarray
    remaining_std: np.ndarray
    flags: np.ndarray
    m0: np.ndarray
    max_batch: np.ndarray
    max_local_batch: np.ndarray

    @property
    def params(self) -> ThroughputParams:
        """The fitted `ThroughputParams` (J,) (store them to build priors later)."""
        return ThroughputParams.from_u(self.u)

    @property
    def log_sd(self) -> np.ndarray:
        """(J, 7) posterior standard deviation of each entry of ``u`` (sqrt of cov's diagonal).

        Store it with `params` when a job ends: `prior_from_finished` takes it
        as ``log_sd`` so that a prior is no surer of a parameter than the
        finished job was.
        """
        return np.sqrt(np.maximum(np.diagonal(self.cov, axis1=1, axis2=2), 0.0))

    @property
    def from_prior(self) -> np.ndarray:
        """(J,) bool: the throughput model is the prior's (no usable samples or a failed fit)."""
        return (self.flags & int(F.NO_SAMPLES | F.FIT_FAILED)) != 0


def _log_tau_from_data(ck: np.ndarray, cn: np.ndarray, cm: np.ndarray, w: np.ndarray,
                       y: np.ndarray, m0: np.ndarray, config: EstimatorConfig) -> np.ndarray:
    """(J,) log of tau = T_iter(1 GPU, m0) read off the samples (NaN: none).

    Each configuration's log time is carried to (1 GPU, m0) with the cluster
    default model's shape; configurations close to (1, m0) count most, since
    the carrying is only as good as that shape.
    """
    J = m0.shape[0]
    rel = config.cluster.params(np.ones(J), m0).to_u()
    k = np.maximum(ck, 1)
    mm = np.where(w > 0, cm, 1.0)
    f_rel = log_iteration_time(rel, k, np.maximum(cn, 1), mm)
    dist = np.abs(np.log(k)) + np.abs(np.log(mm / k / m0[:, None]))
    wn = w * np.exp(-2.0 * dist)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.sum(wn * (y - f_rel), axis=1) / wn.sum(axis=1)
    return np.where(np.isfinite(out), out, np.nan)


def _log_tau_from_u(u: np.ndarray, m0: np.ndarray) -> np.ndarray:
    """(J,) log T_iter(1 GPU, m0) under parameters u (NaN rows stay NaN)."""
    one = np.ones((u.shape[0], 1))
    safe = np.where(np.isfinite(u), u, 0.0)
    out = log_iteration_time(safe, one, one, m0[:, None])[:, 0]
    return np.where(np.isfinite(u).all(axis=1), out, np.nan)


def _prior(m0: np.ndarray, log_tau: np.ndarray, config: EstimatorConfig,
           prior: ThroughputPrior | None):
    """Prior mean and sd of u (J, 7), and which jobs have a supplied prior.

    The cluster default is scaled by tau (`ClusterDefault`); a supplied prior
    replaces it where given and valid.
    """
    J = m0.shape[0]
    cd = config.cluster
    log_tau = np.where(np.isfinite(log_tau), log_tau, np.log(cd.no_data_tau))
    mu = cd.params(np.ones(J), m0).to_u()
    mu[:, :6] += log_tau[:, None]
    sd = np.broadcast_to(np.asarray(cd.log_sd, dtype=np.float64), (J, NUM_PARAMS)).copy()
    given = np.zeros(J, dtype=bool)
    if prior is not None:
        given = np.asarray(prior.given, dtype=bool)
        if given.shape != (J,):
            raise ValueError(f"prior.given must have shape ({J},), got {given.shape}")
        pu = _prior_u(prior, given)
        psd = np.asarray(prior.log_sd, dtype=np.float64)
        if psd.shape != (J, NUM_PARAMS):
            psd = np.broadcast_to(psd, (J, NUM_PARAMS))
        okp = given & np.isfinite(pu).all(axis=1) & (np.isfinite(psd) & (psd > 0)).all(axis=1)
        mu[okp] = pu[okp]
        sd[okp] = psd[okp]
        given = okp
    return mu, sd, given


def _prior_u(prior: ThroughputPrior, given: np.ndarray) -> np.ndarray:
    """u of the supplied prior where given (NaN rows elsewhere or where invalid)."""
    J = given.shape[0]
    fields_ = [np.asarray(f, dtype=np.float64) for f in prior.mean]
    fields_ = [f if f.shape == (J,) else np.broadcast_to(f, (J,)) for f in fields_]
    times = np.stack(fields_[:6], axis=1)
    gamma = fields_[6]
    valid = given & (times > 0).all(axis=1) & (gamma > 1) & (gamma < 10)
    out = np.full((J, NUM_PARAMS), np.nan)
    if valid.any():
        out[valid] = ThroughputParams(*(f[valid] for f in fields_)).to_u()
    return out


def _put(full: np.ndarray, mask: np.ndarray, part: np.ndarray) -> np.ndarray:
    """A copy of ``full`` with the rows ``mask`` selects (a bool mask or row indices)
    replaced by ``part``."""
    out = full.copy()
    out[mask] = part
    return out


def _compact(state: EstimatorState):
    """The configuration tables with used slots first, cut to the most any job uses.

    Returns (k, n, m, w, s1, s2), each (J, C'), with w = 0 in unused slots.
    """
    w = np.where(np.isfinite(state.cfg_w) & (state.cfg_w > 1e-12) & (state.cfg_k > 0),
                 state.cfg_w, 0.0)
    used = w > 0
    width = max(1, int(used.sum(axis=1).max())) if used.size else 1
    order = np.argsort(~used, axis=1, kind="stable")[:, :width]
    row = np.arange(order.shape[0])[:, None]

    def take(a):
        return a[row, order]
    return (take(state.cfg_k), take(state.cfg_n), take(state.cfg_m), take(w),
            take(state.cfg_s1), take(state.cfg_s2))


def _specs_limits(specs: JobSpecs):
    bad = specs.bad
    m0 = np.where(bad, 1.0, specs.init_batch)
    mb = np.where(np.isfinite(specs.max_batch) & (specs.max_batch >= m0), specs.max_batch, m0)
    ml = np.where(np.isfinite(specs.max_local_batch) & (specs.max_local_batch > 0),
                  specs.max_local_batch, np.inf)
    return bad, m0, mb, ml


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def estimate(state: EstimatorState, specs: JobSpecs, prior: ThroughputPrior | None = None,
             history: WorkHistory | None = None,
             config: EstimatorConfig | None = None) -> Estimates:
    """Fit every job's throughput model and estimate its remaining work.

    Args:
        state: `EstimatorState` of J jobs (after `update`).
        specs: `JobSpecs` of the same J jobs.
        prior: per-job prior from finished jobs (`prior_from_finished`), or
            None: the cluster default (`ClusterDefault`) for all.
        history: finished jobs' total work (`WorkHistory`) for jobs with no
            declared target (or an unreachable target metric), or None.
        config: settings.

    Returns:
        `Estimates`. Jobs with bad specs, no or bad samples get defined values
        from the prior and flags; only structural errors raise.

    Raises:
        ValueError: ``specs`` or ``prior`` do not have J rows.
    """
    config = config or EstimatorConfig()
    J = state.num_jobs
    if len(specs) != J:
        raise ValueError(f"specs has {len(specs)} jobs, state has {J}")
    bad, m0, mb, ml = _specs_limits(specs)
    flags = np.zeros(J, dtype=np.int64)
    flags[bad] |= int(F.BAD_SPEC)
    ck, cn, cm, w, s1, s2 = _compact(state)
    wsum = w.sum(axis=1)
    has = wsum > 0
    y = np.where(w > 0, s1 / np.where(w > 0, w, 1.0), 0.0)
    within = np.maximum(np.sum(np.where(w > 0, s2, 0.0), axis=1)
                        - np.sum(w * y * y, axis=1), 0.0)

    # Which parts of the model the data identify.
    kmax = np.where(w > 0, ck, 0).max(axis=1)
    kmin = np.where(w > 0, ck, np.iinfo(np.int64).max).min(axis=1)
    m_hi = np.where(w > 0, cm, -np.inf).max(axis=1)
    m_lo = np.where(w > 0, cm, np.inf).min(axis=1)
    single_m = ~(m_hi > m_lo)
    multi = ((w > 0) & (cn > 1)).any(axis=1)
    flags[~has] |= int(F.NO_SAMPLES)
    flags[has & (kmax == kmin)] |= int(F.SINGLE_GPU_COUNT)
    flags[has & single_m] |= int(F.SINGLE_BATCH)
    flags[has & ~multi] |= int(F.NO_MULTI_NODE)
    flags[state.rejected > 0] |= int(F.REJECTED_SAMPLES)

    # tau (1-GPU time at m0) scales the cluster default: from the last fit if
    # there is one, else read off the samples; re-centred after this fit.
    # Not for a job seen at one GPU count k >= 2: its data fix the time there but not
    # how it splits between compute, synchronisation and overlap, nor so tau; a prior
    # re-centred on the last fit's tau followed the fit's split from cycle to cycle (a
    # job seen only at 2 GPUs was predicted slower at 4 than at 2 in some cycles, and
    # hysteresis refused a grow `equi` asked for). Its tau is read off its samples
    # with the cluster default's shape in every cycle, so the prior stays put and the
    # speedup over k is the prior's where the data say nothing of it. (At k = 1 the
    # data never touch synchronisation or gamma, so the fit leaves them at the prior.)
    # A job with no samples has the cluster default's tau in every cycle: its last
    # "fit" is the prior itself, and carrying that prior's tau through u and back
    # moved it by a rounding error each cycle (a waiting job's estimate changed, and
    # was stored again, every cycle).
    log_tau = _log_tau_from_u(state.u, m0)
    one_k = has & (kmax == kmin) & (kmin >= 2)
    known_tau = np.isfinite(log_tau) & ~one_k & has
    if not known_tau.all():  # (new jobs and jobs seen at one k >= 2)
        log_tau = np.where(known_tau, log_tau, _log_tau_from_data(ck, cn, cm, w, y, m0, config))
    mu, sd, given = _prior(m0, log_tau, config, prior)
    flags[given] |= int(F.PRIOR_SUPPLIED)
    u = mu.copy()
    cov = np.zeros((J, NUM_PARAMS, NUM_PARAMS))
    cov[:] = np.eye(NUM_PARAMS)
    cov *= (sd ** 2)[:, :, None]
    noise = np.full(J, config.noise_log_sd)
    rows = np.flatnonzero(has)
    if rows.size:
        u0 = state.u[rows]
        u0 = np.where(np.isfinite(u0).all(axis=1, keepdims=True), u0, mu[rows])
        args = (ck[rows], cn[rows], cm[rows], w[rows], y[rows], within[rows])
        kw = dict(iterations=config.fit_iterations, noise_log_sd=config.noise_log_sd,
                  noise_dof=config.noise_dof)
        fit: ThroughputFit = fit_throughput(*args, mu[rows], sd[rows], u_init=u0, **kw)
        tau_fit = _log_tau_from_u(fit.u, m0[rows])
        moved = ~given[rows] & fit.ok & ~one_k[rows] & (np.abs(tau_fit - log_tau[rows]) > 0.05)
        if moved.any():
            mv = rows[moved]
            mu2, _, _ = _prior(m0[mv], tau_fit[moved], config, None)
            mu[mv] = mu2
            refit = fit_throughput(*(a[moved] for a in args), mu[mv], sd[mv],
                                   u_init=fit.u[moved], **kw)
            fit = ThroughputFit(*(_put(a, moved, b) for a, b in zip(fit, refit, strict=True)))
        u[rows] = fit.u
        cov[rows] = fit.cov
        noise[rows] = np.sqrt(fit.noise_var)
        failed = rows[~fit.ok]
        flags[failed] |= int(F.FIT_FAILED)
        u[failed] = mu[failed]
    pl = fit_power_law(ck, np.where(w > 0, cm, 1.0), w, y, within,
                       p_prior=config.power_law_prior, noise_log_sd=config.noise_log_sd,
                       noise_dof=config.noise_dof)

    phi = state.noise_scale()
    flags[~np.isfinite(phi)] |= int(F.NO_GRADIENT_STATS)
    progress = np.where(np.isfinite(state.progress), np.maximum(state.progress, 0.0), 0.0)
    W, Wsd, rflags = _remaining(state, specs, progress, history, config)
    flags |= rflags
    return Estimates(u=u, cov=cov, noise_sd=noise, power_p=pl.p, power_p_std=pl.p_std, phi=phi,
                     progress=progress, remaining_work=W, remaining_std=Wsd, flags=flags,
                     m0=m0, max_batch=mb, max_local_batch=ml)


def _remaining(state: EstimatorState, specs: JobSpecs, progress: np.ndarray,
               history: WorkHistory | None, config: EstimatorConfig):
    J = state.num_jobs
    W = np.full(J, np.nan)
    Wsd = np.full(J, np.nan)
    flags = np.zeros(J, dtype=np.int64)
    declared = specs.declared_work()
    exact = np.isfinite(declared)
    W[exact] = np.maximum(declared[exact] - progress[exact], 0.0)
    # A target in steps counts the job's own steps, whatever batch it logs them at:
    # W = (target_steps - last step) * m * E(m) at its last batch m. (Converting the
    # target at the spec's batch ended a job logging a larger batch early.)
    steps = exact & ~np.isfinite(specs.declared_work(steps=False)) \
        & np.isfinite(state.last[:, 1]) & np.isfinite(state.last[:, 5]) & (state.last[:, 5] > 0)
    if steps.any():
        m = state.last[steps, 5]
        left = np.maximum(specs.target_steps[steps] - state.last[steps, 1], 0.0)
        W[steps] = left * m * efficiency(m, specs.init_batch[steps], state.noise_scale()[steps])
    Wsd[exact] = 0.0
    flags[exact] |= int(F.REMAINING_EXACT)

    metric = ~exact & np.isfinite(specs.target_metric)
    if metric.any():
        rows = np.flatnonzero(metric)
        sub = predict_target(CurveStats(*(a[rows] for a in state.curve)),
                             np.asarray(config.curve_exponents), specs.target_metric[rows],
                             specs.metric_direction[rows], progress[rows],
                             min_points=config.curve_min_points)
        cp = CurvePrediction(*(_scatter(J, rows, a) for a in sub))
        done = metric & cp.reached
        W[done] = 0.0
        Wsd[done] = 0.0
        flags[done] |= int(F.TARGET_REACHED | F.REMAINING_CURVE)
        short = metric & ~done & ~cp.fitted
        flags[short] |= int(F.CURVE_TOO_SHORT)
        use = metric & ~done & cp.fitted & (cp.p_reach >= 0.5) & np.isfinite(cp.progress)
        W[use] = np.maximum(cp.progress[use] - progress[use], 0.0)
        Wsd[use] = cp.progress_std[use]
        flags[use] |= int(F.REMAINING_CURVE)
        flags[metric & ~done & cp.fitted & ~use] |= int(F.TARGET_UNREACHABLE)

    rest = np.isnan(W)
    if rest.any():
        hist = remaining_from_history(progress, specs.history_group, history,
                                      min_tail=config.history_min_tail)
        use = rest & hist.ok
        W[use] = hist.mean[use]
        Wsd[use] = hist.std[use]
        flags[use] |= int(F.REMAINING_HISTORY)
        rest &= ~use
        dm, ds = remaining_default(progress, config.default_total_work)
        W[rest] = dm[rest]
        Wsd[rest] = ds[rest]
        flags[rest] |= int(F.REMAINING_DEFAULT)
    W = np.where(np.isfinite(W), np.maximum(W, 0.0), config.default_total_work)
    Wsd = np.where(np.isfinite(Wsd), np.maximum(Wsd, 0.0), W)
    return W, Wsd, flags


def _scatter(J: int, rows: np.ndarray, part: np.ndarray) -> np.ndarray:
    """A (J, ...) array with ``part`` at ``rows`` and NaN/False/0 elsewhere."""
    if part.dtype == bool:
        out = np.zeros((J,) + part.shape[1:], dtype=bool)
    else:
        out = np.full((J,) + part.shape[1:], np.nan, dtype=np.float64)
    out[rows] = part
    return out


def nodes_for(k: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Nodes a job of k GPUs spans under the grid's node rule: 1 if k <= g, else ceil(k/g)."""
    k = np.asarray(k, dtype=np.int64)
    return np.where(k <= gpus_per_node, 1, -(-k // gpus_per_node))


def optimistic_cross_node(u: np.ndarray, flags: np.ndarray, ratio: float | None) -> np.ndarray:
    """(J, 7) the ``u`` the speedup table uses: ``u`` where the job has run across
    nodes; elsewhere with cross-node synchronisation capped at ``ratio`` times in-node.

    A job that never ran across nodes (flag ``NO_MULTI_NODE`` or ``NO_SAMPLES``) has
    cross-node parameters from the prior alone, and a pessimistic prior is never
    corrected: no policy picks a size the table says is slower, so the job never
    produces the samples that would show otherwise. Its alpha_n and beta_n are taken
    as at most ``ratio`` times its alpha_r and beta_r (in log space:
    ``u[4] = min(u[4], u[2] + log ratio)``, the same for u[5] and u[3]), so the
    policies try a cross-node size and its samples then decide. The estimate's own
    ``u`` (the posterior, stored and reported) is left as it is; the operator's
    views apply this function to the stored one (`malleable.ops.views.goodput_curve`).

    Source: Pollux's exploration rule, AdaptDL's ``fit_perf_params``
    (``adaptdl/goodput.py``): with no multi-node observation, alpha_n and beta_n
    are set to 1.1 times alpha_r and beta_r. Here it is a cap, so a prior from a
    finished job that did run across nodes and is more optimistic is kept.

    Args:
        u: (J, 7) parameter vectors (`Estimates.u`).
        flags: (J,) int `EstimateFlags` bitmasks (`Estimates.flags`).
        ratio: the cap (>= 1), or None: ``u`` unchanged.

    Returns:
        (J, 7) float64: ``u`` itself when nothing is capped, else a capped copy.
    """
    if ratio is None:
        return u
    unseen = (np.asarray(flags, dtype=np.int64) & int(F.NO_MULTI_NODE | F.NO_SAMPLES)) != 0
    if not unseen.any():
        return u
    u = np.array(u, dtype=np.float64)
    lr = math.log(ratio)
    u[unseen, 4] = np.minimum(u[unseen, 4], u[unseen, 2] + lr)
    u[unseen, 5] = np.minimum(u[unseen, 5], u[unseen, 3] + lr)
    return u


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def speedup_table(est: Estimates, specs: JobSpecs, k: np.ndarray, gpus_per_node: int,
                  config: EstimatorConfig | None = None) -> SpeedupTable:
    """The `SpeedupTable` for J jobs over the candidate grid ``k``.

    For each job and candidate k (on ``n = nodes_for(k, g)`` nodes), the
    goodput-optimal batch and its goodput (`efficiency.optimal_batch`; cross-node
    synchronisation capped for jobs that never ran across nodes:
    `optimistic_cross_node`, ``config.cross_node_optimism``), the goodput's
    standard deviation (delta method), feasibility
    (`table.feasible_mask`, and a batch must fit: no k with
    ``k * max_local_batch < m0``; jobs with a bad spec: only k = 0), remaining
    work, flags and the power-law exponent.

    Args:
        est: `Estimates` of J jobs.
        specs: their `JobSpecs`.
        k: (K,) candidate GPU counts, ascending, k[0] == 0 (`candidate_grid`).
        gpus_per_node: g.

    Returns:
        `SpeedupTable` with goodput in samples-at-m0 per second.

    Raises:
        ValueError: bad grid (see `SpeedupTable`) or gpus_per_node < 1.
    """
    config = config or EstimatorConfig()
    k = np.asarray(k, dtype=np.int64)
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    n = nodes_for(k, gpus_per_node)
    u = optimistic_cross_node(est.u, est.flags, config.cross_node_optimism)
    goodput, batch, _ = optimal_batch(u, k, n, est.m0, est.max_batch, est.max_local_batch,
                                      est.phi, candidates=config.batch_candidates)
    J, K = goodput.shape
    kk = np.broadcast_to(np.maximum(k, 1)[None, :], (J, K))
    nn = np.broadcast_to(n[None, :], (J, K))
    sd_log = log_throughput_std(ThroughputFit(u, est.cov, est.noise_sd ** 2,
                                              np.ones(J, bool)),
                                kk, nn, np.where(batch > 0, batch, 1))
    gstd = np.where(k[None, :] > 0, goodput * sd_log, 0.0)
    bad = specs.bad
    lo = np.where(bad, 1, specs.min_gpus)
    hi = np.where(bad, 1, np.maximum(specs.max_gpus, lo))
    st = np.where(bad, 1, specs.step)
    feasible = feasible_mask(k, lo, hi, st, gpus_per_node)
    # A size on which no batch fits the per-GPU limit is not a size the job can run on
    # (a policy stepping through sizes must not stall on it).
    feasible &= (batch > 0) | (k[None, :] == 0)
    feasible[bad] = k[None, :] == 0
    goodput = np.where(np.isfinite(goodput), np.maximum(goodput, 0.0), 0.0)
    return SpeedupTable(k=k, feasible=feasible, goodput=goodput, batch=batch,
                        remaining_work=est.remaining_work.astype(np.float64),
                        remaining_std=est.remaining_std.astype(np.float64),
                        from_prior=est.from_prior, flags=est.flags.copy(),
                        goodput_std=np.where(np.isfinite(gstd), gstd, 0.0),
                        speedup_exponent=est.power_p.copy())


def cycle(state: EstimatorState, batch: ProgressBatch, specs: JobSpecs, k: np.ndarray,
          gpus_per_node: int, prior: ThroughputPrior | None = None,
          history: WorkHistory | None = None, config: EstimatorConfig | None = None
          ) -> tuple[EstimatorState, Estimates, SpeedupTable]:
    """One estimator cycle: `update`, `estimate`, remember the fit, `speedup_table`.

    Returns:
        (new state, estimates, table).
    """
    config = config or EstimatorConfig()
    state = update(state, batch, specs, config)
    est = estimate(state, specs, prior=prior, history=history, config=config)
    state = state.with_fit(est.u)
    return state, est, speedup_table(est, specs, k, gpus_per_node, config)
