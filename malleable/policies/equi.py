"""`equi`: an equal share of the GPUs for every job, within its bounds.

Model: EQUI (processor sharing across jobs). Every job that can be admitted
gets the same number of GPUs L, clipped to its [min, max]; L is the water
level at which the clipped shares sum to the capacity (water-filling).
When the jobs' minimums do not all fit, jobs are admitted in submit order
while their minimums fit. Rounding leftovers go to the jobs with the fewest
GPUs first (so shares stay as equal as node granularity allows).

Source: EQUI (Edmonds, "Scheduling in the dark", STOC'99; Berg et al.,
"Towards optimality in parallel job scheduling", SIGMETRICS'18), the
size-agnostic baseline of the heSRPT paper (Berg et al., SIGMETRICS'20).
"""

from __future__ import annotations

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, realize


def water_level(lo: np.ndarray, hi: np.ndarray, total: float) -> float:
    """The level L with sum(clip(L, lo, hi)) == total (or max(hi) if all fit).

    Args:
        lo, hi: (n,) bounds with lo <= hi; total >= sum(lo).

    Returns:
        L (float); bisection on the piecewise-linear, nondecreasing sum.
    """
    if len(lo) == 0:
        return 0.0
    if hi.sum() <= total:
        return float(hi.max())
    a, b = 0.0, float(hi.max())
    for _ in range(60):
        mid = 0.5 * (a + b)
        if np.clip(mid, lo, hi).sum() > total:
            b = mid
        else:
            a = mid
    return a


class EquiPolicy(Policy):
    """Equal share (water-filling within each job's [min, max])."""

    name = "equi"

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        J = len(jobs)
        grid = Grid.build(jobs, capacity)
        ok = grid.can_run()
        lo = jobs.min_gpus.astype(float)
        hi = np.asarray([grid.klist[c] for c in grid.top], dtype=float)
        admitted = ok & (np.cumsum(np.where(ok, lo, 0.0)) <= capacity.total)
        level = water_level(lo[admitted], hi[admitted], float(capacity.total))
        wish = np.where(admitted, np.clip(level, lo, hi), 0.0)
        order = np.arange(J, dtype=np.int64)
        gpus = realize(jobs, capacity, wish, order, fill="level", grid=grid)
        never = cannot_run_reason(grid, jobs, capacity)
        reasons = [never[j] or (f"equal share {wish[j]:.2f} -> {gpus[j]} GPUs" if admitted[j]
                                else "waits: minimums of earlier jobs fill the cluster")
                   for j in range(J)]
        return finish(jobs, gpus, reasons, order=order, objective=level)
