"""Starvation protection shared by `las`, `gittins`, `pollux` and `default`.

Rule: a pending job that has waited at least ``starve_s`` seconds since it
last ran (or since submission) is *promoted*: it is served before every
non-promoted job, and promoted jobs are served longest-waiting first.

Why this guarantees progress (the property the tests check): at every
decision the longest-waiting promoted job is placed first into an empty
cluster, so it runs if its smallest size fits the cluster at all. A job
that waits is overtaken only by promoted jobs that have waited longer, and
each of those, once served, starts waiting again from zero (behind it). So
with J jobs and decisions every dt seconds, a job that can fit waits at most
``starve_s + J * dt`` seconds between runs. Behind the hysteresis wrapper a
served job keeps its GPUs for its cool-down and its lease (``min_run_restarts``
times its restart cost), so the bound becomes
``starve_s + J * max(dt, cooldown_s, lease) + dt`` with the longest lease.

Source: Tiresias (Gu et al., NSDI'19, section 4.2, "starvation") promotes a
job to the highest-priority queue after it waited longer than a threshold;
this is the same rule with an absolute threshold.
"""

from __future__ import annotations

import numpy as np

from malleable.policies.base import JobSet


def promoted(jobs: JobSet, starve_s: float) -> np.ndarray:
    """(J,) bool: pending jobs that have waited at least ``starve_s`` seconds."""
    return (jobs.current == 0) & (jobs.waiting >= starve_s)


def starvation_keys(jobs: JobSet, starve_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The two most significant sort keys of a starvation-safe priority order.

    Returns:
        (group, wait): group is 0 for promoted jobs and 1 otherwise; wait is
        minus the waiting time for promoted jobs (longest first) and 0 otherwise.
        Use as ``order_from_keys(group, wait, <policy keys>...)``.
    """
    up = promoted(jobs, starve_s)
    return np.where(up, 0, 1), np.where(up, -jobs.waiting, 0.0)
