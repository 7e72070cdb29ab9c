"""`static`: no reallocation; what plain Slurm does (the baseline).

Model: jobs are rigid once started. A running job keeps the GPUs it holds; a
pending job starts only at the size it requested (``JobSet.requested``,
clipped to its [min, max] and rounded down to a feasible size), in FIFO
order, if that fits the GPUs left; otherwise it waits. With ``backfill``
(default), later pending jobs that fit start even when an earlier one does
not (an optimistic model of Slurm's backfill scheduler, which needs time
limits to be safe); without it, the first pending job that does not fit
blocks the queue (``sched/builtin``). Free GPUs are never handed out beyond
a job's request.

Source: Slurm's scheduler (https://slurm.schedmd.com/sched_config.html,
``sched/builtin`` and ``sched/backfill``); the baseline of every malleable
scheduling paper (e.g. Pollux, OSDI'21, section 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, order_from_keys, realize


class StaticPolicy(Policy):
    """Plain Slurm: running jobs keep their size; pending jobs start at their request, FIFO."""

    name = "static"

    @dataclass(frozen=True)
    class Params:
        backfill: bool = True  # later pending jobs may start when an earlier one does not fit

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        running = jobs.current > 0
        want = np.where(running, jobs.current,
                        np.clip(jobs.requested, jobs.min_gpus, jobs.max_gpus)).astype(float)
        # Running jobs first (they hold their GPUs), then pending jobs in submit order.
        order = order_from_keys(np.where(running, 0, 1))
        grid = Grid.build(jobs, capacity)
        gpus = realize(jobs, capacity, want, order, exact=~running,
                       blocking=not self.params.backfill, hamilton=False, grid=grid)
        never = cannot_run_reason(grid, jobs, capacity)
        reasons = []
        for j in range(len(jobs)):
            if running[j]:
                reasons.append("running: keeps its GPUs" if gpus[j] == jobs.current[j]
                               else f"running on {jobs.current[j]}, not packable: {gpus[j]}")
            elif gpus[j] > 0:
                asked = int(jobs.requested[j])
                reasons.append(f"starts at its request ({gpus[j]} GPUs)" if gpus[j] == asked
                               else f"starts at {gpus[j]} GPUs (its request of {asked}, "
                                    f"clipped to {jobs.min_gpus[j]}-{jobs.max_gpus[j]} and "
                                    f"rounded to a feasible size)")
            else:
                reasons.append(never[j] or f"waits: request of {int(want[j])} GPUs does not fit")
        return finish(jobs, gpus, reasons, order=order)
