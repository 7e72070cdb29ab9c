"""The policy interface: the arrays a policy receives and the allocation it returns.

A policy is a pure function of (`JobSet`, `Capacity`, `Context`) to an
`Allocation`. It sees no database, no Slurm and no wall clock: the daemon and
the simulator build these records, so the same policy code runs in both.

Conventions shared by every policy:

* J malleable jobs, indexed 0..J-1 in the order given (the caller sorts by
  submit time, so index order is FIFO order with ties broken by id).
* GPU counts are integers; 0 means "not running" (pending, or held back).
* Work and goodput are in each job's own work units (samples at its initial
  batch size m0); times in seconds; attained service in GPU-seconds.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from malleable.estimators.table import SpeedupTable


@dataclass(frozen=True)
class JobSet:
    """The malleable jobs a policy allocates, as parallel arrays of length J.

    Attributes:
        ids: (J,) object, job ids as strings (Slurm ids, e.g. "123", "123_4").
        min_gpus, max_gpus, step: (J,) int64, the job's spec (feasible sizes:
            `malleable.estimators.table.feasible_mask`).
        current: (J,) int64, GPUs the job holds now (0 = pending or held).
        table: the estimators' `SpeedupTable` for these J jobs (same order).
        attained: (J,) float64, attained service so far, GPU-seconds.
        age: (J,) float64, seconds since submission.
        restart_cost: (J,) float64, seconds lost per checkpoint-requeue (delta).
        since_change: (J,) float64, seconds since the job's size last changed
            (inf if never), for the cool-down.
        weight: (J,) float64, relative importance (default 1).
    """

    ids: np.ndarray
    min_gpus: np.ndarray
    max_gpus: np.ndarray
    step: np.ndarray
    current: np.ndarray
    table: SpeedupTable
    attained: np.ndarray
    age: np.ndarray
    restart_cost: np.ndarray
    since_change: np.ndarray
    weight: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        J = len(self.ids)
        if self.weight is None:
            object.__setattr__(self, "weight", np.ones(J))
        for name in ("min_gpus", "max_gpus", "step", "current", "attained", "age",
                     "restart_cost", "since_change", "weight"):
            arr = getattr(self, name)
            if np.shape(arr) != (J,):
                raise ValueError(f"JobSet.{name} must have shape ({J},), got {np.shape(arr)}")
        if self.table.num_jobs != J:
            raise ValueError(f"JobSet.table has {self.table.num_jobs} jobs, expected {J}")

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Capacity:
    """The GPUs malleable jobs may use.

    Attributes:
        gpus_per_node: g, GPUs per node (homogeneous cluster).
        free_per_node: (N,) int64, for each node, the GPUs malleable jobs may
            occupy: its GPUs minus those held by rigid or unmanaged jobs (GPUs
            held by the malleable jobs being allocated count as free). A job
            with more than g GPUs needs whole nodes whose free count is g.
    """

    gpus_per_node: int
    free_per_node: np.ndarray

    @property
    def total(self) -> int:
        return int(np.sum(self.free_per_node))

    @property
    def whole_nodes(self) -> int:
        return int(np.sum(self.free_per_node >= self.gpus_per_node))


@dataclass(frozen=True)
class Context:
    """What a policy may know besides the jobs: the time, a seed, the cluster's history.

    Attributes:
        now: seconds (wall clock in the daemon, virtual in the simulator); only
            differences are meaningful to a policy.
        seed: for any randomness; the same inputs and seed give the same output.
        size_history: (H,) float64, total attained service (GPU-seconds) of
            finished jobs, for size-distribution policies (Gittins); may be empty.
    """

    now: float = 0.0
    seed: int = 0
    size_history: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class Allocation:
    """A policy's answer.

    Attributes:
        gpus: (J,) int64, target GPUs per job (0 = not running). Always feasible
            for the job and packable into the `Capacity` it was computed for.
        batch: (J,) int64, recommended global batch size at that count (0 if not running).
        reason: (J,) tuple of short strings, why each job got its target.
        objective: the policy's objective value for this allocation (NaN if none).
    """

    gpus: np.ndarray
    batch: np.ndarray
    reason: tuple[str, ...]
    objective: float = float("nan")


class Policy(abc.ABC):
    """Base class of every policy: a name, typed parameters, one method.

    Subclasses set ``name`` and ``Params`` (a frozen dataclass of their
    parameters with defaults) and implement `allocate`. Register the class in
    `malleable.policies.registry`.
    """

    name: ClassVar[str]

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, **params: Any) -> None:
        try:
            self.params = self.Params(**params)
        except TypeError as exc:
            raise ValueError(f"policy {self.name}: {exc}") from None

    @abc.abstractmethod
    def allocate(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        """Return the target allocation for ``jobs`` within ``capacity``."""
