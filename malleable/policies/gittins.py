"""`gittins`: Gittins-index priority for jobs of unknown size, sized by their speedup curves.

Model: job sizes S (total GPU-seconds of service a job needs) are unknown
but drawn from the distribution of finished jobs' attained service
(``Context.size_history``). For a job that has attained a GPU-seconds, the
Gittins index is

    G(a) = sup_{D > 0}  P(S - a <= D | S > a) / E[min(S - a, D) | S > a],

the best achievable rate of completion per unit of further service
(Gittins, J. R. Stat. Soc. B 1979; for M/G/1 scheduling, Harchol-Balter,
"Performance Modeling and Design of Computer Systems", 2013, and Scully
and Harchol-Balter's SOAP framework). Serving the highest index first
minimises mean response time on one server among size-blind policies. For
the empirical distribution the supremum is attained at a quantum ending on
a sample, so G(a) = max_m m / (sum_{i<=m} (s_(i) - a) + (n_a - m)(s_(m) - a))
over the n_a samples s_(1) <= ... above a (computed exactly, vectorised).

Tiresias (Gu et al., NSDI'19, section 4.2.2) uses this index with 2D
attained service (GPU-seconds) for rigid jobs. For malleable jobs the
index is combined with each job's speedup curve: running on k GPUs a job
receives service at s(k) = goodput(k) / goodput(1) one-GPU-equivalents
per second, so its expected completion rate is w G(a) s(k). GPUs are
handed out greedily by the largest gain in that rate per GPU,
w G(a) (s(k') - s(k)) / (k' - k), which maximises sum_j w_j G_j s_j(k_j);
with linear speedup this is exactly Gittins priority order, with
sublinear speedup it spreads GPUs as the curves warrant. As the index
moves with every second of service, a running job's rate at any other size
is discounted by Pollux's restart factor (`malleable.policies.restarts`),
so GPUs move only when the gain outweighs the restart
(``restart_penalty``).

The index is evaluated at the job's attained service rounded down to a
level base * ratio^i (360 GPU-s x 2^i by default), as Tiresias discretises
service into priority queues: the index, and so the allocation, changes only
when a job's service crosses a level, not at every decision.

No history (fewer than ``min_history`` samples): G(a) = 1 / (a +
``prior_scale_s``), the index of a decreasing-hazard prior, i.e. least
attained service first. A job that has outlived every sample gets the
smallest index (it still receives GPUs no one else can use).

Starvation: a pending job that waited ``starve_s`` seconds is placed first
(`malleable.policies.starvation`).

Source: Gittins (1979); Gu et al., NSDI'19 (Tiresias, 2D-Gittins index);
Harchol-Balter (2013) on size-based scheduling with unknown sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.curves import speedup
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, order_from_keys, realize
from malleable.policies.restarts import current_column, penalise_changes
from malleable.policies.starvation import promoted, starvation_keys


def gittins_index(attained: np.ndarray, history: np.ndarray, *, max_samples: int = 256,
                  chunk: int = 1 << 21) -> np.ndarray:
    """Gittins index of each job from the empirical size distribution.

    Args:
        attained: (J,) float, service each job has received (same unit as history).
        history: (H,) float, sizes of finished jobs (H >= 1). If H exceeds
            ``max_samples`` the distribution is represented by that many
            evenly spaced quantiles.
        chunk: bound on the work matrix per step (memory).

    Returns:
        (J,) float64 index, completions per unit of service; NaN where the job
        has attained at least every sample (the distribution says nothing).

    Source: Gittins (1979); the empirical form as in Tiresias (NSDI'19).
    """
    s = np.sort(np.asarray(history, dtype=np.float64))
    if len(s) > max_samples:
        s = np.quantile(s, (np.arange(max_samples) + 0.5) / max_samples)
    n = len(s)
    cs = np.concatenate([[0.0], np.cumsum(s)])
    vals, inverse = np.unique(np.asarray(attained, dtype=np.float64), return_inverse=True)
    out = np.full(len(vals), np.nan)
    step = max(1, chunk // max(n, 1))
    i = np.arange(n)
    for lo in range(0, len(vals), step):
        a = vals[lo:lo + step][:, None]
        idx = np.searchsorted(s, a[:, 0], side="right")[:, None]
        m = i[None, :] - idx + 1
        valid = m >= 1
        d = s[None, :] - a
        cum = cs[1:][None, :] - cs[idx] - m * a
        denom = cum + (n - idx - m) * d
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(valid & (denom > 0), m / denom, -np.inf)
        best = ratio.max(axis=1)
        out[lo:lo + step] = np.where(np.isfinite(best), best, np.nan)
    return out[inverse]


class GittinsPolicy(Policy):
    """Gittins index (from finished jobs' sizes) x speedup curve, greedy per GPU."""

    name = "gittins"
    uses_size_history = True

    @dataclass(frozen=True)
    class Params:
        min_history: int = 10         # fewer finished jobs: fall back to the LAS-like prior
        prior_scale_s: float = 3600.0  # GPU-s scale of the prior index 1 / (a + scale)
        window: int = 2               # feasible sizes one greedy step may jump
        restart_penalty: bool = True  # discount resizing a running job (Pollux's factor)
        level_base_s: float = 360.0   # attained service is rounded down to base * ratio^i
        level_ratio: float = 2.0      # (Tiresias-like levels; ratio 1 = no rounding)
        starve_s: float = 3600.0      # a pending job waiting this long is placed first

        def __post_init__(self) -> None:
            for name in ("prior_scale_s", "starve_s", "level_base_s"):
                if not getattr(self, name) > 0:
                    raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
            if self.window < 1:
                raise ValueError(f"window must be >= 1, got {self.window}")
            if self.min_history < 0:
                raise ValueError(f"min_history must be >= 0, got {self.min_history}")
            if not self.level_ratio >= 1:
                raise ValueError(f"level_ratio must be >= 1, got {self.level_ratio}")

    def levels(self, attained: np.ndarray) -> np.ndarray:
        """(J,) attained service rounded down to 0 or base * ratio^i (unchanged if ratio = 1)."""
        prm = self.params
        a = np.asarray(attained, dtype=np.float64)
        if prm.level_ratio == 1.0:
            return a
        with np.errstate(divide="ignore"):
            i = np.floor(np.log(a / prm.level_base_s) / np.log(prm.level_ratio) + 1e-12)
        return np.where(a >= prm.level_base_s, prm.level_base_s * prm.level_ratio ** i, 0.0)

    def index(self, jobs: JobSet, ctx: Context) -> np.ndarray:
        """(J,) weighted Gittins index per GPU-second of service (always > 0)."""
        a = self.levels(jobs.attained)
        h = ctx.size_history
        if len(h) >= max(self.params.min_history, 1):
            g = gittins_index(a, h)
            floor = np.nanmin(g) if np.any(np.isfinite(g)) else 1.0 / (h.max() + 1.0)
            g = np.where(np.isfinite(g), g, floor * 1e-3)
        else:
            g = 1.0 / (a + self.params.prior_scale_s)
        return np.maximum(g, 1e-300) * jobs.weight

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        prm = self.params
        grid = Grid.build(jobs, capacity)
        G = self.index(jobs, ctx)
        value = G[:, None] * speedup(jobs.table)
        anchor = None
        if prm.restart_penalty:
            value = penalise_changes(value, jobs)
            anchor = current_column(jobs, grid.mask)
        up = promoted(jobs, prm.starve_s)
        group, wait = starvation_keys(jobs, prm.starve_s)
        order = order_from_keys(group, wait, -G)
        wish = np.where(up, jobs.min_gpus, 0).astype(float)
        gpus = realize(jobs, capacity, wish, order, fill="value", value=value, grid=grid,
                       hamilton=False, window=prm.window, anchor=anchor)
        rate = value[np.arange(len(jobs)), jobs.table.column(gpus)]
        never = cannot_run_reason(grid, jobs, capacity)
        reasons = []
        for j in range(len(jobs)):
            tag = "starving, placed first; " if up[j] else ""
            reasons.append(never[j] or f"gittins: {tag}index {G[j]:.3g}/GPU-s, "
                                       f"attained {jobs.attained[j]:.0f} GPU-s: {gpus[j]} GPUs")
        return finish(jobs, gpus, reasons, order=order, urgent=up,
                      objective=float(rate.sum()))
