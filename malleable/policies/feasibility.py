"""Feasibility repair shared by every policy: from a wish to a legal, packed allocation.

A policy states a *wish* (desired GPUs per job, fractional allowed) and a
priority order; `realize` turns it into integer GPU counts that always

* are feasible sizes for each job: 0, or min <= k <= max on its step, and on
  node granularity (k <= g inside one node, or k % g == 0 on whole nodes),
  restricted to the table's candidate grid;
* pack into the capacity node by node: a multi-node job takes k/g whole free
  nodes, a sub-node job takes k GPUs of one node (best fit: the fullest node
  that still has room, which keeps whole nodes whole for multi-node jobs).

Rounding does not waste capacity needlessly: each wish is first rounded down
to a feasible size in priority order, then GPUs still free go to the jobs
whose wish was cut the most relative to their next step (the largest
remainder method, Hamilton's apportionment), then, if the policy asks, the
remaining free GPUs are handed out by a fill rule ("priority", "value" or
"level", see `realize`). Packing uses the `Packer`, whose bookkeeping is
per node, so every allocation it produces comes with a witness placement.

Source: the rounding is the largest-remainder method of apportionment; the
packing is best-fit decreasing for bin packing (Johnson et al., SIAM J.
Comput. 1974) adapted to whole-node gangs.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from malleable.estimators.table import feasible_mask
from malleable.policies.base import Allocation, Capacity, JobSet

FILLS = ("none", "priority", "value", "level")
_EPS = 1e-9


class Packer:
    """Per-node bookkeeping of free GPUs; places jobs so that they always pack.

    Args:
        gpus_per_node: g >= 1.
        free_per_node: (N,) int, free GPUs per node, each in [0, g].

    A job of k <= g GPUs goes onto one node (best fit); a job of k > g GPUs,
    k % g == 0, takes k/g nodes that are entirely free. Placement is
    deterministic (nodes are taken last-in first-out within a free count).

    Attributes:
        free: free GPUs per node (list); total_free: their sum.
        where: job -> ((node, GPUs), ...), the placement so far.
    """

    def __init__(self, gpus_per_node: int, free_per_node: np.ndarray) -> None:
        g = int(gpus_per_node)
        self.g = g
        self.free = [int(x) for x in free_per_node]
        # buckets[r]: the nodes with exactly r free GPUs (a dict used as an ordered set).
        self.buckets: list[dict[int, None]] = [{} for _ in range(g + 1)]
        for n, f in enumerate(self.free):
            self.buckets[f][n] = None
        self.where: dict[int, tuple[tuple[int, int], ...]] = {}
        self.total_free = sum(self.free)

    def _set(self, node: int, new_free: int) -> None:
        del self.buckets[self.free[node]][node]
        self.total_free += new_free - self.free[node]
        self.free[node] = new_free
        self.buckets[new_free][node] = None

    def cap(self) -> int:
        """The largest feasible job size that fits now: whole nodes x g, or the
        largest partial node (any feasible k <= cap fits)."""
        whole = len(self.buckets[self.g])
        if whole:
            return whole * self.g
        for r in range(self.g - 1, 0, -1):
            if self.buckets[r]:
                return r
        return 0

    def cap_without(self, j: int) -> int:
        """`cap` as it would be if job j were taken off its nodes (nothing changes)."""
        where = self.where.get(j)
        if not where:
            return self.cap()
        g = self.g
        whole = len(self.buckets[g])
        if len(where) > 1 or where[0][1] == g:
            return (whole + len(where)) * g
        node, used = where[0]
        after = self.free[node] + used
        if after == g:
            return (whole + 1) * g
        return whole * g if whole else max(self.cap(), after)

    def size(self, j: int) -> int:
        """GPUs job j holds in this packing (0 if not placed)."""
        return sum(used for _, used in self.where.get(j, ()))

    def place(self, j: int, k: int) -> bool:
        """Place job j on k GPUs; False (and no change) if it does not fit.

        Raises:
            ValueError: job j is already placed.
        """
        if j in self.where:
            raise ValueError(f"job {j} is already placed")
        g = self.g
        if k <= 0:
            return True
        if k <= g:
            for r in range(k, g + 1):
                bucket = self.buckets[r]
                if bucket:
                    node, _ = bucket.popitem()
                    self.free[node] = r - k
                    self.buckets[r - k][node] = None
                    self.where[j] = ((node, k),)
                    self.total_free -= k
                    return True
            return False
        n, rest = divmod(k, g)
        bucket = self.buckets[g]
        if rest or len(bucket) < n:
            return False
        nodes = [bucket.popitem()[0] for _ in range(n)]
        for node in nodes:
            self.free[node] = 0
            self.buckets[0][node] = None
        self.where[j] = tuple((node, g) for node in nodes)
        self.total_free -= k
        return True

    def remove(self, j: int) -> tuple[tuple[int, int], ...]:
        """Take job j off its nodes; returns its former placement."""
        old = self.where.pop(j, ())
        for node, used in old:
            self._set(node, self.free[node] + used)
        return old

    def restore(self, j: int, old: tuple[tuple[int, int], ...]) -> None:
        """Put job j back exactly where `remove` found it (nothing else moved since)."""
        for node, used in old:
            self._set(node, self.free[node] - used)
        if old:
            self.where[j] = old

    def resize(self, j: int, k: int) -> bool:
        """Move job j to k GPUs if that fits once its own GPUs are freed; else no change."""
        old = self.remove(j)
        if self.place(j, k):
            return True
        self.restore(j, old)
        return False

    def repack(self, resize: tuple[int, int] | None = None) -> bool:
        """Re-place every job from scratch, largest first (best-fit decreasing).

        Placement is notional (Slurm places the jobs), so jobs may move; this
        undoes the fragmentation that placing jobs in priority order leaves.
        The new packing is kept if it fits every job (best-fit decreasing
        almost always does; if not, nothing changes).

        Args:
            resize: (job, GPUs): re-place that job at a new size at the same time.

        Returns:
            True if the jobs were re-placed.
        """
        want = {j: self.size(j) for j in self.where}
        if resize is not None:
            want[resize[0]] = resize[1]
        sizes = sorted(((k, j) for j, k in want.items() if k > 0), key=lambda kj: (-kj[0], kj[1]))
        fresh = Packer(self.g, np.asarray(self.free) + self._used())
        for k, j in sizes:
            if not fresh.place(j, k):
                return False
        self.free, self.buckets, self.where = fresh.free, fresh.buckets, fresh.where
        self.total_free = fresh.total_free
        return True

    def _used(self) -> np.ndarray:
        used = np.zeros(len(self.free), dtype=np.int64)
        for spots in self.where.values():
            for node, n in spots:
                used[node] += n
        return used

    def placement(self) -> dict[int, tuple[tuple[int, int], ...]]:
        """Job -> ((node, GPUs), ...): the witness that the allocation packs."""
        return dict(self.where)


@dataclass
class Grid:
    """Each job's feasible sizes on the table's candidate grid, indexed for speed.

    Attributes:
        k: (K,) int64 candidate counts; klist the same as a list.
        mask: (J, K) bool, feasible (table's mask AND the spec's rules for this g).
        prev: J lists of K ints: prev[j][c] = largest feasible column <= c (0 if none).
        nxt: J lists of K ints: nxt[j][c] = smallest feasible column > c (-1 if none).
        top: J ints, the largest feasible column of each job.
    """

    k: np.ndarray
    klist: list[int]
    mask: np.ndarray
    prev: list[list[int]]
    nxt: list[list[int]]
    top: list[int]

    @classmethod
    def build(cls, jobs: JobSet, capacity: Capacity) -> Grid:
        """Feasible columns of every job (spec rules intersected with the table's mask)."""
        t = jobs.table
        k = t.k.astype(np.int64)
        mask = feasible_mask(k, jobs.min_gpus, jobs.max_gpus, jobs.step, capacity.gpus_per_node)
        mask &= t.feasible.astype(bool)
        mask &= k[None, :] <= capacity.largest_job
        return cls._indexed(k, mask)

    @classmethod
    def _indexed(cls, k: np.ndarray, mask: np.ndarray) -> Grid:
        """The grid of feasibility ``mask`` (J, K) over counts ``k`` (K,), with its
        prev/nxt/top indexes (column 0, no GPUs, is always feasible)."""
        K = len(k)
        mask[:, 0] = True
        cols = np.arange(K)
        prev = np.maximum.accumulate(np.where(mask, cols, 0), axis=1)
        after = np.where(mask, cols, K)
        nxt = np.minimum.accumulate(after[:, ::-1], axis=1)[:, ::-1]
        nxt = np.concatenate([nxt[:, 1:], np.full((len(mask), 1), K)], axis=1)
        nxt = np.where(nxt >= K, -1, nxt)
        return cls(k=k, klist=k.tolist(), mask=mask, prev=prev.tolist(), nxt=nxt.tolist(),
                   top=prev[:, -1].tolist())

    def fastest(self, goodput: np.ndarray) -> np.ndarray:
        """(J,) int: each job's feasible column of the highest goodput (the smallest
        such column on a tie; 0 for a job with no feasible size above 0). A NaN
        goodput counts as the lowest; a job whose goodput is NaN at every feasible
        size gets its largest feasible column.

        Args:
            goodput: (J, K) goodput per grid column (any unit; `SpeedupTable.goodput`).
        """
        g = np.asarray(goodput, dtype=np.float64)
        g = np.where(self.mask & (self.k[None, :] > 0) & ~np.isnan(g), g, -np.inf)
        top = np.asarray(self.top, dtype=np.int64)
        best = np.argmax(g, axis=1)   # (K >= 1: column 0 always exists, also for J = 0)
        known = np.isfinite(g.max(axis=1))
        return np.where(top > 0, np.where(known, best, top), 0)

    def capped(self, cols: np.ndarray) -> Grid:
        """This grid with every column above ``cols[j]`` infeasible for job j.

        Args:
            cols: (J,) int grid column per job (0: the job may only get no GPUs).
        """
        over = np.arange(len(self.k))[None, :] > np.asarray(cols)[:, None]
        return Grid._indexed(self.k, self.mask & ~over)

    def col_floor(self, x: np.ndarray) -> np.ndarray:
        """(J,) grid column of the largest grid count <= x (x float, >= 0)."""
        return np.maximum(np.searchsorted(self.k, np.asarray(x) + _EPS, side="right") - 1, 0)

    def cap_col(self, cap: int) -> int:
        """The grid column of the largest grid count <= ``cap`` GPUs."""
        return bisect_right(self.klist, cap) - 1

    def can_run(self) -> np.ndarray:
        """(J,) bool: the job has a feasible size > 0 that fits this capacity at all."""
        return np.asarray(self.top) > 0


def order_from_keys(*keys: np.ndarray) -> np.ndarray:
    """Indices sorted by the given keys (first key most significant), ties by index.

    Returns:
        (J,) int64 permutation; ``rank[order] = arange(J)`` gives the rank.
    """
    J = len(keys[0])
    return np.lexsort((np.arange(J),) + tuple(reversed(keys))).astype(np.int64)


def ranks(order: np.ndarray) -> np.ndarray:
    """(J,) rank of each job in ``order`` (0 = first)."""
    r = np.empty(len(order), dtype=np.int64)
    r[order] = np.arange(len(order))
    return r


def realize(jobs: JobSet, capacity: Capacity, wish: np.ndarray, order: np.ndarray, *,
            fill: str = "none", value: np.ndarray | list | None = None,
            exact: np.ndarray | None = None,
            blocking: bool = False, hamilton: bool = True, grid: Grid | None = None,
            packer: Packer | None = None, window: int = 4,
            anchor: np.ndarray | None = None) -> np.ndarray:
    """Turn a wish into a feasible, packed allocation.

    Args:
        jobs, capacity: as given to the policy.
        wish: (J,) float >= 0, desired GPUs per job (fractional allowed).
        order: (J,) int permutation, priority order (first = served first).
        fill: what to do with GPUs left after rounding:
            "none" (leave them idle), "priority" (jobs in order grow to the
            largest size that fits, up to their max), "value" (greedy on the
            marginal gain per GPU of ``value``, the best ratio over the next
            ``window`` feasible sizes), "level" (the job with the fewest GPUs
            grows by one step; equal shares).
        value: (J, K) float array (or the same as nested lists), the utility
            of each job at each grid count (higher is better; -inf allowed at
            k = 0), required for "value".
        exact: (J,) bool, jobs that run only at their rounded wish or not at
            all (plain Slurm semantics for a pending request).
        blocking: stop placing jobs after the first ``exact`` job that does not
            fit (strict FIFO without backfill).
        hamilton: apply the largest-remainder round-up pass.
        grid, packer: reuse a `Grid` / a `Packer` that already holds other
            jobs (placed jobs keep their placement; their wish is ignored).
        window: feasible sizes looked ahead by the "value" fill.
        anchor: (J,) int grid column each job may also jump to in the "value"
            fill (e.g. its current size, where no restart penalty applies);
            -1 for none.

    Returns:
        (J,) int64 GPUs per job, feasible and packed (the packer holds the placement).

    Raises:
        ValueError: a wish that is negative or not finite, a bad fill name, or
            "value" without a value matrix of shape (J, K).
    """
    J = len(jobs)
    grid = grid or Grid.build(jobs, capacity)
    packer = packer or Packer(capacity.gpus_per_node, capacity.free_per_node)
    wish = np.asarray(wish, dtype=np.float64)
    if wish.shape != (J,) or not np.all(np.isfinite(wish)) or np.any(wish < 0):
        raise ValueError(f"wish must be (J,) finite and >= 0, got {wish[:4]}...")
    if fill not in FILLS:
        raise ValueError(f"fill = {fill!r}: expected one of {', '.join(FILLS)}")
    if fill == "value":
        shape = (None if value is None else value.shape if isinstance(value, np.ndarray)
                 else (len(value), len(value[0]) if len(value) else len(grid.k)))
        if shape != (J, len(grid.k)):
            raise ValueError(f"fill='value' needs a (J, K) = ({J}, {len(grid.k)}) value "
                             f"matrix, got {shape}")
    rows = value.tolist() if isinstance(value, np.ndarray) else value
    exact_l = (np.zeros(J, bool) if exact is None else np.asarray(exact, bool)).tolist()
    klist, prev, nxt = grid.klist, grid.prev, grid.nxt
    order_l = [int(j) for j in order]
    rank = ranks(np.asarray(order)).tolist()
    wish_col = grid.col_floor(wish).tolist()
    alloc = [0] * J  # grid column per job
    for j in packer.where:
        alloc[j] = bisect_right(klist, packer.size(j)) - 1
    preplaced = set(packer.where)

    # Pass 1: round each wish down to a feasible size that fits, in priority order.
    cap_col = grid.cap_col(packer.cap())
    for j in order_l:
        if j in preplaced or wish_col[j] == 0:
            continue
        want = prev[j][wish_col[j]]
        c = prev[j][min(wish_col[j], cap_col)]
        if exact_l[j] and c != want:
            if blocking:
                break
            continue
        if c and packer.place(j, klist[c]):
            alloc[j] = c
            cap_col = grid.cap_col(packer.cap())

    # Pass 2: largest remainder: jobs cut the most (relative to their next step) round up.
    if hamilton:
        cands = []
        for j in range(J):
            if j in preplaced or exact_l[j]:
                continue
            a = alloc[j]
            b = nxt[j][a]
            if b < 0:
                continue
            gap = wish[j] - klist[a]
            if gap > 1e-6 and klist[b] <= math.ceil(wish[j] - 1e-6):
                cands.append((-gap / (klist[b] - klist[a]), rank[j], j, b))
        cands.sort()
        for _, _, j, b in cands:
            if packer.resize(j, klist[b]):
                alloc[j] = b

    # Pass 3: fill what is left.
    if fill == "priority":
        if packer.cap():
            packer.repack()
        for j in order_l:
            if j in preplaced or exact_l[j]:
                continue
            old = packer.remove(j)
            c = prev[j][min(grid.top[j], grid.cap_col(packer.cap()))]
            if c > alloc[j] and packer.place(j, klist[c]):
                alloc[j] = c
            else:
                packer.restore(j, old)
    elif fill in ("value", "level"):
        skip = preplaced | {j for j in range(J) if exact_l[j]}
        anchor_l = [-1] * J if anchor is None else [int(a) for a in anchor]
        _heap_fill(grid, packer, alloc, rank, skip, fill, rows, window, anchor_l)
        # Placing in priority order can fragment nodes; repack and fill again once.
        if packer.cap() and packer.repack():
            _heap_fill(grid, packer, alloc, rank, skip, fill, rows, window, anchor_l)
    return np.asarray([klist[c] for c in alloc], dtype=np.int64)


def best_jump(grid: Grid, value_row: np.ndarray | list[float], j: int, a: int, cap: int,
              window: int, extra: int = -1) -> tuple[float, int]:
    """The best gain per GPU from column ``a`` to a larger feasible column of job j.

    Looks at the next ``window`` feasible columns (and ``extra`` if it is a
    feasible column beyond ``a``) whose count is <= ``cap``.

    Returns:
        (ratio, column); (-inf, -1) if no larger size fits.
    """
    klist, nxt = grid.klist, grid.nxt[j]
    va = value_row[a]
    best, best_b = -math.inf, -1
    b = nxt[a]
    seen = 0
    cands = []
    while b >= 0 and seen < window and klist[b] <= cap:
        cands.append(b)
        b = nxt[b]
        seen += 1
    if extra > a and klist[extra] <= cap and grid.prev[j][extra] == extra and extra not in cands:
        cands.append(extra)
    for b in cands:
        vb = value_row[b]
        if vb == -math.inf:
            continue
        r = math.inf if va == -math.inf else (vb - va) / (klist[b] - klist[a])
        if r > best:
            best, best_b = r, b
    return best, best_b


def _heap_fill(grid: Grid, packer: Packer, alloc: list[int], rank: list[int], skip: set[int],
               mode: str, rows: list[list[float]] | None, window: int,
               anchor: list[int]) -> None:
    """Greedy growth by a heap of per-job next steps (lazy re-evaluation).

    "value": key = marginal value per GPU of the best jump (stop at <= 0).
    "level": key = current GPUs (fewest first), step to the next feasible size.
    """
    klist, nxt = grid.klist, grid.nxt
    heap: list[tuple[float, int, int, int]] = []

    def key(j: int, cap: int) -> tuple[float, int]:
        a = alloc[j]
        if mode == "value":
            r, b = best_jump(grid, rows[j], j, a, cap, window, anchor[j])
            return (-r, b) if b >= 0 and r > 0 else (math.inf, -1)
        b = nxt[j][a]
        return (float(klist[a]), b) if b >= 0 and klist[b] <= cap else (math.inf, -1)

    cap0 = packer.cap()
    for j in range(len(alloc)):
        if j in skip:
            continue
        kk, b = key(j, packer.cap_without(j) if alloc[j] else cap0)
        if b >= 0:
            heap.append((kk, rank[j], j, b))
    heapq.heapify(heap)
    while heap:
        kk, r, j, b = heapq.heappop(heap)
        k2, b2 = key(j, packer.cap_without(j))
        if b2 < 0:
            continue
        if b2 != b or k2 > kk + 1e-12:
            heapq.heappush(heap, (k2, r, j, b2))
            continue
        if not packer.resize(j, klist[b2]):  # cannot happen: klist[b2] fits once j is freed
            continue
        alloc[j] = b2
        k3, b3 = key(j, packer.cap_without(j))
        if b3 >= 0:
            heapq.heappush(heap, (k3, r, j, b3))


def batch_at(jobs: JobSet, gpus: np.ndarray) -> np.ndarray:
    """(J,) recommended batch size from the table at each job's GPU count (0 at 0)."""
    t = jobs.table
    col = t.column(gpus)
    return np.where(gpus > 0, t.batch[np.arange(len(jobs)), col], 0).astype(np.int64)


def finish(jobs: JobSet, gpus: np.ndarray, reasons: list[str], *, order: np.ndarray | None = None,
           urgent: np.ndarray | None = None, objective: float = float("nan")) -> Allocation:
    """Assemble an `Allocation` (batch sizes from the table, ranks from ``order``)."""
    gpus = np.asarray(gpus, dtype=np.int64)
    return Allocation(gpus=gpus, batch=batch_at(jobs, gpus), reason=tuple(reasons),
                      objective=float(objective),
                      priority=None if order is None else ranks(np.asarray(order)),
                      urgent=None if urgent is None else np.asarray(urgent, bool))


def cannot_run_reason(grid: Grid, jobs: JobSet, capacity: Capacity) -> list[str | None]:
    """Per job: why it can never run on this capacity, or None if it can."""
    out: list[str | None] = []
    big = capacity.largest_job
    for j in range(len(jobs)):
        if grid.top[j] > 0:
            out.append(None)
        else:
            out.append(f"no feasible size fits: min {int(jobs.min_gpus[j])} GPUs, "
                       f"largest placeable {big}")
    return out
