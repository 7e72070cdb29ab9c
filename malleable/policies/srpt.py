"""`srpt`: shortest estimated remaining time first.

Model: each job's remaining time is its remaining work (plus ``risk``
standard deviations of the estimate) divided by its goodput at the largest
size it could get alone, divided by its weight. Jobs in increasing order
of that time each get their maximum (or the largest feasible size that
fits); leftovers go in the same order. Preemptive: a shorter job that
arrives takes GPUs from longer ones at the next decision.

Source: SRPT is optimal for mean response time on one server (Schrage,
Oper. Res. 1968); for parallel jobs with sublinear speedup it is not
(heSRPT, Berg et al., SIGMETRICS'20, is), which is why both are offered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, order_from_keys, realize


class SrptPolicy(Policy):
    """Shortest estimated remaining time (at the job's largest size) first."""

    name = "srpt"

    @dataclass(frozen=True)
    class Params:
        risk: float = 0.0  # remaining work used = mean + risk x std; >= 0

        def __post_init__(self) -> None:
            if not self.risk >= 0:
                raise ValueError(f"risk must be >= 0 (standard deviations added to the "
                                 f"remaining work), got {self.risk}")

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        t = jobs.table
        grid = Grid.build(jobs, capacity)
        rows = np.arange(len(jobs))
        top = np.asarray(grid.top)
        work = np.maximum(t.remaining_work + self.params.risk * t.remaining_std, 0.0)
        rate = t.goodput[rows, top]
        with np.errstate(divide="ignore", invalid="ignore"):
            rt = np.where(rate > 0, work / rate, np.inf) / jobs.weight
        order = order_from_keys(np.where(top > 0, 0, 1), rt)
        wish = np.asarray([grid.klist[c] for c in grid.top], dtype=float)
        gpus = realize(jobs, capacity, wish, order, fill="priority", grid=grid)
        never = cannot_run_reason(grid, jobs, capacity)
        rank = np.empty(len(jobs), np.int64)
        rank[order] = rows
        reasons = [never[j] or f"srpt rank {rank[j]}: {rt[j]:.0f} s left at "
                   f"{grid.klist[grid.top[j]]} GPUs -> {gpus[j]}" for j in range(len(jobs))]
        return finish(jobs, gpus, reasons, order=order)
