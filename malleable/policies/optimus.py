"""`optimus`: greedy marginal gain in remaining time.

Model: every job first gets its smallest feasible size, in submit order,
while GPUs last (Optimus starts each job with one worker). Then, one step at
a time, the next GPUs (the next feasible size: one GPU within a node, a
whole node beyond) go to the job whose estimated remaining time drops the
most per GPU added, weight x (W / goodput(k) - W / goodput(k')) / (k' - k),
until no step helps or nothing fits. With ``window`` > 1 the step may
jump up to that many feasible sizes ahead (the best gain per GPU among
them), which copes with goodput curves that are not concave. The default is
2 (as for `pollux` and `gittins`): Optimus's one-worker steps assume the
concave speed curves it fits, and an estimated curve need not be one. With
``window = 1``, on Pollux's workload-1 two imagenet jobs whose fitted curve
put 4 GPUs below 3 (and 8 GPUs on 2 nodes at three times 4) stayed on 3 GPUs
for about 60 hours with most of the cluster idle (benchmarks/results/sim_fidelity.md).

Source: Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for
Deep Learning Clusters", EuroSys'18, section 4.2 (marginal gain allocation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, realize


class OptimusPolicy(Policy):
    """Minimum for everyone (FIFO), then the next GPU to the largest drop in remaining time."""

    name = "optimus"

    @dataclass(frozen=True)
    class Params:
        window: int = 2  # feasible sizes a step may look ahead (1: Optimus's single steps)

        def __post_init__(self) -> None:
            if self.window < 1:
                raise ValueError(f"window must be >= 1, got {self.window}")

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        t = jobs.table
        grid = Grid.build(jobs, capacity)
        order = np.arange(len(jobs), dtype=np.int64)
        value = -t.remaining_time * jobs.weight[:, None]
        wish = jobs.min_gpus.astype(float)
        gpus = realize(jobs, capacity, wish, order, fill="value", value=value, grid=grid,
                       hamilton=False, window=self.params.window)
        never = cannot_run_reason(grid, jobs, capacity)
        rt = t.remaining_time[np.arange(len(jobs)), t.column(gpus)]
        reasons = [never[j] or (f"greedy marginal gain: {gpus[j]} GPUs, {rt[j]:.0f} s left"
                                if gpus[j] else "waits: minimums of earlier jobs fill the cluster")
                   for j in range(len(jobs))]
        return finish(jobs, gpus, reasons, order=order, objective=float(np.sum(
            np.where(gpus > 0, rt, 0.0))))
