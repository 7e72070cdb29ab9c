"""Typed records for the estimators: model parameters, priors, settings, flags.

The throughput model is Pollux's iteration-time model (Qiao et al., OSDI'21,
section 3.2; petuum/adaptdl ``goodput.py``, branch ``osdi21-artifact``). For a
job on k GPUs spread over n nodes with global batch m (per-GPU batch m/k):

    T_compute = alpha_c + beta_c * (m / k)                       seconds
    T_sync    = 0                                   if k == 1
              = alpha_r + beta_r * (k - 2)          if n == 1 (within a node)
              = alpha_n + beta_n * (k - 2)          if n >  1 (across nodes)
    T_iter    = (T_compute^gamma + T_sync^gamma)^(1/gamma)       seconds
    X(k,n,m)  = m / T_iter                                       samples/s

gamma in [1, 10] says how much synchronisation overlaps computation (1: none,
they add up; 10: almost fully, T_iter ~ max of the two).

Internally a job's parameters are the vector ``u`` of length 7:
``log(alpha_c, beta_c, alpha_r, beta_r, alpha_n, beta_n)`` and
``logit((gamma - 1) / 9)``, so that every parameter stays in its domain while a
Gauss-Newton step moves freely.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: Upper bound of the overlap exponent gamma (Pollux caps it at 10: close
#: enough to max() and numerically tame).
GAMMA_MAX = 10.0
#: Number of entries in a parameter vector ``u``.
NUM_PARAMS = 7
#: Names of the entries of ``u``, in order.
PARAM_NAMES = ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n", "gamma")


class ThroughputParams(NamedTuple):
    """Parameters of the Pollux iteration-time model, one value per job.

    Each field is a float or a (J,) float64 array; all times are seconds.

    Attributes:
        alpha_c: constant part of the compute time per iteration (s):
            ``T_compute = alpha_c + beta_c * m/k``.
        beta_c: compute time per sample of per-GPU batch (s/sample).
        alpha_r: synchronisation time with 2 replicas inside one node (s).
        beta_r: extra synchronisation time per replica beyond 2, inside one
            node (s/replica): ``T_sync = alpha_r + beta_r * (k - 2)``.
        alpha_n: synchronisation time with 2 replicas across nodes (s).
        beta_n: extra synchronisation time per replica beyond 2, across nodes
            (s/replica): ``T_sync = alpha_n + beta_n * (k - 2)``.
        gamma: overlap exponent in [1, 10]:
            ``T_iter = (T_compute^gamma + T_sync^gamma)^(1/gamma)``.

    Source: Qiao et al., "Pollux", OSDI'21, section 3.2 (the same parameters
    as adaptdl's ``PerfParams``).
    """

    alpha_c: np.ndarray
    beta_c: np.ndarray
    alpha_r: np.ndarray
    beta_r: np.ndarray
    alpha_n: np.ndarray
    beta_n: np.ndarray
    gamma: np.ndarray

    def to_u(self) -> np.ndarray:
        """(J, 7) internal vector: logs of the six times, logit of (gamma-1)/9.

        Raises:
            ValueError: a non-positive time or a gamma outside (1, 10).
        """
        times = np.stack([np.asarray(getattr(self, f), dtype=np.float64)
                          for f in PARAM_NAMES[:6]], axis=-1)
        gamma = np.asarray(self.gamma, dtype=np.float64)
        if np.any(~(times > 0)):
            raise ValueError(f"throughput parameters must be > 0 seconds, got {times}")
        if np.any(~((gamma > 1) & (gamma < GAMMA_MAX))):
            raise ValueError(f"gamma must be in (1, {GAMMA_MAX}), got {gamma}")
        frac = (gamma - 1.0) / (GAMMA_MAX - 1.0)
        return np.concatenate([np.log(times), np.log(frac / (1 - frac))[..., None]], axis=-1)

    @classmethod
    def from_u(cls, u: np.ndarray) -> ThroughputParams:
        """Inverse of `to_u`: u of shape (..., 7) to parameters of shape (...)."""
        u = np.asarray(u, dtype=np.float64)
        times = np.exp(u[..., :6])
        gamma = 1.0 + (GAMMA_MAX - 1.0) / (1.0 + np.exp(-u[..., 6]))
        return cls(*(times[..., i] for i in range(6)), gamma)


class ThroughputPrior(NamedTuple):
    """A prior over a job's throughput parameters, e.g. from finished jobs.

    Attributes:
        mean: `ThroughputParams` with (J,) fields, the prior's central values
            (for a job with no data these are what the table uses).
        log_sd: (J, 7) float64, standard deviation of each entry of ``u``
            (log of the times; logit of gamma's position in [1, 10]). 0.3
            means "within about a factor 1.35".
        given: (J,) bool, which jobs actually have such a prior. For the others
            the cluster default (`ClusterDefault`) applies and ``mean`` and
            ``log_sd`` are ignored.

    Build one from fitted parameters of finished jobs with `prior_from_finished`.
    """

    mean: ThroughputParams
    log_sd: np.ndarray
    given: np.ndarray


MIN_PRIOR_LOG_SD = 0.2
"""Default floor of a finished-jobs prior's log sd (`prior_from_finished`, `group_prior`)."""


def prior_from_finished(params: ThroughputParams, group: np.ndarray, job_group: np.ndarray,
                        min_log_sd: float = MIN_PRIOR_LOG_SD,
                        log_sd: np.ndarray | None = None) -> ThroughputPrior:
    """A prior per job from the fitted parameters of finished jobs of its group.

    The group is whatever the caller matches on (same job name, user and
    model). For each job whose group has finished jobs, the prior mean is the
    geometric mean of their parameters (mean of ``u``). Its variance, per
    entry of ``u``, is the spread of the finished jobs' values plus, where
    ``log_sd`` is given, the mean of their own posterior variances (the law of
    total variance: Var[u] = Var(E[u | job]) + E[Var(u | job)]); the standard
    deviation is at least ``min_log_sd``. Without ``log_sd`` a parameter that
    the finished jobs never identified (in-node synchronisation of jobs that
    only ran across nodes, or a compute/sync split their data could not
    separate) would be passed on as known to within ``min_log_sd``, and could
    overrule a new job's own samples.

    Args:
        params: `ThroughputParams` with (H,) fields, one per finished job (the
            ``params`` of their last `Estimates`).
        group: (H,) int, the group of each finished job.
        job_group: (J,) int, the group of each job to estimate (-1: none).
        min_log_sd: floor of the prior's log standard deviation.
        log_sd: (H, 7) posterior standard deviation of each finished job's
            ``u`` (`Estimates.log_sd` of their last estimates), or None: only
            the spread between the finished jobs counts.

    Returns:
        `ThroughputPrior` for the J jobs; ``given`` is False where the job's
        group has no finished job (the cluster default then applies).

    Raises:
        ValueError: ``log_sd`` is not (H, 7).
    """
    return group_prior(params, group, min_log_sd=min_log_sd, log_sd=log_sd).for_jobs(job_group)


class GroupPrior(NamedTuple):
    """The prior of each group of finished jobs (`group_prior`), before it is given to jobs.

    `prior_from_finished` is ``group_prior(...).for_jobs(job_group)``; a caller
    whose finished jobs change less often than its jobs (the daemon) keeps one
    and calls `for_jobs` every cycle.

    Attributes:
        groups: (G,) int64, ascending, the groups that have finished jobs.
        mean_u: (G, 7) mean of their ``u`` per group.
        log_sd: (G, 7) prior standard deviation per group (already floored
            at ``min_log_sd``).
        min_log_sd: the floor, also the sd given to jobs without a group prior.
    """

    groups: np.ndarray
    mean_u: np.ndarray
    log_sd: np.ndarray
    min_log_sd: float

    def for_jobs(self, job_group: np.ndarray) -> ThroughputPrior:
        """`ThroughputPrior` for J jobs of groups ``job_group`` ((J,) int, -1: none).

        A job whose group has no finished job gets ``given`` False (mean u = 0,
        sd = ``min_log_sd``, which `ThroughputPrior` says are ignored).
        """
        job_group = np.asarray(job_group, dtype=np.int64)
        J = job_group.shape[0]
        mean_u = np.zeros((J, NUM_PARAMS))
        sd = np.full((J, NUM_PARAMS), self.min_log_sd)
        given = np.zeros(J, dtype=bool)
        G = self.groups.shape[0]
        if G and J:
            pos = np.minimum(np.searchsorted(self.groups, job_group), G - 1)
            given = (job_group >= 0) & (self.groups[pos] == job_group)
            mean_u[given] = self.mean_u[pos[given]]
            sd[given] = self.log_sd[pos[given]]
        return ThroughputPrior(ThroughputParams.from_u(mean_u), sd, given)


def group_prior(params: ThroughputParams, group: np.ndarray,
                min_log_sd: float = MIN_PRIOR_LOG_SD,
                log_sd: np.ndarray | None = None) -> GroupPrior:
    """The per-group part of `prior_from_finished` (same arguments but ``job_group``).

    Per group of ``group``: the mean of the finished jobs' ``u`` and the
    standard deviation described in `prior_from_finished` (spread between
    them plus the mean of their posterior variances, at least ``min_log_sd``).

    Returns:
        `GroupPrior` over the groups present in ``group`` (ascending).

    Raises:
        ValueError: ``log_sd`` is not (H, 7).
    """
    group = np.asarray(group, dtype=np.int64)
    u = params.to_u().reshape(-1, NUM_PARAMS) if group.size else np.zeros((0, NUM_PARAMS))
    post_var = np.zeros_like(u)
    if log_sd is not None:
        post = np.asarray(log_sd, dtype=np.float64)
        if post.shape != u.shape:
            raise ValueError(f"log_sd must have shape {u.shape}, got {post.shape}")
        post_var = np.where(np.isfinite(post), post, 0.0) ** 2
    groups = np.unique(group)
    mean_u = np.zeros((groups.shape[0], NUM_PARAMS))
    sd = np.zeros((groups.shape[0], NUM_PARAMS))
    for i, g in enumerate(groups):
        rows = group == g
        mean_u[i] = u[rows].mean(axis=0)
        between = u[rows].var(axis=0, ddof=1) if rows.sum() > 1 else np.zeros(NUM_PARAMS)
        sd[i] = np.maximum(np.sqrt(between + post_var[rows].mean(axis=0)), min_log_sd)
    return GroupPrior(groups, mean_u, sd, min_log_sd)


@dataclass(frozen=True)
class ClusterDefault:
    """The cluster default prior, for jobs without a prior from finished jobs.

    Absolute times differ by orders of magnitude between models, so the
    default is stated relative to ``tau``, the job's iteration time on one GPU
    at its initial batch m0. ``tau`` is estimated from the job's own samples
    (empirical Bayes: the geometric mean of observed iteration time over the
    default model's prediction); a job with no samples at all gets
    ``tau = no_data_tau`` seconds and the flag ``NO_SAMPLES``.

    Defaults are the geometric means over the six models of Pollux's T4
    profiles (fits of all their placements and scalability runs, printed by
    benchmarks/estimators_validation.py; see docs/estimators.md), rounded;
    ``log_sd`` is about their spread across the models (standard deviation of
    the logs: 1.37, -, 0.82, 1.02, 0.67, 0.85), widened a little for clusters
    unlike Pollux's 4 x T4 nodes on 50 Gb/s Ethernet.

    Attributes:
        compute_fixed: alpha_c / tau: fixed share of the 1-GPU iteration at m0.
        sync_intra: alpha_r / tau: 2-GPU in-node synchronisation over tau.
        sync_intra_per_gpu: beta_r / tau.
        sync_inter: alpha_n / tau: 2-GPU cross-node synchronisation over tau.
        sync_inter_per_gpu: beta_n / tau.
        gamma: overlap exponent.
        log_sd: prior standard deviation of each entry of ``u``.
        no_data_tau: tau (s) for a job with no usable samples.
    """

    compute_fixed: float = 0.16
    sync_intra: float = 0.24
    sync_intra_per_gpu: float = 0.07
    sync_inter: float = 1.2
    sync_inter_per_gpu: float = 0.02
    gamma: float = 2.1
    log_sd: tuple[float, ...] = (1.4, 1.0, 1.0, 1.2, 1.0, 1.2, 2.0)
    no_data_tau: float = 1.0

    def params(self, tau: np.ndarray, m0: np.ndarray) -> ThroughputParams:
        """The default parameters for jobs with 1-GPU time ``tau`` (s) at batch ``m0``.

        Args:
            tau: (J,) float64 seconds, > 0.
            m0: (J,) float64 samples, > 0.
        """
        tau = np.asarray(tau, dtype=np.float64)
        m0 = np.asarray(m0, dtype=np.float64)
        one = np.ones_like(tau)
        return ThroughputParams(
            alpha_c=self.compute_fixed * tau,
            beta_c=(1.0 - self.compute_fixed) * tau / m0,
            alpha_r=self.sync_intra * tau,
            beta_r=self.sync_intra_per_gpu * tau,
            alpha_n=self.sync_inter * tau,
            beta_n=self.sync_inter_per_gpu * tau,
            gamma=self.gamma * one,
        )


#: Settings of `EstimatorConfig` that no longer exist -> what to use instead.
_REMOVED_KEYS = {
    "gns_half_life_s": (
        "gradient statistics are smoothed in training progress, not wall seconds; set "
        "gns_half_life_steps (optimizer steps at the initial batch m0, default 693 = "
        "AdaptDL's 0.999 per step). A wall-time half-life depended on how often a job "
        "reports and on time compression (docs/estimators.md, section 4)"),
}


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings of the estimators (all have documented defaults).

    Attributes:
        half_life_s: recency weighting of throughput samples: an interval that
            ended this many seconds before the job's newest one counts half.
        gns_half_life_steps: recency weighting of gradient statistics
            (grad_sqr, grad_var), in training progress, not wall time: the
            statistics a job reported this many optimizer steps at its initial
            batch m0 ago count half. The unit is m0 samples processed (one step
            at m0 = 1; a step at global batch m counts m/m0), so the estimate
            does not depend on how often a job reports, how fast it runs or on
            time compression. Default 693 steps: AdaptDL's own smoothing of
            these statistics, a factor 0.999 per step at m0 (``theta =
            0.999 ** scale`` with ``scale`` = batch / m0, petuum/adaptdl
            ``adaptdl/torch/gradient_noise_scale.py``), half-life
            ln 2 / -ln 0.999 = 692.8 steps. Replaces ``gns_half_life_s``
            (wall seconds), which now raises ValueError.
        max_configs: configurations (k, n, m) remembered per job; when full,
            the one with the least weight is replaced.
        noise_log_sd: prior standard deviation of one interval's log iteration
            time around the model (measurement noise), 0.1 = 10 %.
        noise_dof: weight of that prior noise against the observed scatter
            (pseudo-observations).
        fit_iterations: Levenberg-Marquardt iterations per call (the fit is
            warm-started from the previous call's solution).
        batch_candidates: global batch sizes tried per (job, k) when searching
            the goodput-optimal batch (geometric grid between the bounds).
        curve_exponents: exponents alpha of the learning-curve power law
            ``metric = a + b * (p/p_s)^-alpha`` tried by the fit.
        curve_min_points: metric samples needed to fit a learning curve.
        power_law_prior: (mean, sd) of the prior on p in ``X ~ k^p`` for the
            power-law fit, used where one GPU count was observed.
        history_min_tail: finished jobs whose total work exceeds a job's
            attained work needed for the conditional estimate.
        default_total_work: total work (samples at m0) assumed for a job with
            no target, no history and no progress yet.
        cluster: the cluster default prior (`ClusterDefault`).
        cross_node_optimism: for a job that never ran across nodes, the speedup
            table takes its cross-node synchronisation (alpha_n, beta_n) as at most
            this many times its in-node synchronisation (alpha_r, beta_r), so that
            policies try a cross-node size and its samples correct the estimate
            (Pollux's exploration; AdaptDL's ``fit_perf_params`` uses 1.1). >= 1;
            None: the posterior (for such a job, the prior) as it is.
    """

    half_life_s: float = 3600.0
    gns_half_life_steps: float = 693.0
    max_configs: int = 32
    noise_log_sd: float = 0.1
    noise_dof: float = 4.0
    fit_iterations: int = 12
    batch_candidates: int = 16
    curve_exponents: tuple[float, ...] = tuple(np.round(np.geomspace(0.1, 3.0, 48), 5))
    curve_min_points: int = 3
    power_law_prior: tuple[float, float] = (0.8, 0.5)
    history_min_tail: int = 3
    default_total_work: float = 1e7
    cluster: ClusterDefault = ClusterDefault()
    cross_node_optimism: float | None = 1.1

    def __new__(cls, *args, **kwargs):
        for old_key, message in _REMOVED_KEYS.items():
            if old_key in kwargs:
                raise ValueError(f"EstimatorConfig.{old_key} was removed: {message}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        checks = {
            "half_life_s": self.half_life_s > 0,
            "gns_half_life_steps": self.gns_half_life_steps > 0,
            "max_configs": self.max_configs >= 1, "noise_log_sd": self.noise_log_sd > 0,
            "noise_dof": self.noise_dof > 0, "fit_iterations": self.fit_iterations >= 1,
            "batch_candidates": self.batch_candidates >= 2,
            "curve_min_points": self.curve_min_points >= 3,
            "history_min_tail": self.history_min_tail >= 1,
            "default_total_work": self.default_total_work > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"EstimatorConfig.{name} is out of range: {getattr(self, name)!r}")
        c = self.cross_node_optimism
        if c is not None and not (isinstance(c, int | float) and not isinstance(c, bool)
                                  and math.isfinite(c) and c >= 1):
            raise ValueError(f"EstimatorConfig.cross_node_optimism must be >= 1 or None, "
                             f"got {c!r}")
        if not self.curve_exponents or min(self.curve_exponents) <= 0:
            raise ValueError(f"EstimatorConfig.curve_exponents must be positive, "
                             f"got {self.curve_exponents!r}")


class EstimateFlags(enum.IntFlag):
    """Why an estimate is less than a fit to the job's own data (bitmask per job).

    ``SpeedupTable.flags`` holds one of these per job; ``from_prior`` is set
    where ``NO_SAMPLES`` or ``FIT_FAILED`` is.
    """

    NONE = 0
    NO_SAMPLES = 1            #: no usable throughput interval: throughput from the prior
    SINGLE_GPU_COUNT = 2      #: all intervals at one k: speedup over k from the prior
    SINGLE_BATCH = 4          #: one global batch size: batch scaling from the prior
    NO_MULTI_NODE = 8         #: no interval across nodes: cross-node sync from the prior
    #: (capped in the speedup table: `EstimatorConfig.cross_node_optimism`)
    REJECTED_SAMPLES = 16     #: some samples were dropped (NaN, zero/negative rates, ...)
    FIT_FAILED = 32           #: the fit gave non-finite values; the prior was used
    NO_GRADIENT_STATS = 64    #: phi unknown: batch kept at m0 and E = 1
    PRIOR_SUPPLIED = 128      #: a prior from finished jobs was used, not the cluster default
    REMAINING_EXACT = 256     #: remaining work from a declared steps/samples/epochs target
    REMAINING_CURVE = 512     #: remaining work from the learning curve and a target metric
    REMAINING_HISTORY = 1024  #: remaining work from finished jobs' total work
    REMAINING_DEFAULT = 2048  #: no target, curve or history: attained work or the default
    TARGET_UNREACHABLE = 4096  #: the fitted curve does not reach the target metric
    TARGET_REACHED = 8192     #: the target metric has been reached: remaining work 0
    CURVE_TOO_SHORT = 16384   #: a target metric but too few metric samples to fit a curve
    BAD_SPEC = 32768          #: the job's spec is unusable (e.g. m0 <= 0): only k = 0 feasible
