"""The Philly window the simulator benchmarks use (`bench_sim_speed.py` selects the same).

`busiest_window(path)`: the Philly list after Pollux's filters (`load_philly`, seed 0,
the minimum duration and maximum GPU time of `malleable.sim.workloads`), and of it
the busiest 2-week window of one virtual cluster that 64 GPUs (16 nodes x 4) can serve
on average (`busiest_fitting_window`, demand by `isolated_demand`).
"""

from __future__ import annotations

from malleable.sim.traces import load_philly
from malleable.sim.workloads import (
    PHILLY_MAX_GPU_TIME_S,
    PHILLY_MIN_DURATION_S,
    busiest_fitting_window,
    isolated_demand,
)

DEFAULT_PATH = "/work/shared/data/philly_pollux/philly.csv"


def busiest_window(path: str = DEFAULT_PATH) -> tuple[str, float, list]:
    """(virtual cluster, the window's start in the list's time base in seconds, its
    jobs rebased to start at 0), as `busiest_fitting_window` returns them. Raises
    what `load_philly` raises for an unreadable or malformed file."""
    jobs = load_philly(path, seed=0, min_duration_s=PHILLY_MIN_DURATION_S,
                       max_gpu_time_s=PHILLY_MAX_GPU_TIME_S)
    return busiest_fitting_window(jobs, 14 * 86400.0, 64.0,
                                  demand=lambda j: isolated_demand(j, 4, 64))
