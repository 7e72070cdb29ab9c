"""Hysteresis shared by all policies: change a running job only when it pays, and not too often.

`Hysteresis` wraps any policy (which stays a pure function of its inputs)
and filters its proposal for RUNNING jobs (current > 0); pending jobs are
free to size. A running job's proposed change is

* held during its cool-down: never sooner than ``cooldown_s`` seconds after
  its last change (``JobSet.since_change``);
* held during its lease if the change is a preemption (to 0 GPUs): not
  before it has run ``min_run_restarts`` times its restart cost since its last
  change (the restart included), so that preemptions take at most
  1 / min_run_restarts of its time (10: a tenth). Without it a policy whose
  order changes as jobs run (`srpt` on jobs of unknown size, whose
  remaining-work estimate grows with the work attained) swaps two large jobs
  at every cool-down: on workload-1 with the models' restart costs, srpt
  preempted each ImageNet job (250 s restart cost, 32 GPUs) 240 to 380 times
  and spent 5.5x fifo's GPU-hours. Shrinks are not held: a lease on them too
  cost `pollux` 1 to 9 % of average JCT on workloads 1 to 4 and gained `srpt`
  nothing more (pollux prices its own changes, `restarts.restart_factor`);
* for a grow from c to k GPUs: made only if the job's estimated remaining
  time falls by more than its restart cost plus ``min_gain`` of its
  remaining time, T(c) - T(k) - delta >= min_gain * T(c), with
  T(k) = W / goodput(k) from the speedup table;
* for a shrink or a preemption: made only if the GPUs it frees are used,
  i.e. some start or accepted grow does not fit without them. The policy is
  the judge of who deserves GPUs; hysteresis only refuses changes whose
  benefit does not clear the threshold, so a shrink whose GPUs would sit
  idle (because the grow it was meant for was refused) is undone.

Then the allocation is packed again: kept jobs first at their current size,
shrinks at their new size, then starts and accepted grows in the policy's
priority order (``Allocation.priority``). If a job the policy marked urgent
(starvation protection, ``Allocation.urgent``) cannot be placed, no job
after it in priority order may start or grow, so the capacity it waits for
is not taken by others; it gets GPUs as soon as the cool-downs that block
it expire. The result is feasible and packed like any policy's.

A start or grow that does not fit where the jobs placed before it left room
is tried again with every job packed anew (best-fit decreasing,
`Packer.repack`): the placement is notional (Slurm places the jobs), and
placing in priority order can fragment the nodes so that a proposal that
packs seems not to. Likewise a shrink is undone only if its old size still
packs.

Work conservation (`Hysteresis.decide`): if the refused changes leave GPUs idle
while jobs wait (e.g. `fifo` offered every GPU to its first job, whose grow did
not pay), the policy decides once more with the refused jobs pinned at their
current size, and that allocation is used if it runs more GPUs; so a refusal
does not idle GPUs that the policy would give to a waiting job. A grow that
fitted only in part is not pinned: the GPUs it could not take wait for it
(see the comment in `decide` for what pinning it did to `srpt`).

Source: the switching-cost threshold is the "re-allocation" guard of
elastic schedulers (Pollux, OSDI'21, section 4.2 penalises re-allocation in
its objective; Optimus, EuroSys'18, section 5.4 limits re-scaling
frequency); this module applies both as a filter, so every policy gets it.
The lease bounds the share of a job's time lost to preemptions, as the
minimum run time of time-sliced GPU schedulers does (Gandiva, OSDI'18,
section 4, suspends jobs only at the end of a time slice; Themis, NSDI'20,
grants GPUs as leases).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from malleable.config import PolicyConfig
from malleable.policies.base import Allocation, Capacity, Context, JobSet, Policy
from malleable.policies.feasibility import Grid, Packer, batch_at


class Hysteresis(Policy):
    """Wraps a policy: holds running jobs' changes that are too soon or gain too little.

    Args:
        inner: the policy whose proposals are filtered.
        min_gain: fraction of a job's remaining time a grow must save beyond
            its restart cost (>= 0).
        cooldown_s: seconds after a job's last change during which it is not
            changed again (>= 0).
        min_run_restarts: a running job is preempted (to 0 GPUs) only after it has
            run this many times its restart cost (``JobSet.restart_cost``, s)
            since its last change (>= 0; 0: no lease).

    Raises:
        ValueError: a negative or non-finite threshold (names it).
    """

    name = "hysteresis"

    @dataclass(frozen=True)
    class Params:
        min_gain: float = 0.05
        cooldown_s: float = 300.0
        min_run_restarts: float = 10.0

        def __post_init__(self) -> None:
            for name in ("min_gain", "cooldown_s", "min_run_restarts"):
                value = getattr(self, name)
                if not value >= 0:   # (`Policy` refuses NaN and infinities first)
                    raise ValueError(f"{name} must be >= 0, got {value}")

    def __init__(self, inner: Policy, *, min_gain: float = 0.05, cooldown_s: float = 300.0,
                 min_run_restarts: float = 10.0) -> None:
        super().__init__(min_gain=min_gain, cooldown_s=cooldown_s,
                         min_run_restarts=min_run_restarts)
        self.inner = inner

    @property
    def uses_size_history(self) -> bool:  # type: ignore[override]
        """As the wrapped policy."""
        return self.inner.uses_size_history

    def __repr__(self) -> str:
        return f"Hysteresis({self.inner!r}, {self.params})"

    def decide(self, jobs: JobSet, capacity: Capacity, ctx: Context) -> Allocation:
        prop = self.inner.allocate(jobs, capacity, ctx)
        p = self.params
        out = filter_changes(jobs, capacity, prop, p.min_gain, p.cooldown_s, p.min_run_restarts)
        # Work conservation: when the changes refused above leave GPUs idle while jobs
        # wait, the policy decides again with the refused jobs pinned at their size
        # (it is the judge of who gets the GPUs they did not take).
        # (Only jobs kept at their size are pinned: pinning a partly grown job too, so
        # that the GPUs its grow could not take go to waiting jobs, made srpt start
        # jobs that its next decision preempted for that grow; workload-1's average
        # JCT under srpt (its former largest-size rule) doubled, 22,144 s to 46,010 s, and
        # no other policy gained.)
        refused = (jobs.current > 0) & (out.gpus == jobs.current) & (prop.gpus != jobs.current)
        waiting = (jobs.current == 0) & (out.gpus == 0)
        if not (refused.any() and waiting.any() and int(out.gpus.sum()) < capacity.total):
            return out
        pinned = replace(jobs, min_gpus=np.where(refused, jobs.current, jobs.min_gpus),
                         max_gpus=np.where(refused, jobs.current, jobs.max_gpus))
        again = filter_changes(jobs, capacity, self.inner.allocate(pinned, capacity, ctx),
                               p.min_gain, p.cooldown_s, p.min_run_restarts)
        if int(again.gpus.sum()) <= int(out.gpus.sum()):
            return out
        reason = tuple(out.reason[j] if refused[j] else again.reason[j]
                       for j in range(len(jobs)))
        return replace(again, reason=reason)


def with_hysteresis(policy: Policy, config: PolicyConfig) -> Hysteresis:
    """Wrap ``policy`` with the thresholds of ``config`` (min_gain, cooldown_s,
    min_run_restarts)."""
    return Hysteresis(policy, min_gain=float(config.min_gain), cooldown_s=float(config.cooldown_s),
                      min_run_restarts=float(config.min_run_restarts))


def policy_from_config(config: PolicyConfig) -> Hysteresis:
    """The policy the daemon runs: ``config.name`` with ``config.params``, wrapped in hysteresis.

    Raises:
        ValueError: an unknown policy or parameter (see `registry.get_policy`).
    """
    from malleable.policies.registry import get_policy

    return with_hysteresis(get_policy(config.name, **dict(config.params)), config)


def filter_changes(jobs: JobSet, capacity: Capacity, prop: Allocation, min_gain: float,
                   cooldown_s: float, min_run_restarts: float = 0.0) -> Allocation:
    """Apply the hysteresis rules to a proposal (see the module docstring).

    Args:
        jobs, capacity: the inputs the proposal was computed for.
        prop: the wrapped policy's allocation.
        min_gain, cooldown_s, min_run_restarts: the thresholds (`Hysteresis`).

    Returns:
        A feasible, packed `Allocation`; reasons of held jobs say why.
    """
    J = len(jobs)
    t = jobs.table
    grid = Grid.build(jobs, capacity)
    klist = grid.klist
    P = prop.gpus.astype(np.int64)
    C = jobs.current
    rows = np.arange(J)
    ccol = np.minimum(np.searchsorted(t.k, C), len(t.k) - 1)
    cur_ok = (C > 0) & (t.k[ccol] == C) & grid.mask[rows, ccol]
    running = C > 0
    change = running & (P != C)
    reason = list(prop.reason)
    rt = t.remaining_time
    pcol = t.column(P)
    T_c = rt[rows, ccol]
    T_p = rt[rows, pcol]
    lease = min_run_restarts * jobs.restart_cost         # (J,) s, for preemptions
    hold_s = np.where(P == 0, np.maximum(cooldown_s, lease), cooldown_s)
    cool = change & cur_ok & (jobs.since_change < hold_s)
    grow = change & ~cool & (P > C)
    with np.errstate(invalid="ignore"):
        net = T_c - T_p - jobs.restart_cost
    with np.errstate(invalid="ignore"):
        passes = np.where(np.isinf(T_c), True, net >= min_gain * T_c)
    weak = grow & cur_ok & ~passes
    shrink = change & ~cool & (P < C) & cur_ok
    for j in np.flatnonzero(cool):
        left = hold_s[j] - jobs.since_change[j]
        what = "cool-down" if hold_s[j] == cooldown_s else \
            f"lease of {min_run_restarts:g} x its {jobs.restart_cost[j]:.0f} s restart cost"
        reason[j] = f"kept at {C[j]}: {what}, {left:.0f} s left (proposed {P[j]})"
    for j in np.flatnonzero(weak):
        gain = net[j] / T_c[j] if T_c[j] > 0 else 0.0
        reason[j] = (f"kept at {C[j]}: grow to {P[j]} saves {100 * gain:.1f}% of remaining time "
                     f"after restart, below {100 * min_gain:.1f}%")
    held = running & cur_ok & (~change | cool | weak)
    rank = (np.arange(J) if prop.priority is None else prop.priority).astype(np.int64)
    urgent = np.zeros(J, bool) if prop.urgent is None else prop.urgent.astype(bool)
    packer = Packer(capacity.gpus_per_node, capacity.free_per_node)
    final = np.zeros(J, dtype=np.int64)

    # 1. Held jobs keep their GPUs (largest first: packs like first-fit decreasing).
    unheld = []
    for j in sorted(np.flatnonzero(held), key=lambda j: (-C[j], j)):
        if packer.place(int(j), int(C[j])):
            final[j] = C[j]
        else:  # current placement not reproducible by our packer: let the proposal stand
            unheld.append(int(j))
            reason[j] = f"current {C[j]} does not pack here; " + prop.reason[j]
    # 2. Shrinks at their new size; accepted grows at their current size for now.
    accepted_grow = grow & ~weak
    for j in np.flatnonzero(shrink):
        c = grid.prev[j][min(int(pcol[j]), grid.cap_col(packer.cap()))]
        if packer.place(int(j), klist[c]):
            final[j] = klist[c]
    for j in np.flatnonzero(accepted_grow & cur_ok):
        if packer.place(int(j), int(C[j])):
            final[j] = C[j]
    # 3. Starts and grows in priority order; an urgent job that cannot be placed blocks the rest.
    benef = (~running & (P > 0)) | accepted_grow | (change & ~cur_ok)
    benef[unheld] = True
    blocked_by = None
    repack = _Repacker(packer)
    for j in sorted(np.flatnonzero(benef), key=lambda j: (rank[j], j)):
        j = int(j)
        if blocked_by is not None:
            reason[j] = (f"waits: capacity held for starving job {jobs.ids[blocked_by]}"
                         + (f"; kept at {final[j]}" if final[j] else ""))
            continue
        # The proposed size, packing the others anew if placing in priority order
        # fragmented the nodes (placement is notional: Slurm places the jobs).
        if P[j] > final[j] and repack.resize(j, int(P[j])):
            final[j] = P[j]
            continue
        old = packer.remove(j)
        c = grid.prev[j][min(int(pcol[j]), grid.cap_col(packer.cap()))]
        k = klist[c]
        if k > final[j] and running[j] and cur_ok[j] and k != P[j]:
            # a partial grow: it must clear the threshold at the size that fits
            nk = T_c[j] - rt[j, c] - jobs.restart_cost[j]
            if not (np.isinf(T_c[j]) or nk >= min_gain * T_c[j]):
                k = final[j]
        if k > final[j] and packer.place(j, k):
            final[j] = k
            reason[j] = f"{k} of proposed {P[j]} GPUs fit; " + prop.reason[j]
        else:
            packer.restore(j, old)
            reason[j] = (f"kept at {final[j]}" if final[j] else "waits") + \
                f": proposed {P[j]} GPUs do not fit; " + prop.reason[j]
        if urgent[j] and final[j] == 0:
            blocked_by = j
            reason[j] = "starving, waits for GPUs held in cool-down; " + prop.reason[j]
    # 4. Shrinks whose GPUs nobody took are undone.
    for j in sorted(np.flatnonzero(shrink), key=lambda j: (rank[j], j)):
        j = int(j)
        if final[j] != C[j] and repack.resize(j, int(C[j])):
            final[j] = C[j]
            reason[j] = f"kept at {C[j]}: the GPUs a shrink to {P[j]} frees are not needed"
    return Allocation(gpus=final, batch=batch_at(jobs, final), reason=tuple(reason),
                      objective=prop.objective, priority=prop.priority, urgent=prop.urgent)


class _Repacker:
    """`Packer.resize`, falling back to packing every job anew (`Packer.repack`).

    A repack costs a pass over the placed jobs, so it is tried only when the free
    GPUs could hold the new size, and not again for a size at least as large with
    no more GPUs free than a repack already found too few for.
    """

    def __init__(self, packer: Packer) -> None:
        self.packer = packer
        self.failed: tuple[int, int] | None = None   # (size, GPUs free then)

    def resize(self, j: int, k: int) -> bool:
        """Job j on k GPUs if it fits, moving others if need be; else no change."""
        p = self.packer
        if p.resize(j, k):
            return True
        free = p.total_free + p.size(j)
        if k > free or (self.failed is not None and k >= self.failed[0]
                        and free <= self.failed[1]):
            return False
        if p.repack(resize=(j, k)):
            return True
        self.failed = (k, free)
        return False
