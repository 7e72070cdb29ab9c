"""Plots of simulation results as PNG files (matplotlib, Agg backend, imported lazily).

* `plot_jct_cdf`: the CDF of job completion times, one line per policy.
* `plot_gpus_per_job`: GPUs held by each job over time, stacked.
* `plot_utilization`: allocated GPUs over time against the cluster's size.

Each function writes one PNG and returns its path; matplotlib is imported on
the first call only, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from malleable.mpl import pyplot


def plot_jct_cdf(jcts: Mapping[str, Sequence[float]], path: str | Path, *,
                 title: str = "Job completion time") -> Path:
    """CDF of JCT (hours, log x axis) for each policy in ``jcts`` (name -> JCTs in s).

    Raises:
        ValueError: no policy has a JCT.
    """
    if not any(len(v) for v in jcts.values()):
        raise ValueError("no JCT to plot")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for name in sorted(jcts):
        x = np.sort(np.asarray(jcts[name], dtype=float)) / 3600.0
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        ax.step(x, y, where="post", label=f"{name} (avg {x.mean():.2f} h)")
    ax.set_xscale("log")
    # Plain labels at 1, 2 and 5 of each decade, none on the other minor ticks (on a
    # span under a decade matplotlib labels every minor tick, and they overlap).
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("JCT (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _per_job_series(log: Sequence[tuple[float, str, int]], grid: np.ndarray
                    ) -> tuple[list[str], np.ndarray]:
    """GPUs of each job at each grid time from an allocation log of (t, job, gpus) changes."""
    jobs = sorted({j for _, j, _ in log}, key=lambda s: (len(s), s))
    index = {j: i for i, j in enumerate(jobs)}
    out = np.zeros((len(jobs), grid.size))
    per: dict[str, tuple[list[float], list[int]]] = {}
    for t, j, g in log:
        ts, gs = per.setdefault(j, ([], []))
        ts.append(t)
        gs.append(g)
    for j, (ts, gs) in per.items():
        pos = np.searchsorted(np.asarray(ts), grid, side="right") - 1
        vals = np.where(pos >= 0, np.asarray(gs)[np.maximum(pos, 0)], 0)
        out[index[j]] = vals
    return jobs, out


def plot_gpus_per_job(log: Sequence[tuple[float, str, int]], path: str | Path, *,
                      total_gpus: int | None = None, points: int = 600,
                      max_series: int = 200, title: str = "GPUs per job") -> Path:
    """Stacked GPUs held by each job over time (hours) from an allocation log
    (`SimSlurm.allocation_log`: (virtual s, job id, GPUs held from then on)).

    With more than ``max_series`` jobs, the jobs beyond the ``max_series - 1``
    largest (by GPU time on the plot's grid) are drawn as one grey band.

    Raises:
        ValueError: an empty log.
    """
    if not log:
        raise ValueError("empty allocation log")
    plt = pyplot()
    t_end = max(t for t, _, _ in log)
    grid = np.linspace(0.0, max(t_end, 1.0), points)
    jobs, series = _per_job_series(log, grid)
    cmap = plt.get_cmap("tab20")
    colors = [cmap(i % 20) for i in range(len(jobs))]
    if len(jobs) > max_series:
        top = np.sort(np.argsort(-series.sum(axis=1), kind="stable")[:max_series - 1])
        rest = np.ones(len(jobs), dtype=bool)
        rest[top] = False
        series = np.vstack((series[top], series[rest].sum(axis=0)))
        colors = [colors[i] for i in top] + [(0.6, 0.6, 0.6, 1.0)]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.stackplot(grid / 3600.0, series, colors=colors, step="post", linewidth=0)
    if total_gpus:
        ax.axhline(total_gpus, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs")
    ax.set_title(f"{title} ({len(jobs)} jobs)")
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_utilization(times: np.ndarray, used: np.ndarray, total_gpus: int, path: str | Path, *,
                     title: str = "GPU allocation") -> Path:
    """Allocated GPUs over time (hours) as a step line, with the cluster's size.

    Raises:
        ValueError: mismatched or empty arrays.
    """
    t = np.asarray(times, dtype=float)
    u = np.asarray(used, dtype=float)
    if t.size == 0 or t.shape != u.shape:
        raise ValueError("times and used must be non-empty arrays of the same shape")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3), dpi=100)
    ax.step(t / 3600.0, u, where="post", linewidth=0.8)
    ax.axhline(total_gpus, color="black", linewidth=0.8, linestyle="--",
               label=f"{total_gpus} GPUs")
    ax.set_ylim(0, total_gpus * 1.05)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs allocated")
    ax.set_title(title)
    ax.legend(loc="upper right")
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
