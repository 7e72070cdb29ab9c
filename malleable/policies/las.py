"""`las`: least attained service first (Tiresias's discretized 2D-LAS), size-agnostic.

Model: a job's attained service is the GPU-seconds it has received (2D:
GPUs x time), divided by its weight. Jobs are ranked by the priority queue
their attained service falls in (queue i holds attained service in
[thresholds[i-1], thresholds[i])), and within a queue in submit order
(FIFO), as Tiresias does; with ``continuous`` the rank is the attained
service itself (plain LAS / foreground-background). In rank order each job
gets the GPUs it requested (``size="requested"``, Tiresias's rigid demand;
or its maximum with ``size="max"``), or the largest feasible size that
still fits (malleable jobs can start smaller); GPUs left over go to the
highest-ranked jobs up to their maximum. No size estimate is used.

Starvation: a pending job that has waited ``starve_s`` seconds is promoted
ahead of every other job (`malleable.policies.starvation`).

Source: Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep
Learning", NSDI'19, section 4 (2D-LAS, discretized into priority queues,
FIFO within a queue, starvation promotion); LAS: Nuyens and Wierman, "The
Foreground-Background queue: a survey", Perf. Eval. 2008.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, cannot_run_reason, finish, order_from_keys, realize
from malleable.policies.starvation import promoted, starvation_keys


class LasPolicy(Policy):
    """Least attained service first, in Tiresias's discretized priority queues."""

    name = "las"

    @dataclass(frozen=True)
    class Params:
        thresholds: tuple[float, ...] = (3600.0 * 16,)  # GPU-s queue limits (Pollux's Tiresias)
        continuous: bool = False   # rank by attained service itself, not by queue
        size: Literal["requested", "max"] = "requested"  # GPUs asked for in rank order
        starve_s: float = 3600.0   # a pending job waiting this long is served first

        def __post_init__(self) -> None:
            if not self.thresholds and not self.continuous:
                raise ValueError("thresholds must not be empty, got []: one queue ranks jobs "
                                 "by submit order alone, ignoring attained service (for plain "
                                 "LAS set continuous = true; for FIFO use the policy fifo)")
            if any(b <= a for a, b in zip(self.thresholds, self.thresholds[1:], strict=False)):
                raise ValueError(f"thresholds must increase, got {self.thresholds}")
            if any(not t > 0 for t in self.thresholds):
                raise ValueError(f"thresholds must be > 0 GPU-seconds, got {self.thresholds}")
            if self.starve_s <= 0:
                raise ValueError(f"starve_s must be > 0, got {self.starve_s}")

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        prm = self.params
        service = jobs.attained / jobs.weight
        if prm.continuous:
            level = service
        else:
            level = np.searchsorted(np.asarray(prm.thresholds, float), service, side="right")
        group, wait = starvation_keys(jobs, prm.starve_s)
        order = order_from_keys(group, wait, level)
        size = jobs.requested if prm.size == "requested" else jobs.max_gpus
        wish = np.clip(size, jobs.min_gpus, jobs.max_gpus).astype(float)
        grid = Grid.build(jobs, capacity)
        gpus = realize(jobs, capacity, wish, order, fill="priority", grid=grid)
        up = promoted(jobs, prm.starve_s)
        never = cannot_run_reason(grid, jobs, capacity)
        rank = np.empty(len(jobs), np.int64)
        rank[order] = np.arange(len(jobs))
        reasons = []
        for j in range(len(jobs)):
            what = (f"starving ({jobs.waiting[j]:.0f} s waiting)" if up[j] else
                    f"attained {service[j]:.0f} GPU-s" + ("" if prm.continuous
                                                          else f" (queue {int(level[j])})"))
            reasons.append(never[j] or f"las rank {rank[j]}, {what}: {gpus[j]} GPUs")
        return finish(jobs, gpus, reasons, order=order, urgent=up)
