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

Every record validates its arrays on construction and raises `ValueError`
naming the field, the offending job id and the value, so a bad record is
caught where it is built (the daemon drops or repairs that one job), never
deep inside a policy.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from malleable.estimators.table import SpeedupTable, feasible_mask


def _as(arr: Any, dtype: Any, name: str, J: int, owner: str) -> np.ndarray:
    a = np.asarray(arr)
    if a.shape != (J,):
        raise ValueError(f"{owner}.{name} must have shape ({J},), got {a.shape}")
    if dtype is np.int64:
        if a.size and not np.issubdtype(a.dtype, np.integer) and (
                not np.all(np.isfinite(a)) or np.any(a != np.round(a))):
            raise ValueError(f"{owner}.{name} must hold integers, got {a[:3]}...")
        return a.astype(np.int64)
    return a.astype(np.float64)


@dataclass(frozen=True)
class JobSet:
    """The malleable jobs a policy allocates, as parallel arrays of length J.

    Attributes:
        ids: (J,) object, job ids as strings (Slurm ids, e.g. "123", "123_4").
        min_gpus, max_gpus, step: (J,) int64, the job's spec (feasible sizes:
            `malleable.estimators.table.feasible_mask`); 1 <= min <= max, step >= 1.
        current: (J,) int64, GPUs the job holds now (0 = pending or held).
        table: the estimators' `SpeedupTable` for these J jobs (same order).
        attained: (J,) float64, attained service so far, GPU-seconds (>= 0).
        age: (J,) float64, seconds since submission (>= 0).
        restart_cost: (J,) float64, seconds lost per checkpoint-requeue (delta, >= 0).
        since_change: (J,) float64, seconds since the job's size last changed
            (inf if never; a preemption to 0 is a change), for the cool-down
            and for the waiting time of a pending job (`waiting`).
        weight: (J,) float64, relative importance (> 0; default 1).
        requested: (J,) int64, the GPUs the job asked Slurm for at submission
            (what plain Slurm would run it on; default: max_gpus).
        restarts: (J,) int64, checkpoint-requeues so far (Slurm's RestartCnt;
            default 0); Pollux's re-allocation factor uses it.

    Raises:
        ValueError: a field of the wrong shape, a non-finite or negative value
            where one is not allowed, min > max, or a table of another length;
            the message names the field, the job id and the value.
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
    requested: np.ndarray = field(default=None)  # type: ignore[assignment]
    restarts: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=object)
        if ids.ndim != 1:
            raise ValueError(f"JobSet.ids must be one-dimensional, got shape {ids.shape}")
        object.__setattr__(self, "ids", ids)
        J = len(ids)
        if self.weight is None:
            object.__setattr__(self, "weight", np.ones(J))
        if self.requested is None:
            object.__setattr__(self, "requested", self.max_gpus)
        if self.restarts is None:
            object.__setattr__(self, "restarts", np.zeros(J, dtype=np.int64))
        for name in ("min_gpus", "max_gpus", "step", "current", "requested", "restarts"):
            object.__setattr__(self, name, _as(getattr(self, name), np.int64, name, J, "JobSet"))
        for name in ("attained", "age", "restart_cost", "since_change", "weight"):
            object.__setattr__(self, name, _as(getattr(self, name), np.float64, name, J, "JobSet"))
        if not isinstance(self.table, SpeedupTable):
            raise ValueError(f"JobSet.table must be a SpeedupTable, "
                             f"got {type(self.table).__name__}")
        if self.table.num_jobs != J:
            raise ValueError(f"JobSet.table has {self.table.num_jobs} jobs, expected {J}")
        checks = (
            ("min_gpus", self.min_gpus >= 1, ">= 1"),
            ("max_gpus", self.max_gpus >= self.min_gpus, ">= min_gpus"),
            ("step", self.step >= 1, ">= 1"),
            ("current", self.current >= 0, ">= 0"),
            ("requested", self.requested >= 0, ">= 0"),
            ("restarts", self.restarts >= 0, ">= 0"),
            ("attained", np.isfinite(self.attained) & (self.attained >= 0), "finite and >= 0"),
            ("age", np.isfinite(self.age) & (self.age >= 0), "finite and >= 0"),
            ("restart_cost", np.isfinite(self.restart_cost) & (self.restart_cost >= 0),
             "finite and >= 0"),
            ("since_change", ~np.isnan(self.since_change) & (self.since_change >= 0),
             ">= 0 (inf allowed)"),
            ("weight", np.isfinite(self.weight) & (self.weight > 0), "finite and > 0"),
        )
        for name, ok, what in checks:
            if not np.all(ok):
                i = int(np.flatnonzero(~ok)[0])
                value = getattr(self, name)[i].item()
                raise ValueError(f"JobSet.{name} of job {ids[i]!s} = {value!r}: expected {what}")
        t = self.table
        for name, arr, ok_fn in (
                ("table.remaining_work", t.remaining_work, lambda a: np.isfinite(a) & (a >= 0)),
                ("table.remaining_std", t.remaining_std, lambda a: np.isfinite(a) & (a >= 0))):
            ok = ok_fn(arr)
            if not np.all(ok):
                i = int(np.flatnonzero(~ok)[0])
                raise ValueError(f"JobSet.{name} of job {ids[i]!s} = {arr[i].item()!r}: "
                                 f"expected finite and >= 0")
        bad = ~(np.isfinite(t.goodput) & (t.goodput >= 0))
        if np.any(bad):
            i, c = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"JobSet.table.goodput of job {ids[i]!s} at k={int(t.k[c])} = "
                             f"{t.goodput[i, c].item()!r}: expected finite and >= 0")

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, index: np.ndarray) -> JobSet:
        """The jobs selected by ``index`` ((J,) bool mask or integer indices), in that order,
        with their rows of the table (e.g. to drop a job the estimators could not model)."""
        J = len(self)
        idx = np.arange(J)[np.asarray(index)]
        t = self.table
        rows = {f.name: getattr(t, f.name)[idx] for f in dataclasses.fields(t)
                if f.name != "k" and isinstance(getattr(t, f.name), np.ndarray)
                and getattr(t, f.name).shape[:1] == (J,)}
        table = dataclasses.replace(t, **rows)
        arrays = {f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)
                  if f.name != "table"}
        return JobSet(table=table, **arrays)

    @property
    def waiting(self) -> np.ndarray:
        """(J,) float64 seconds a pending job has waited since it last ran (or since
        submission if it never ran); 0 for running jobs."""
        since = np.where(np.isfinite(self.since_change), self.since_change, np.inf)
        return np.where(self.current > 0, 0.0, np.minimum(since, self.age))


@dataclass(frozen=True)
class Capacity:
    """The GPUs malleable jobs may use.

    Attributes:
        gpus_per_node: g, GPUs per node (homogeneous cluster), >= 1.
        free_per_node: (N,) int64, for each node, the GPUs malleable jobs may
            occupy (0 <= free <= g): its GPUs minus those held by rigid or
            unmanaged jobs (GPUs held by the malleable jobs being allocated
            count as free). A job with more than g GPUs needs whole nodes
            whose free count is g; a job with at most g GPUs fits in one node.

    Raises:
        ValueError: g < 1, or a node's free count outside [0, g].
    """

    gpus_per_node: int
    free_per_node: np.ndarray

    def __post_init__(self) -> None:
        g = int(self.gpus_per_node)
        if g < 1 or g != self.gpus_per_node:
            raise ValueError(f"Capacity.gpus_per_node = {self.gpus_per_node!r}: expected an "
                             f"integer >= 1")
        object.__setattr__(self, "gpus_per_node", g)
        free = np.asarray(self.free_per_node)
        if free.ndim != 1:
            raise ValueError(f"Capacity.free_per_node must be one-dimensional, got {free.shape}")
        free = _as(free, np.int64, "free_per_node", len(free), "Capacity")
        bad = (free < 0) | (free > g)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"Capacity.free_per_node of node {i} = {int(free[i])}: expected "
                             f"0 <= free <= gpus_per_node ({g})")
        object.__setattr__(self, "free_per_node", free)

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int) -> Capacity:
        """``nodes`` whole nodes of ``gpus_per_node`` free GPUs each."""
        return cls(gpus_per_node, np.full(int(nodes), int(gpus_per_node), dtype=np.int64))

    @property
    def total(self) -> int:
        return int(np.sum(self.free_per_node))

    @property
    def whole_nodes(self) -> int:
        return int(np.sum(self.free_per_node >= self.gpus_per_node))

    @property
    def largest_job(self) -> int:
        """The most GPUs one job can get here: whole nodes x g, or the largest partial node."""
        if self.whole_nodes:
            return self.whole_nodes * self.gpus_per_node
        return int(self.free_per_node.max()) if len(self.free_per_node) else 0


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

    def __post_init__(self) -> None:
        h = np.asarray(self.size_history, dtype=np.float64).ravel()
        bad = ~np.isfinite(h) | (h < 0)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"Context.size_history[{i}] = {h[i].item()!r}: "
                             f"expected finite and >= 0")
        object.__setattr__(self, "size_history", h)


@dataclass(frozen=True)
class Allocation:
    """A policy's answer.

    Attributes:
        gpus: (J,) int64, target GPUs per job (0 = not running). Always feasible
            for the job and packable into the `Capacity` it was computed for.
        batch: (J,) int64, recommended global batch size at that count (0 if not running).
        reason: (J,) tuple of short strings, why each job got its target.
        objective: the policy's objective value for this allocation (NaN if none).
        priority: (J,) int64 rank the policy served jobs in (0 = first), or None.
            The hysteresis wrapper places changes in this order.
        urgent: (J,) bool, jobs promoted by starvation protection, or None. The
            hysteresis wrapper holds capacity for them rather than let
            lower-priority jobs take it.
    """

    gpus: np.ndarray
    batch: np.ndarray
    reason: tuple[str, ...]
    objective: float = float("nan")
    priority: np.ndarray | None = None
    urgent: np.ndarray | None = None


def check_allocation(alloc: Allocation, jobs: JobSet, capacity: Capacity) -> None:
    """Verify an allocation's invariants (cheap necessary conditions).

    Checks shapes, that every target is 0 or a feasible size for its job
    (bounds, step, node granularity, on the table's grid), that the total fits
    the free GPUs, that multi-node jobs fit the whole free nodes, and that
    sub-node jobs fit the GPUs left. Packability in full is guaranteed by
    construction (`malleable.policies.feasibility.Packer`).

    Raises:
        RuntimeError: an invariant does not hold (a policy bug, never bad input).
    """
    J = len(jobs)
    g = capacity.gpus_per_node
    gpus = alloc.gpus
    if gpus.shape != (J,) or alloc.batch.shape != (J,) or len(alloc.reason) != J:
        raise RuntimeError(f"allocation shapes {gpus.shape}, {alloc.batch.shape}, "
                           f"{len(alloc.reason)} do not match {J} jobs")
    k = jobs.table.k
    col = np.minimum(np.searchsorted(k, gpus), len(k) - 1)
    mask = feasible_mask(k, jobs.min_gpus, jobs.max_gpus, jobs.step, g)
    ok = (k[col] == gpus) & mask[np.arange(J), col]
    if not np.all(ok):
        i = int(np.flatnonzero(~ok)[0])
        raise RuntimeError(f"policy bug: job {jobs.ids[i]} got {int(gpus[i])} GPUs, not a "
                           f"feasible size (min {jobs.min_gpus[i]}, max {jobs.max_gpus[i]}, "
                           f"step {jobs.step[i]}, g {g})")
    multi = gpus > g
    if int(gpus[multi].sum()) // g > capacity.whole_nodes or int(gpus.sum()) > capacity.total:
        raise RuntimeError(f"policy bug: allocation of {int(gpus.sum())} GPUs exceeds capacity "
                           f"({capacity.total} free, {capacity.whole_nodes} whole nodes)")


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_ok(v, args[0]) for v in value)
        return len(args) == len(value) and all(
            _type_ok(v, a) for v, a in zip(value, args, strict=True))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


_INT64 = 2 ** 63


def _as_declared(value: Any, tp: Any) -> Any:
    """``value`` (which `_type_ok` accepted for ``tp``) as the parameter holds it: an
    integer given for a number is a float, a list a tuple.

    Raises:
        ValueError: an integer outside 64 bits (TOML's integers; every one inside is a
            finite float).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if not -_INT64 <= value < _INT64:
            raise ValueError("out of range (integers have 64 bits)")
        return value if _takes_int(tp) else float(value)
    if isinstance(value, list | tuple):
        args = typing.get_args(tp) if typing.get_origin(tp) is tuple else ()
        if typing.get_origin(tp) is typing.Union or typing.get_origin(tp) is types.UnionType:
            args = next((typing.get_args(a) for a in typing.get_args(tp)
                         if typing.get_origin(a) is tuple), ())
        items = [args[0] if len(args) == 2 and args[1] is Ellipsis
                 else (args[i] if i < len(args) else Any) for i in range(len(value))]
        return tuple(_as_declared(v, t) for v, t in zip(value, items, strict=True))
    return value


def _takes_int(tp: Any) -> bool:
    """Whether a parameter of type ``tp`` holds integers as integers (int, or a union
    with int; else an integer given is a number, stored as a float)."""
    if tp is int or tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return any(_takes_int(a) for a in typing.get_args(tp))
    return False


def _type_words(tp: Any) -> str:
    """What a parameter of type ``tp`` takes, in an operator's words (TOML values, as
    `malleable policy set` and ``[policy] params`` read them)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_words(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true or false"
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    if origin is tuple:
        args = typing.get_args(tp)
        item = args[0] if args else Any
        kind = {float: "numbers", int: "integers", str: "strings"}.get(item, "values")
        example = {float: "[3600, 7200]", int: "[1, 2]"}.get(item, "[...]")
        return f"a list of {kind}, e.g. {example}"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return str(getattr(tp, "__name__", tp))


class Policy(abc.ABC):
    """Base class of every policy: a name, typed parameters, one method.

    Subclasses set ``name`` and ``Params`` (a frozen dataclass of their
    parameters with defaults; a ``__post_init__`` may check ranges and raise
    ValueError) and implement `decide`. Callers use `allocate`, which checks
    the inputs, handles the empty job set, calls `decide` and verifies the
    answer (`check_allocation`). Register the class in
    `malleable.policies.registry` (one line).
    """

    name: ClassVar[str]
    #: Whether `decide` reads ``Context.size_history`` (the caller may leave it empty
    #: otherwise, and skip reading it from the state store).
    uses_size_history: ClassVar[bool] = False

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, **params: Any) -> None:
        hints = typing.get_type_hints(self.Params)
        known = {f.name for f in dataclasses.fields(self.Params)}
        for key, value in params.items():
            if key not in known:
                raise ValueError(f"policy {self.name}: unknown parameter {key!r} "
                                 f"(known: {', '.join(sorted(known)) or 'none'})")
            if not _type_ok(value, hints[key]):
                raise ValueError(f"policy {self.name}: parameter {key} = {value!r}: expected "
                                 f"{_type_words(hints[key])}")
            try:
                params[key] = _as_declared(value, hints[key])
            except ValueError as exc:
                raise ValueError(f"policy {self.name}: parameter {key} = {value!r}: {exc}"
                                 ) from None
            held = params[key]
            if any(isinstance(v, float) and not math.isfinite(v)
                   for v in (held if isinstance(held, tuple) else (held,))):
                raise ValueError(f"policy {self.name}: parameter {key} = {value!r}: expected "
                                 "finite numbers (nan and infinities are never accepted)")
        try:
            self.params = self.Params(**params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"policy {self.name}: {exc}") from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"

    def allocate(self, jobs: JobSet, capacity: Capacity, ctx: Context | None = None) -> Allocation:
        """Return the target allocation for ``jobs`` within ``capacity``.

        Args:
            jobs: the J malleable jobs (see `JobSet`).
            capacity: the free GPUs per node (see `Capacity`).
            ctx: time, seed and history (default `Context()`).

        Returns:
            An `Allocation` of J targets that is feasible for every job and
            packable into ``capacity``.

        Raises:
            RuntimeError: the policy produced an infeasible allocation (a bug).
        """
        ctx = Context() if ctx is None else ctx
        if len(jobs) == 0:
            z = np.zeros(0, dtype=np.int64)
            return Allocation(z, z.copy(), (), priority=z.copy(), urgent=np.zeros(0, bool))
        alloc = self.decide(jobs, capacity, ctx)
        check_allocation(alloc, jobs, capacity)
        return alloc

    @abc.abstractmethod
    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        """Compute the allocation (J >= 1); called by `allocate`, which verifies it."""
