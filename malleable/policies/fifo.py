"""`fifo`: first come, first served, each job at its maximum.

Model: jobs in submit order (index order) each get the largest feasible size
up to their maximum that fits the GPUs left; a job that cannot get its
maximum takes what is left (at least its minimum) and later jobs get
nothing until GPUs free up. GPUs left over by rounding go to jobs in the
same order.

Source: the classic FCFS discipline (e.g. Harchol-Balter, "Performance
Modeling and Design of Computer Systems", 2013, ch. 28) applied to
malleable jobs; Optimus (Peng et al., EuroSys'18) and Pollux (Qiao et al.,
OSDI'21) compare against FIFO-ordered schedulers.
"""

from __future__ import annotations

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, realize


class FifoPolicy(Policy):
    """Jobs in submit order get their maximum, while GPUs last."""

    name = "fifo"

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        order = np.arange(len(jobs), dtype=np.int64)
        grid = Grid.build(jobs, capacity)
        gpus = realize(jobs, capacity, jobs.max_gpus.astype(float), order, fill="priority",
                       grid=grid)
        never = cannot_run_reason(grid, jobs, capacity)
        reasons = [never[j] or (f"fifo position {j}: {gpus[j]} of max {jobs.max_gpus[j]}"
                                if gpus[j] else f"fifo position {j}: waits for GPUs")
                   for j in range(len(jobs))]
        return finish(jobs, gpus, reasons, order=order)
