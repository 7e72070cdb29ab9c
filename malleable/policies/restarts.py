"""The cost of resizing a running job, as a factor on its rate (shared by pollux and gittins).

A running job whose GPU count changes loses its restart cost delta (a
checkpoint-requeue). Pollux discounts the speedup of such a job by

    r = max(T - R delta, 0) / (T + delta),

with T the job's age and R its restarts so far: the fraction of its life
spent making progress if it restarts once more. Multiplying the value of
every size other than the current one by r makes a policy move a running
job only for a gain that outweighs the restart.

Source: Qiao et al., "Pollux", OSDI'21, section 4.2 (re-allocation penalty),
and the artifact's simulator (petuum/adaptdl, osdi21-artifact).
"""

from __future__ import annotations

import numpy as np

from malleable.policies.base import JobSet


def restart_factor(jobs: JobSet) -> np.ndarray:
    """(J,) max(T - R delta, 0) / (T + delta) (1 if T + delta = 0)."""
    T, R, d = jobs.age, jobs.restarts.astype(float), jobs.restart_cost
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.maximum(T - R * d, 0.0) / (T + d)
    return np.where(T + d > 0, f, 1.0)


def penalise_changes(values: np.ndarray, jobs: JobSet) -> np.ndarray:
    """(J, K) ``values`` (nonnegative rates) times the restart factor wherever a running
    job's count would differ from its current one; pending jobs are not penalised."""
    k = jobs.table.k
    change = (jobs.current[:, None] > 0) & (k[None, :] != jobs.current[:, None])
    return np.where(change, values * restart_factor(jobs)[:, None], values)


def current_column(jobs: JobSet, feasible: np.ndarray) -> np.ndarray:
    """(J,) grid column of each running job's current count if it is a feasible
    size, else -1 (pending jobs, or a count off the grid)."""
    k = jobs.table.k
    col = np.minimum(np.searchsorted(k, jobs.current), len(k) - 1)
    ok = (jobs.current > 0) & (k[col] == jobs.current) & feasible[np.arange(len(jobs)), col]
    return np.where(ok, col, -1)
