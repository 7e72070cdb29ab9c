"""What policies read off the speedup table: speedup, goodput at any count, fitted k^p.

All functions are vectorised over jobs; the table is the estimators'
`SpeedupTable` (goodput defined, extrapolated, at every grid count).
"""

from __future__ import annotations

import numpy as np

from malleable.estimators.table import SpeedupTable


def goodput_at(table: SpeedupTable, x: np.ndarray) -> np.ndarray:
    """(J,) goodput of each job at a (possibly fractional) GPU count ``x``.

    Linear interpolation between the table's grid counts, flat beyond the
    last one; 0 at x <= 0.

    Args:
        x: (J,) float GPUs (or a scalar for all jobs).

    Returns:
        (J,) float64, work units per second.
    """
    J = table.num_jobs
    x = np.broadcast_to(np.asarray(x, dtype=np.float64), (J,))
    k = table.k.astype(np.float64)
    hi = np.clip(np.searchsorted(k, x, side="left"), 1, len(k) - 1)
    lo = hi - 1
    rows = np.arange(J)
    g_lo, g_hi = table.goodput[rows, lo], table.goodput[rows, hi]
    w = np.clip((x - k[lo]) / np.maximum(k[hi] - k[lo], 1e-12), 0.0, 1.0)
    out = g_lo + w * (g_hi - g_lo)
    return np.where(x <= 0, 0.0, out)


def one_gpu_rate(table: SpeedupTable) -> np.ndarray:
    """(J,) goodput at one GPU (interpolated if 1 is not on the grid), work units/s.

    A job that cannot run on one GPU (its batch does not fit one GPU's memory:
    goodput 0 there) gets ``goodput(k_min) / k_min`` at its smallest runnable size
    k_min, as if it scaled linearly up to it; 0 for a job that can run nowhere.
    """
    base = goodput_at(table, np.ones(table.num_jobs))
    k_min, rate = smallest_runnable(table)
    virtual = np.where(k_min > 0, rate / np.maximum(k_min, 1), 0.0)
    return np.where(base > 0, base, virtual)


def smallest_runnable(table: SpeedupTable) -> tuple[np.ndarray, np.ndarray]:
    """Each job's smallest feasible GPU count with positive goodput, and that goodput.

    Returns:
        ((J,) int64 GPUs, (J,) float64 work units/s); (0, 0.0) for a job that can run
        on no count of the grid.
    """
    runnable = table.feasible & (table.goodput > 0) & (table.k[None, :] > 0)
    first = np.argmax(runnable, axis=1)
    some = runnable.any(axis=1)
    rows = np.arange(table.num_jobs)
    return (np.where(some, table.k[first], 0).astype(np.int64),
            np.where(some, table.goodput[rows, first], 0.0))


def speedup(table: SpeedupTable) -> np.ndarray:
    """(J, K) speedup over one GPU, s(k) = goodput(k) / goodput(1); 0 where goodput(1) is 0."""
    base = one_gpu_rate(table)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = table.goodput / base[:, None]
    return np.where(base[:, None] > 0, s, 0.0)


def fit_power_law(table: SpeedupTable, lo: float = 0.01, hi: float = 0.99) -> np.ndarray:
    """(J,) exponent p of the best fit goodput(k) ~ a k^p over the grid counts k >= 1.

    Least squares of log goodput on log k (with intercept) per job, over the
    grid counts with positive goodput; clipped to [lo, hi]. A job with fewer
    than two usable points gets p = hi.

    Source: the heSRPT model s(k) = k^p (Berg et al., SIGMETRICS'20, section 2).
    """
    k = table.k.astype(np.float64)
    use = (k[None, :] >= 1) & (table.goodput > 0)
    lk = np.log(np.where(k > 0, k, 1.0))[None, :]
    lg = np.log(np.where(use, table.goodput, 1.0))
    n = use.sum(axis=1)
    safe_n = np.maximum(n, 1)
    mx = (lk * use).sum(axis=1) / safe_n
    my = (lg * use).sum(axis=1) / safe_n
    dx = (lk - mx[:, None]) * use
    sxx = (dx * dx).sum(axis=1)
    sxy = (dx * (lg - my[:, None])).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = sxy / sxx
    p = np.where((n >= 2) & (sxx > 0) & np.isfinite(p), p, hi)
    return np.clip(p, lo, hi)


def one_gpu_seconds(table: SpeedupTable, work: np.ndarray | None = None) -> np.ndarray:
    """(J,) the work left as seconds on one GPU, W / goodput(1) (inf if goodput(1) is 0).

    This is the job "size" x of the heSRPT model (a job of size x on k GPUs
    with s(k) = k^p needs x / k^p seconds).
    """
    w = table.remaining_work if work is None else np.asarray(work, dtype=np.float64)
    base = one_gpu_rate(table)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = w / base
    return np.where(base > 0, x, np.inf)
