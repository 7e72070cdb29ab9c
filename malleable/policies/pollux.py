"""`pollux`: goodput-based allocation maximising Pollux's fairness-weighted objective.

Model (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI'21, section 4.2, and its artifact's
simulator, petuum/adaptdl branch osdi21-artifact, simulator/pollux.py):

* SPEEDUP_j(k) = GOODPUT_j(k) / GOODPUT_j(k_fair): a job's goodput (at its
  goodput-optimal batch size, as the estimators' table holds it) relative to
  its goodput at a fair share of the cluster, k_fair = ceil(C / J) GPUs for
  C free GPUs and J jobs (interpolated on the table's grid).
* Re-allocation penalty (`malleable.policies.restarts`): a running job whose
  size changes has its speedup multiplied by
  r_j = max(T_j - R_j delta_j, 0) / (T_j + delta_j), with T_j its age, R_j
  its restarts so far and delta_j its restart cost. (The
  artifact also applies the factor to jobs that start; here starting a
  pending job is not a restart and is not penalised.)
* FITNESS_p(A) = (sum_j w_j (SPEEDUP_j + eps)^p / sum_j w_j)^(1/p), the
  weighted power mean (geometric mean for p = 0). p = -1 (the paper's
  choice) trades total goodput for fairness; eps = 1e-3 (as in the
  artifact) keeps a job with no GPUs finite (it contributes eps^p), so the
  objective also decides which jobs run when not all fit.

Solver (not the paper's genetic algorithm, same objective): maximise the
separable utility sum_j w_j u(SPEEDUP_j), u(x) = (x + eps)^p / p (log for
p = 0), which is increasing in the power mean. (1) Greedy marginal gain:
repeatedly give the next feasible size (within ``window`` sizes, or the
job's current size, where no penalty applies) to the job with the largest
utility gain per GPU, starting from nothing allocated and packing with the
shared `Packer`. For concave utilities and unit steps this greedy is
optimal (Gross 1956; Ibaraki and Katoh, "Resource Allocation Problems",
1988, ch. 4). (2) Local search:
move GPUs from the jobs that lose least per GPU to the job that gains most
per GPU while that improves the objective (at most ``search_moves`` moves).
The tests compare the result with exhaustive search on small clusters.

Starvation: a pending job waiting ``starve_s`` seconds is placed first at
its minimum (`malleable.policies.starvation`); not part of Pollux.

Source: Qiao et al., OSDI'21, section 4.2 (SPEEDUP, FITNESS_p, the
re-allocation factor); the normalisation, eps and the restart delay follow
the artifact's simulator.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.curves import goodput_at, smallest_runnable
from malleable.policies.feasibility import (
    Grid,
    Packer,
    best_jump,
    cannot_run_reason,
    finish,
    order_from_keys,
    realize,
)
from malleable.policies.restarts import current_column, penalise_changes
from malleable.policies.starvation import promoted, starvation_keys


def pollux_speedup(jobs: JobSet, capacity: Capacity) -> np.ndarray:
    """(J, K) SPEEDUP_j(k) = goodput(k) / goodput(ceil(C / J)), before restart penalties.

    A job that cannot run on the fair share ceil(C / J) (its batch does not fit that
    few GPUs' memory: goodput 0 there) is normalised by its goodput at the smallest
    size it can run on instead; Pollux's jobs, which accumulate gradients, always
    run on the fair share, so the artifact never meets this case. All zeros for a
    job that can run nowhere.
    """
    t = jobs.table
    fair = max(1, math.ceil(capacity.total / len(jobs)))
    base = goodput_at(t, np.full(len(jobs), float(fair)))
    _, smallest = smallest_runnable(t)
    base = np.where(base > 0, base, smallest)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = t.goodput / base[:, None]
    return np.where(base[:, None] > 0, s, 0.0)


def penalised_speedup(jobs: JobSet, capacity: Capacity) -> np.ndarray:
    """(J, K) speedup times the restart factor wherever a running job's size would change."""
    return penalise_changes(pollux_speedup(jobs, capacity), jobs)


def power_mean(x: np.ndarray, w: np.ndarray, p: float, eps: float) -> float:
    """Weighted power mean of (x + eps): (sum w (x+eps)^p / sum w)^(1/p); geometric at p = 0."""
    y = np.asarray(x, dtype=np.float64) + eps
    w = np.asarray(w, dtype=np.float64)
    if p == 0:
        return float(np.exp(np.sum(w * np.log(y)) / np.sum(w)))
    return float((np.sum(w * y ** p) / np.sum(w)) ** (1.0 / p))


def utility(x: np.ndarray, p: float, eps: float) -> np.ndarray:
    """u(x) = (x + eps)^p / p (log(x + eps) at p = 0): increasing, and sum w u(x) is
    increasing in the power mean, so maximising one maximises the other."""
    y = np.asarray(x, dtype=np.float64) + eps
    return np.log(y) if p == 0 else y ** p / p


def local_search(grid: Grid, packer: Packer, alloc: list[int], U: list[list[float]], *,
                 moves: int, window: int, anchor: list[int], protected: set[int],
                 max_donors: int = 8, repacks: int = 8) -> int:
    """Improve a separable utility by moving GPUs from cheap donors to the best receiver.

    Each move: the job with the largest utility gain per GPU for growing (to
    one of its next ``window`` feasible sizes or its anchor) takes GPUs that
    up to ``max_donors`` shrinks of other jobs free, one feasible step each
    (cheapest loss per GPU first); the move is kept only if it packs and the
    total utility rises. If the freed GPUs are enough but fragmented, the
    jobs are re-placed (best-fit decreasing, at most ``repacks`` times per
    call). ``protected`` jobs are never shrunk.

    Returns:
        The number of moves made (alloc and packer are updated in place).
    """
    klist, prev = grid.klist, grid.prev
    J = len(alloc)
    ver = [0] * J
    big = 1 << 60

    def up(j: int) -> tuple[float, int]:
        return best_jump(grid, U[j], j, alloc[j], big, window, anchor[j])

    def down(j: int) -> tuple[float, int]:
        a = alloc[j]
        if a == 0 or j in protected:
            return math.inf, -1
        cands = {prev[j][a - 1], 0}
        if 0 <= anchor[j] < a and prev[j][anchor[j]] == anchor[j]:
            cands.add(anchor[j])
        best, best_c = math.inf, -1
        for c in cands:
            loss = (U[j][a] - U[j][c]) / (klist[a] - klist[c])
            if loss < best:
                best, best_c = loss, c
        return best, best_c

    recv: list[tuple[float, int, int, int]] = []
    dono: list[tuple[float, int, int, int]] = []
    for j in range(J):
        r, b = up(j)
        if b >= 0 and r > 0:
            recv.append((-r, 0, j, b))
        loss, c = down(j)
        if c >= 0:
            dono.append((loss, 0, j, c))
    heapq.heapify(recv)
    heapq.heapify(dono)
    done = 0
    while recv and done < moves:
        negr, v, r, b = heapq.heappop(recv)
        if v != ver[r] or alloc[r] >= b:
            continue
        gain = U[r][b] - U[r][alloc[r]]
        taken: list[tuple[int, tuple, int]] = []
        aside: list[tuple[float, int, int, int]] = []
        loss = 0.0
        ok = packer.resize(r, klist[b])
        if not ok and repacks > 0 and packer.total_free >= klist[b] - klist[alloc[r]]:
            repacks -= 1
            ok = packer.repack(resize=(r, klist[b]))
        if not ok:
            while dono and len(taken) < max_donors:
                lpg, dv, d, c = heapq.heappop(dono)
                if dv != ver[d] or alloc[d] <= c:
                    continue
                if d == r:
                    aside.append((lpg, dv, d, c))
                    continue
                need = klist[b] - klist[alloc[r]] - packer.total_free
                if need > 0 and loss + lpg * need >= gain:
                    # every further GPU costs at least lpg: the move cannot pay
                    aside.append((lpg, dv, d, c))
                    break
                old_d = packer.remove(d)
                if not packer.place(d, klist[c]):  # cannot happen: smaller than before
                    packer.restore(d, old_d)
                    continue
                taken.append((d, old_d, alloc[d]))
                loss += U[d][alloc[d]] - U[d][c]
                alloc[d] = c
                if loss >= gain:
                    break
                ll, cc = down(d)  # the same donor may give another step
                if cc >= 0:
                    heapq.heappush(dono, (ll, ver[d], d, cc))
                if packer.resize(r, klist[b]):
                    ok = True
                    break
                if repacks > 0 and packer.total_free >= klist[b] - klist[alloc[r]]:
                    # enough GPUs are free but fragmented: re-place everyone, then retry
                    repacks -= 1
                    if packer.repack(resize=(r, klist[b])):
                        ok = True
                        break
            if ok and loss >= gain:
                ok = False
                packer.resize(r, klist[alloc[r]])  # shrinking back always fits
            if not ok:
                for d, old_d, a in reversed(taken):
                    packer.remove(d)
                    packer.restore(d, old_d)
                    alloc[d] = a
                for d in {d for d, _, _ in taken}:  # fresh heap entries for the donors
                    ver[d] += 1
                    loss_d, c_d = down(d)
                    if c_d >= 0:
                        heapq.heappush(dono, (loss_d, ver[d], d, c_d))
                taken = []
        for entry in aside:
            heapq.heappush(dono, entry)
        if not ok:
            ver[r] += 1  # give up on this receiver for now
            continue
        alloc[r] = b
        done += 1
        for j in {r} | {d for d, _, _ in taken}:
            ver[j] += 1
            rr, bb = up(j)
            if bb >= 0 and rr > 0:
                heapq.heappush(recv, (-rr, ver[j], j, bb))
            ll, cc = down(j)
            if cc >= 0:
                heapq.heappush(dono, (ll, ver[j], j, cc))
    return done


class PolluxPolicy(Policy):
    """Maximise the power mean of goodput speedups (Pollux's FITNESS_p) by greedy + local search."""

    name = "pollux"

    @dataclass(frozen=True)
    class Params:
        p: float = -1.0          # power-mean exponent (Pollux: -1; 1 = total speedup)
        eps: float = 1e-3        # added to every speedup (Pollux artifact)
        window: int = 2          # feasible sizes one greedy step may jump
        search_moves: int = 500  # local-search moves at most
        starve_s: float = 3600.0  # a pending job waiting this long is placed first

        def __post_init__(self) -> None:
            if not self.p <= 1.0:
                raise ValueError(f"p must be <= 1, got {self.p}")
            if self.eps <= 0:
                raise ValueError(f"eps must be > 0, got {self.eps}")
            if self.window < 1:
                raise ValueError(f"window must be >= 1, got {self.window}")
            if self.search_moves < 0:
                raise ValueError(f"search_moves must be >= 0, got {self.search_moves}")
            if self.starve_s <= 0:
                raise ValueError(f"starve_s must be > 0, got {self.starve_s}")

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        prm = self.params
        J = len(jobs)
        t = jobs.table
        grid = Grid.build(jobs, capacity)
        x = penalised_speedup(jobs, capacity)
        U = jobs.weight[:, None] * utility(x, prm.p, prm.eps)
        anchor = current_column(jobs, grid.mask)
        up = promoted(jobs, prm.starve_s)
        group, wait = starvation_keys(jobs, prm.starve_s)
        rows = U.tolist()

        # Greedy from nothing allocated; a running job's current size is a jump target
        # without penalty (``anchor``). (A warm start from the current allocation was
        # never better after the local search, in our tests, and costs a second pass.)
        wish = np.where(up, jobs.min_gpus, 0).astype(float)
        order = order_from_keys(group, wait, np.where(anchor >= 0, 0, 1))
        packer = Packer(capacity.gpus_per_node, capacity.free_per_node)
        gpus = realize(jobs, capacity, wish, order, fill="value", value=rows, grid=grid,
                       packer=packer, hamilton=False, window=prm.window, anchor=anchor)
        alloc = t.column(gpus).tolist()
        protected = {int(j) for j in np.flatnonzero(up & (gpus > 0))}
        local_search(grid, packer, alloc, rows, moves=prm.search_moves, window=prm.window,
                     anchor=anchor.tolist(), protected=protected)
        gpus = np.asarray([grid.klist[c] for c in alloc], dtype=np.int64)
        cols = np.asarray(alloc)
        sp = x[np.arange(J), cols]
        objective = power_mean(sp, jobs.weight, prm.p, prm.eps)
        never = cannot_run_reason(grid, jobs, capacity)
        fair = max(1, math.ceil(capacity.total / J))
        reasons = []
        for j in range(J):
            tag = "starving, placed first; " if up[j] else ""
            # Pollux's speedup is relative to the job's goodput at the fair share, not
            # at 1 GPU (`malleable job show` plots the latter): say so.
            reasons.append(never[j] or f"pollux: {tag}{gpus[j]} GPUs, goodput {sp[j]:.2f}x "
                                       f"that at the fair share of {fair}")
        return finish(jobs, gpus, reasons, order=order_from_keys(group, wait, -sp),
                      urgent=up, objective=objective)
