"""`srpt`: shortest estimated remaining time first.

Model: each job's remaining time is its remaining work (plus ``risk``
standard deviations of the estimate) divided by its goodput at its fastest
size (the feasible size of the highest goodput that it could get alone),
divided by its weight. Jobs in increasing order of that time each get their
fastest size (or the largest feasible size below it that fits); leftovers go
in the same order, up to each job's fastest size. Preemptive: a shorter job
that arrives takes GPUs from longer ones at the next decision.

The fastest size, not the largest: SRPT for parallel jobs gives a job all
the servers it can use, assuming (as Berg et al. do) a speedup that never
falls as servers are added. The Pollux throughput model's goodput peaks
(synchronisation grows with the GPU count; a fixed batch is split ever finer),
and GPUs beyond the peak make the job slower, not faster: on Pollux's
workload-1, 79 % of the sizes the largest-size rule chose were past the job's
goodput peak, often 64 GPUs at about a fifth of the goodput the same job had
on 4 (``docs/policies.md``).

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
    """Shortest estimated remaining time (at the job's fastest size) first."""

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
        # Sizes above a job's fastest one are dropped: they only slow it down.
        grid = Grid.build(jobs, capacity)
        grid = grid.capped(grid.fastest(t.goodput))
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
