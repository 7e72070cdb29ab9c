"""`hesrpt`: the optimal allocation for known sizes and speedup k^p (heSRPT).

Model (Berg, Vesilo, Harchol-Balter, "heSRPT: Optimal Parallel Scheduling of
Jobs With Known Sizes", SIGMETRICS'20, arXiv:1903.09346): N servers, m jobs
present, job sizes x known, every job speeds up as s(k) = k^p with 0 < p <
1, no arrivals. Sort the jobs from largest (i = 1) to smallest (i = m); the
allocation minimising the mean flow time gives job i the share

    theta_i = (i/m)^(1/(1-p)) - ((i-1)/m)^(1/(1-p))

of the N servers (the paper's main theorem), re-evaluated at every completion, and
the optimal total flow time is

    T* = N^-p * sum_i x_i * (i^(1/(1-p)) - (i-1)^(1/(1-p)))^(1-p)

(reported here as the allocation's objective, in seconds, for the jobs in
the model). Jobs complete in shortest-first order, yet all share the GPUs.

Mapping to this project: a job's size is its remaining work expressed in
seconds on one GPU, x = (W + risk * std) / goodput(1); p is one exponent for
all jobs, the ``p`` parameter or, if unset, the median of the per-job fits
of goodput(k) ~ a k^p to the table (`curves.fit_power_law`; with
``p_from="samples"``, the estimators' fit of throughput ~ k^p to the job's
own samples, ``SpeedupTable.speedup_exponent``, where it has one). The shares
times the free GPUs are the wish; `feasibility.realize` rounds them to
feasible integers without losing capacity (largest remainder first, then
leftover GPUs where they cut a job's remaining time most per GPU). Jobs
that cannot fit at all, or have no work left, are not among the m.
Weights are not part of the model and are ignored.

Source: Berg, Vesilo and Harchol-Balter, SIGMETRICS'20 (arXiv:1903.09346).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.curves import fit_power_law, one_gpu_seconds
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, order_from_keys, realize


def hesrpt_shares(sizes: np.ndarray, p: float) -> np.ndarray:
    """heSRPT's optimal shares of the servers, in the order the sizes are given.

    Args:
        sizes: (m,) job sizes (any positive unit; only their order matters).
        p: speedup exponent, 0 < p < 1.

    Returns:
        (m,) float64 shares summing to 1; the i-th largest size gets
        (i/m)^(1/(1-p)) - ((i-1)/m)^(1/(1-p)). Equal sizes are ordered by
        position (the earlier one counts as the larger).

    Raises:
        ValueError: p outside (0, 1).

    Source: Berg et al., SIGMETRICS'20 (the optimal allocation theorem).
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"heSRPT needs 0 < p < 1, got p = {p}")
    x = np.asarray(sizes, dtype=np.float64)
    m = len(x)
    if m == 0:
        return np.zeros(0)
    c = 1.0 / (1.0 - p)
    largest_first = np.lexsort((np.arange(m), -x))
    i = np.arange(1, m + 1, dtype=np.float64)
    theta = (i / m) ** c - ((i - 1) / m) ** c
    out = np.empty(m)
    out[largest_first] = theta
    return out


def hesrpt_total_flow_time(sizes: np.ndarray, p: float, servers: float) -> float:
    """The optimal total flow time of heSRPT (seconds if sizes are one-server seconds).

    T* = servers^-p * sum_i x_(i) * (i^c - (i-1)^c)^(1-p), c = 1/(1-p), with
    x_(1) the largest size. Source: Berg et al., SIGMETRICS'20 (the optimal
    total flow time that follows from the allocation theorem; our tests check
    it against a fluid simulation).
    """
    x = np.sort(np.asarray(sizes, dtype=np.float64))[::-1]
    c = 1.0 / (1.0 - p)
    i = np.arange(1, len(x) + 1, dtype=np.float64)
    return float(np.sum(x * (i ** c - (i - 1) ** c) ** (1 - p)) / servers ** p)


class HesrptPolicy(Policy):
    """heSRPT shares (closed form), rounded to feasible GPU counts."""

    name = "hesrpt"

    @dataclass(frozen=True)
    class Params:
        p: float | None = None  # speedup exponent; None = median of per-job fits
        p_from: Literal["goodput", "samples"] = "goodput"  # per-job fit used when p is None
        risk: float = 0.0       # size = (mean + risk x std of remaining work) / goodput(1); >= 0

        def __post_init__(self) -> None:
            if self.p is not None and not 0.0 < self.p < 1.0:
                raise ValueError(f"p must be in (0, 1), got {self.p}")
            if not self.risk >= 0:
                raise ValueError(f"risk must be >= 0 (standard deviations added to the "
                                 f"remaining work), got {self.risk}")

    def model(self, jobs: JobSet, capacity: Capacity) -> tuple[np.ndarray, np.ndarray, float]:
        """The continuous heSRPT answer before rounding.

        Returns:
            (gpus, sizes, p): (J,) float GPUs = share x free GPUs (0 for jobs
            outside the model), (J,) sizes in one-GPU seconds, and the p used.
        """
        t = jobs.table
        grid = Grid.build(jobs, capacity)
        work = np.maximum(t.remaining_work + self.params.risk * t.remaining_std, 0.0)
        sizes = one_gpu_seconds(t, work)
        inside = grid.can_run() & (work > 0) & np.isfinite(sizes)
        if self.params.p is not None:
            p = self.params.p
        else:
            fits = fit_power_law(t)
            if self.params.p_from == "samples":
                est = np.asarray(getattr(t, "speedup_exponent", np.full(len(jobs), np.nan)))
                ok = np.isfinite(est) & (est > 0) & (est < 1)
                fits = np.where(ok, est, fits)
            p = float(np.median(fits[inside])) if inside.any() else 0.5
        gpus = np.zeros(len(jobs))
        gpus[inside] = hesrpt_shares(sizes[inside], p) * capacity.total
        return gpus, sizes, p

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        t = jobs.table
        wish, sizes, p = self.model(jobs, capacity)
        inside = wish > 0
        order = order_from_keys(np.where(inside, 0, 1), sizes)
        grid = Grid.build(jobs, capacity)
        value = -t.remaining_time
        gpus = realize(jobs, capacity, wish, order, fill="value", value=value, grid=grid)
        objective = hesrpt_total_flow_time(sizes[inside], p, capacity.total) if inside.any() \
            else 0.0
        never = cannot_run_reason(grid, jobs, capacity)
        reasons = [never[j] or (f"hesrpt p={p:.2f}: share {wish[j]:.2f} GPUs -> {gpus[j]}"
                                if inside[j] else f"no work left: {gpus[j]} GPUs")
                   for j in range(len(jobs))]
        return finish(jobs, gpus, reasons, order=order, objective=objective)
