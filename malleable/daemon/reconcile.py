"""The reconciler: from the plan and what Slurm reports now, the actions to take.

Level-triggered, as a Kubernetes controller: it compares the policy's targets
with the observed state of each malleable job and proposes the actions that
close the difference. It never consults what the daemon remembers having done,
except to skip jobs that already have an action in flight and to know which
holds are the daemon's own. Pure: no database, no Slurm, no clock.

Rules (issue 8, item 2):

* pending job, target 0: hold it (the plan does not admit it yet);
* pending job, target k > 0: resize it to k's shape if its request differs, and
  release it if the daemon holds it ("admit");
* running job, target equal to its GPUs: nothing;
* running job, smaller target: shrink in place when the job allows it
  (``shrink=inplace``) and Slurm can (same GPUs per node, fewer nodes),
  otherwise checkpoint-requeue at the new size; target 0 is a checkpoint-requeue
  that stays held (preemption);
* running job, larger target: checkpoint-requeue at the new size (Slurm cannot
  grow a running job), only when the GPUs it needs are free or being freed by
  this plan;
* with the free GPUs per node (``free_by_node``), a job is released or
  requeued only to a shape that fits on the nodes as they will be: the jobs that
  keep running stay where they are (the policy's own packing may move them), a
  requeued job's nodes are free again, and an in-place shrink gives back its last
  nodes. A grow or an admission that does not fit is skipped (the job keeps its
  size, or stays held) rather than left pending in Slurm for GPUs no node has.
  An unheld pending job (it waits in Slurm's queue whatever the daemon does) is
  still resized to its target, and waits there; its room is not reserved;
* a pending job with an action in flight that will start it (a requeue or an
  admission on its way to the release, or released and not running yet) is
  counted first: its GPUs and, with ``free_by_node``, a place for its shape
  (``bound_for``) are taken before any grow or admission of this plan, so none
  takes the room it is about to start in;
* shrinks and preemptions first, then admissions and grows, in plan order;
* at most ``max_requeues`` checkpoint-requeues in flight at once;
* rigid and unmanaged jobs never appear here: the caller passes only malleable jobs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from malleable.daemon.shapes import Shape, can_shrink_in_place, shape_for
from malleable.slurm.records import JobState


class ActionKind(enum.StrEnum):
    """What an action does to a job (its steps: `malleable.daemon.actions`)."""

    HOLD = "hold"          # keep a pending job from starting
    ADMIT = "admit"        # resize a pending job (if needed) and release it
    SHRINK = "shrink"      # release nodes of a running job in place
    REQUEUE = "requeue"    # checkpoint, requeue-hold, resize, release (target 0: stay held)


@dataclass(frozen=True)
class JobView:
    """What the reconciler needs to know about one malleable job.

    Attributes:
        job_id: Slurm job id.
        state: Slurm's base state (only PENDING and RUNNING lead to actions).
        shape: its current shape: allocated when running, requested when pending.
        held: the job is held in Slurm (by anyone).
        held_by_daemon: the hold is the daemon's own (it may release it).
        shrink_inplace: the job's spec allows in-place shrink.
        busy: an action for this job is still in flight.
        requeue_blocked: the job may not be requeued now (backed off after a
            failed checkpoint, not requeueable, or not a batch job).
        placement: a running job's GPUs per node, ((node name, GPUs), ...) in its
            node list's order; () when pending or unknown.
        bound_for: with ``busy``, the shape its in-flight action starts it at (the
            action's target), None if it does not start it (a hold, a preemption).
    """

    job_id: str
    state: JobState
    shape: Shape
    held: bool = False
    held_by_daemon: bool = False
    shrink_inplace: bool = False
    busy: bool = False
    requeue_blocked: bool = False
    placement: tuple[tuple[str, int], ...] = ()
    bound_for: Shape | None = None

    @property
    def gpus(self) -> int:
        return self.shape.gpus


def start_shape(kind: str, to_gpus: int | None, to_nodes: int | None) -> Shape | None:
    """The shape an in-flight action starts its job at (`JobView.bound_for`).

    Args:
        kind: the action's `ActionKind` value.
        to_gpus, to_nodes: its target GPUs and nodes (as stored with the action).

    Returns:
        ``to_nodes`` x ``to_gpus / to_nodes`` for a requeue or an admission to a
        size; None for a hold, a shrink (the job keeps running), a preemption
        (0 GPUs) or an action without a node count.
    """
    if kind not in (ActionKind.REQUEUE, ActionKind.ADMIT) or not to_gpus or not to_nodes:
        return None
    return Shape(int(to_nodes), int(to_gpus) // int(to_nodes))


#: How a skip for want of a node with room starts (`NodePool.describe`).
NO_PLACEMENT = "no placement"


class NodePool:
    """Free GPUs per node of the malleable pool, as the planned actions change them.

    Args:
        free: node name -> GPUs no job holds there now (>= 0).

    Source: best fit for bin packing (Johnson et al., SIAM J. Comput. 1974), as the
    policies' `malleable.policies.feasibility.Packer`.
    """

    def __init__(self, free: Mapping[str, int]) -> None:
        self.free = {n: int(f) for n, f in free.items()}

    def give(self, placement: Iterable[tuple[str, int]]) -> None:
        """GPUs a job releases (nodes outside the pool are ignored)."""
        for node, k in placement:
            if node in self.free:
                self.free[node] += k

    def take(self, placement: Iterable[tuple[str, int]]) -> None:
        """GPUs a job holds from now on (nodes outside the pool are ignored)."""
        for node, k in placement:
            if node in self.free:
                self.free[node] -= k

    def fit(self, shape: Shape) -> tuple[tuple[str, int], ...] | None:
        """Where ``shape`` would go: ``shape.nodes`` nodes with at least
        ``shape.gpus_per_node`` free GPUs each, the fullest first (best fit, then by
        name); None if there are not enough."""
        k = shape.gpus_per_node
        nodes = sorted((f, n) for n, f in self.free.items() if f >= k)
        if len(nodes) < shape.nodes:
            return None
        return tuple((n, k) for _, n in nodes[:shape.nodes])

    def claim(self, shape: Shape) -> tuple[tuple[str, int], ...] | None:
        """`fit` ``shape`` and `take` the place found; None (nothing taken) if none."""
        where = self.fit(shape)
        if where is not None:
            self.take(where)
        return where

    def describe(self, shape: Shape) -> str:
        """Why ``shape`` does not fit, for the skip reason."""
        room = sum(1 for f in self.free.values() if f >= shape.gpus_per_node)
        most = max(self.free.values(), default=0)
        return (f"{NO_PLACEMENT}: needs {shape.nodes} node(s) with {shape.gpus_per_node} free "
                f"GPUs, {room} have them (most free on one node: {most})")


@dataclass(frozen=True)
class Target:
    """The plan for one job: ``gpus`` (0 = not running), batch size, reason."""

    job_id: str
    gpus: int
    batch: int = 0
    reason: str = ""


@dataclass(frozen=True)
class PlannedAction:
    """An action the reconciler proposes; the actuator records and executes it.

    Attributes:
        job_id: the job.
        kind: `ActionKind`.
        from_gpus: GPUs the job has (running) or requests (pending) now.
        to_gpus: GPUs after the action (0 = held / not running).
        to_shape: the target shape (None when to_gpus is 0).
        batch: recommended batch size at the new size (0 = unchanged).
        reason: why, for the log and `malleable actions`.
    """

    job_id: str
    kind: ActionKind
    from_gpus: int
    to_gpus: int
    to_shape: Shape | None
    batch: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Skipped:
    """A difference between plan and state the reconciler left alone this cycle, and why."""

    job_id: str
    reason: str


def plan_actions(views: Iterable[JobView], targets: Iterable[Target], *, gpus_per_node: int,
                 free_gpus: int, requeues_in_flight: int = 0, max_requeues: int = 4,
                 free_by_node: Mapping[str, int] | None = None,
                 ) -> tuple[list[PlannedAction], list[Skipped]]:
    """Actions that move the observed malleable jobs toward the plan.

    Args:
        views: the malleable jobs as observed now (any order).
        targets: the plan, in priority order (earlier targets get GPUs first when
            admissions and grows compete for freed GPUs). Jobs without a target
            are left alone.
        gpus_per_node: g, GPUs per node.
        free_gpus: GPUs of the malleable pool that no job holds now.
        requeues_in_flight: checkpoint-requeues already under way.
        max_requeues: cap on checkpoint-requeues in flight at once.
        free_by_node: node name -> GPUs of the malleable pool no job holds there now;
            with it, releases and requeues are also placed node by node (see the
            module doc; running jobs need their ``placement``). None: GPU counts only.

    Returns:
        (actions in execution order: frees first, then admissions and grows;
        differences skipped this cycle with the reason).

    Raises:
        ValueError: a target that is not a legal shape on nodes of g GPUs.
    """
    by_id: Mapping[str, JobView] = {v.job_id: v for v in views}
    frees: list[PlannedAction] = []
    # (action or None, GPUs it needs from the budget, whether it waits for them, the
    # shape it starts at)
    takes: list[tuple[PlannedAction | None, int, bool, Shape]] = []
    skipped: list[Skipped] = []
    grows: dict[str, tuple[tuple[str, int], ...]] = {}   # a grow's current placement
    restarts: list[tuple[PlannedAction, JobView]] = []   # requeues to a smaller shape
    bound: list[Shape] = []    # pending jobs an in-flight action is about to start
    budget = int(free_gpus)
    requeue_slots = max(0, max_requeues - requeues_in_flight)
    pool = NodePool(free_by_node) if free_by_node is not None else None

    for t in targets:
        v = by_id.get(t.job_id)
        if v is None:
            continue
        shape = shape_for(t.gpus, gpus_per_node) if t.gpus > 0 else None
        if v.busy:
            if _differs(v, t, shape):
                skipped.append(Skipped(v.job_id, "action in flight"))
            if v.state == JobState.PENDING and v.bound_for is not None:
                bound.append(v.bound_for)
            continue
        if v.state == JobState.PENDING:
            if t.gpus == 0:
                if not v.held:
                    frees.append(PlannedAction(v.job_id, ActionKind.HOLD, v.gpus, 0, None,
                                               0, t.reason or "not admitted by the plan"))
                continue
            if v.held and not v.held_by_daemon:
                skipped.append(Skipped(v.job_id, "held by someone else"))
                continue
            admit = None
            if v.shape != shape or v.held:
                admit = PlannedAction(v.job_id, ActionKind.ADMIT, v.gpus, t.gpus, shape,
                                      t.batch, t.reason or "admitted")
            # An unheld pending job competes for GPUs whatever we do: resizing it is
            # never gated, but it uses up budget. Releasing a held one is gated.
            takes.append((admit, t.gpus, v.held, shape))
            continue
        if v.state != JobState.RUNNING:
            continue
        c = v.gpus
        if t.gpus == c:
            continue
        if 0 < t.gpus < c and v.shrink_inplace and can_shrink_in_place(v.shape, shape):
            frees.append(PlannedAction(v.job_id, ActionKind.SHRINK, c, t.gpus, shape, t.batch,
                                       t.reason or "shrink in place"))
            budget += c - t.gpus
            if pool is not None:   # Slurm keeps the first nodes of the list
                pool.give(v.placement[shape.nodes:])
            continue
        if v.requeue_blocked:
            skipped.append(Skipped(v.job_id, "requeue backed off or not allowed"))
            continue
        if t.gpus < c:
            if requeue_slots == 0:
                skipped.append(Skipped(v.job_id, "requeue cap reached"))
                continue
            requeue_slots -= 1
            frees.append(PlannedAction(v.job_id, ActionKind.REQUEUE, c, t.gpus, shape, t.batch,
                                       t.reason or ("preempt" if t.gpus == 0 else "shrink")))
            budget += c - t.gpus
            if pool is not None:
                pool.give(v.placement)
                if shape is not None:   # it restarts at the smaller shape: placed below
                    restarts.append((frees[-1], v))
        else:
            takes.append((PlannedAction(v.job_id, ActionKind.REQUEUE, c, t.gpus, shape, t.batch,
                                        t.reason or "grow"), t.gpus - c, True, shape))
            if pool is not None:
                grows[v.job_id] = v.placement

    # Jobs an earlier action is starting come first: their GPUs and a place for them.
    for start in bound:
        budget = max(0, budget - start.gpus)
        if pool is not None:
            pool.claim(start)

    # Smaller restarts, once every free of the plan is counted: on their own nodes or
    # elsewhere; one that fits nowhere keeps running as it is.
    for action, v in restarts:
        if pool.claim(action.to_shape) is None:
            skipped.append(Skipped(v.job_id, pool.describe(action.to_shape)))
            frees.remove(action)
            pool.take(v.placement)
            requeue_slots += 1
            budget -= action.from_gpus - action.to_gpus

    admitted: list[PlannedAction] = []
    for action, need, gated, start in takes:
        if not gated:
            budget = max(0, budget - need)
            if action is not None:
                admitted.append(action)
            if pool is not None:   # it competes for GPUs whatever we do: its place is taken
                pool.claim(start)
            continue
        is_requeue = action.kind == ActionKind.REQUEUE
        if need > budget:
            skipped.append(Skipped(action.job_id, f"needs {need} GPUs, {budget} free"))
            continue
        if is_requeue and requeue_slots == 0:
            skipped.append(Skipped(action.job_id, "requeue cap reached"))
            continue
        if pool is not None:
            own = grows.get(action.job_id, ())
            pool.give(own)               # a requeued job's own GPUs are free again
            if pool.claim(action.to_shape) is None:
                pool.take(own)
                skipped.append(Skipped(action.job_id, pool.describe(action.to_shape)))
                continue
        if is_requeue:
            requeue_slots -= 1
        budget -= need
        admitted.append(action)
    return frees + admitted, skipped


def _differs(v: JobView, t: Target, shape: Shape | None) -> bool:
    if v.state == JobState.PENDING:
        return (t.gpus == 0) != v.held or (shape is not None and shape != v.shape)
    return v.state == JobState.RUNNING and t.gpus != v.gpus
