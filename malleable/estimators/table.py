"""The speedup table: the one data structure estimators hand to policies.

For J jobs and a shared grid of K candidate GPU counts ``k`` (``k[0] == 0``,
"not running"), the table holds each job's expected goodput, recommended batch
size and remaining time at every candidate count, and which counts the job may
use. Policies index it; they never see a fitted model. The feasibility rules
live here, once, so the estimators, the policies, the reconciler and the
simulator agree on what a legal size is.

Feasible sizes for a job with spec (min, max, step) on nodes of g GPUs
(DESIGN.md section 4, "k", "n", "g"):

* ``k == 0`` (the job is not running), or
* ``min <= k <= max``, and ``k == min`` or ``k % step == 0``, and
* node granularity: the job fits inside one node (``k <= g``) or uses whole
  nodes (``k % g == 0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def feasible_mask(k: np.ndarray, min_gpus: np.ndarray, max_gpus: np.ndarray,
                  step: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Which candidate GPU counts each job may run on.

    Args:
        k: (K,) int, candidate GPU counts (any order; 0 allowed).
        min_gpus, max_gpus, step: (J,) int, each job's spec; ``1 <= min <= max``,
            ``step >= 1``.
        gpus_per_node: g, GPUs per node, ``>= 1``.

    Returns:
        (J, K) bool; column entries with ``k == 0`` are always True.

    Raises:
        ValueError: mismatched shapes, or a non-positive gpus_per_node / step / min.
    """
    k = np.asarray(k, dtype=np.int64)
    lo = np.asarray(min_gpus, dtype=np.int64)[:, None]
    hi = np.asarray(max_gpus, dtype=np.int64)[:, None]
    st = np.asarray(step, dtype=np.int64)[:, None]
    if not (lo.shape == hi.shape == st.shape):
        raise ValueError(f"min_gpus, max_gpus, step must have one shape, got "
                         f"{lo.shape[0]}, {hi.shape[0]}, {st.shape[0]}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if lo.size and (st.min() < 1 or lo.min() < 1):
        raise ValueError("step and min_gpus must be >= 1")
    kk = k[None, :]
    in_range = (kk >= lo) & (kk <= hi)
    on_step = (kk == lo) | (kk % st == 0)
    on_nodes = (kk <= gpus_per_node) | (kk % gpus_per_node == 0)
    return (in_range & on_step & on_nodes) | (kk == 0)


def candidate_grid(max_gpus: np.ndarray, gpus_per_node: int, total_gpus: int) -> np.ndarray:
    """The shared grid of candidate GPU counts for a set of jobs.

    Every count that node granularity allows, from 0 up to the smallest of the
    largest job maximum and the cluster's GPUs: 0, 1, ..., g, 2g, 3g, ...

    Args:
        max_gpus: (J,) int, each job's maximum GPUs.
        gpus_per_node: g >= 1.
        total_gpus: GPUs in the cluster (or usable by malleable jobs), >= 0.

    Returns:
        (K,) int64, ascending, starting with 0.
    """
    g = int(gpus_per_node)
    top = int(min(int(np.max(max_gpus)) if len(max_gpus) else 0, total_gpus))
    within = np.arange(0, min(g, top) + 1, dtype=np.int64)
    whole = np.arange(2 * g, top + 1, g, dtype=np.int64)
    return np.concatenate([within, whole])


@dataclass(frozen=True)
class SpeedupTable:
    """Per job and candidate GPU count: goodput, batch size, remaining time.

    Attributes:
        k: (K,) int64, candidate GPU counts, ascending, ``k[0] == 0``.
        feasible: (J, K) bool, the counts each job may use (`feasible_mask`).
        goodput: (J, K) float64, expected useful progress per second at k GPUs
            with the recommended batch size, in the job's work units per second
            (samples at the initial batch m0, Pollux's "progress"); 0 at k == 0.
            Defined (extrapolated) at infeasible counts too, so marginal gains
            can be computed; use ``feasible`` to restrict.
        batch: (J, K) int64, the goodput-optimal global batch size at k; 0 at k == 0.
        remaining_work: (J,) float64, work left, same units as goodput x seconds.
        remaining_std: (J,) float64, standard deviation of remaining_work (>= 0).
        from_prior: (J,) bool, the throughput model came from a prior, not the
            job's own samples (too few of them, or unusable).
        flags: (J,) int64, `malleable.estimators.params.EstimateFlags` bitmask:
            which parts of each job's estimate came from priors or fallbacks
            (default all 0).
        goodput_std: (J, K) float64, standard deviation of ``goodput`` from the
            throughput model's parameter uncertainty (default all 0).
        speedup_exponent: (J,) float64, p of the power-law fit ``X ~ k^p``
            (heSRPT's speedup model) to the job's samples, the prior's p where
            one GPU count was observed (default NaN: not estimated).

    Source: the table of per-allocation goodput is Pollux's input to its
    scheduler (Qiao et al., OSDI'21, section 4.2); the remaining time per
    allocation is what Optimus (Peng et al., EuroSys'18) and heSRPT
    (Berg et al., SIGMETRICS'20) allocate on.
    """

    k: np.ndarray
    feasible: np.ndarray
    goodput: np.ndarray
    batch: np.ndarray
    remaining_work: np.ndarray
    remaining_std: np.ndarray
    from_prior: np.ndarray = field(default=None)  # type: ignore[assignment]
    flags: np.ndarray = field(default=None)  # type: ignore[assignment]
    goodput_std: np.ndarray = field(default=None)  # type: ignore[assignment]
    speedup_exponent: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        J, K = self.goodput.shape
        if self.k.shape != (K,) or self.k[0] != 0:
            raise ValueError(f"k must have shape ({K},) and start with 0, got {self.k[:3]}...")
        for name in ("feasible", "batch"):
            if getattr(self, name).shape != (J, K):
                raise ValueError(f"{name} must have shape ({J}, {K}), "
                                 f"got {getattr(self, name).shape}")
        for name in ("remaining_work", "remaining_std"):
            if getattr(self, name).shape != (J,):
                raise ValueError(f"{name} must have shape ({J},), got {getattr(self, name).shape}")
        if self.from_prior is None:
            object.__setattr__(self, "from_prior", np.zeros(J, dtype=bool))
        if self.flags is None:
            object.__setattr__(self, "flags", np.zeros(J, dtype=np.int64))
        if self.goodput_std is None:
            object.__setattr__(self, "goodput_std", np.zeros((J, K)))
        if self.speedup_exponent is None:
            object.__setattr__(self, "speedup_exponent", np.full(J, np.nan))
        for name, shape in (("from_prior", (J,)), ("flags", (J,)), ("goodput_std", (J, K)),
                            ("speedup_exponent", (J,))):
            if np.shape(getattr(self, name)) != shape:
                raise ValueError(f"{name} must have shape {shape}, "
                                 f"got {np.shape(getattr(self, name))}")

    @property
    def num_jobs(self) -> int:
        return int(self.goodput.shape[0])

    @property
    def remaining_time(self) -> np.ndarray:
        """(J, K) float64 seconds: remaining_work / goodput; inf where goodput is 0."""
        with np.errstate(divide="ignore", invalid="ignore"):
            t = self.remaining_work[:, None] / self.goodput
        return np.where(self.goodput > 0, t, np.inf)

    def column(self, gpus: np.ndarray) -> np.ndarray:
        """(J,) int64 column index of each job's GPU count in ``k``.

        Raises:
            ValueError: a count that is not on the grid.
        """
        gpus = np.asarray(gpus, dtype=np.int64)
        idx = np.searchsorted(self.k, gpus)
        idx = np.minimum(idx, len(self.k) - 1)
        bad = self.k[idx] != gpus
        if np.any(bad):
            raise ValueError(f"GPU count {int(gpus[bad][0])} is not on the candidate grid")
        return idx

    def at(self, gpus: np.ndarray) -> np.ndarray:
        """(J,) goodput of each job at its given GPU count (which must be on the grid)."""
        return self.goodput[np.arange(self.num_jobs), self.column(gpus)]
