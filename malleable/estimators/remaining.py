"""Remaining work W (samples at m0) and its standard deviation, three ways.

1. A declared target (steps, samples, epochs): ``W = target - attained``,
   exact (standard deviation 0).
2. A target metric: the learning curve (`malleable.estimators.learning_curve`)
   says at which progress the metric reaches it.
3. Neither: the distribution of total work of finished jobs like this one,
   conditioned on the work already attained,

       W = E[T - a | T > a],   sd = sd[T - a | T > a],

   the quantity a Gittins-index policy needs (Gittins 1989; applied to DL
   jobs with unknown sizes by Tiresias, Gu et al., NSDI'19). With too few
   finished jobs above ``a``, the attained work itself is the estimate
   ("a job that has run for a will run about as long again", the median of a
   Pareto tail with index 1) with standard deviation ``a``; with no progress
   either, the configured default total work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from malleable.estimators.inputs import WorkHistory


class RemainingFromHistory(NamedTuple):
    """Conditional remaining work of J jobs from finished jobs' total work.

    Attributes:
        mean: (J,) E[T - a | T > a] (NaN where ``ok`` is False).
        std: (J,) sd[T - a | T > a].
        count: (J,) finished jobs with T > a that the estimate used.
        ok: (J,) bool, at least ``min_tail`` such jobs (in the job's group, or
            else in the whole history).
    """

    mean: np.ndarray
    std: np.ndarray
    count: np.ndarray
    ok: np.ndarray


def _tail_moments(sorted_totals: np.ndarray, attained: np.ndarray):
    """Count, mean and variance of the totals strictly above each attained value."""
    H = sorted_totals.shape[0]
    s1 = np.concatenate([np.cumsum(sorted_totals[::-1])[::-1], [0.0]])
    s2 = np.concatenate([np.cumsum((sorted_totals ** 2)[::-1])[::-1], [0.0]])
    idx = np.searchsorted(sorted_totals, attained, side="right")
    cnt = H - idx
    safe = np.maximum(cnt, 1)
    mean = s1[idx] / safe
    var = np.maximum(s2[idx] / safe - mean ** 2, 0.0)
    return cnt, mean, var


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def remaining_from_history(attained: np.ndarray, job_group: np.ndarray,
                           history: WorkHistory | None,
                           min_tail: int = 3) -> RemainingFromHistory:
    """E[T - a | T > a] and its standard deviation from finished jobs' totals.

    Args:
        attained: (J,) work attained so far, a (samples at m0), >= 0.
        job_group: (J,) int, the job's history group (-1: whole history).
        history: finished jobs' total work (`WorkHistory`), or None.
        min_tail: finished jobs above ``a`` needed; fewer in the job's group ->
            the whole history is used; fewer there too -> ``ok`` False.

    Returns:
        `RemainingFromHistory` with (J,) arrays.
    """
    attained = np.where(np.isfinite(attained), np.maximum(attained, 0.0), 0.0)
    J = attained.shape[0]
    mean = np.full(J, np.nan)
    std = np.full(J, np.nan)
    count = np.zeros(J, dtype=np.int64)
    ok = np.zeros(J, dtype=bool)
    if history is None or len(history) == 0:
        return RemainingFromHistory(mean, std, count, ok)
    everyone = np.sort(history.total_work)
    cnt, mu, var = _tail_moments(everyone, attained)
    use = cnt >= min_tail
    mean[use] = mu[use] - attained[use]
    std[use] = np.sqrt(var[use])
    count[use] = cnt[use]
    ok[use] = True
    job_group = np.asarray(job_group, dtype=np.int64)
    for g in np.unique(job_group[job_group >= 0]):
        totals = history.total_work[history.group == g]
        if totals.size < min_tail:
            continue
        sel = np.flatnonzero(job_group == g)
        cnt_g, mu_g, var_g = _tail_moments(totals, attained[sel])
        use_g = cnt_g >= min_tail
        rows = sel[use_g]
        mean[rows] = mu_g[use_g] - attained[rows]
        std[rows] = np.sqrt(var_g[use_g])
        count[rows] = cnt_g[use_g]
        ok[rows] = True
    return RemainingFromHistory(mean, std, count, ok)


def remaining_default(attained: np.ndarray, default_total_work: float):
    """The fallback when nothing else is known: (mean, std), both (J,).

    ``a`` (the attained work) for a job that has progressed, else
    ``default_total_work``; the standard deviation equals the mean.
    """
    a = np.where(np.isfinite(attained), np.maximum(attained, 0.0), 0.0)
    mean = np.where(a > 0, a, float(default_total_work))
    return mean, mean.copy()
