"""The reconciler: plan vs. observed state -> actions (pure; no Slurm needed)."""

from __future__ import annotations

import pytest

from malleable.daemon.reconcile import ActionKind, JobView, Target, plan_actions, start_shape
from malleable.daemon.shapes import Shape, can_shrink_in_place, shape_for
from malleable.slurm.records import JobState

R, P = JobState.RUNNING, JobState.PENDING


def kinds(actions):
    return [(a.job_id, a.kind, a.to_gpus) for a in actions]


def test_shapes():
    assert shape_for(3, 4) == Shape(1, 3)
    assert shape_for(8, 4) == Shape(2, 4)
    with pytest.raises(ValueError, match="neither within one node nor whole nodes"):
        shape_for(6, 4)
    with pytest.raises(ValueError, match=">= 1"):
        shape_for(0, 4)
    assert can_shrink_in_place(Shape(2, 4), Shape(1, 4))
    assert not can_shrink_in_place(Shape(1, 4), Shape(1, 2))  # GRES per node is fixed
    assert not can_shrink_in_place(Shape(2, 4), Shape(2, 4))


def test_pending_hold_and_admit():
    views = [JobView("1", P, Shape(1, 4)), JobView("2", P, Shape(1, 4), held=True,
                                                     held_by_daemon=True)]
    actions, skipped = plan_actions(views, [Target("1", 0), Target("2", 8)], gpus_per_node=4,
                                    free_gpus=16)
    assert kinds(actions) == [("1", ActionKind.HOLD, 0), ("2", ActionKind.ADMIT, 8)]
    assert actions[1].to_shape == Shape(2, 4)
    assert skipped == []


def test_held_by_someone_else_is_left_alone():
    views = [JobView("1", P, Shape(1, 4), held=True, held_by_daemon=False)]
    actions, skipped = plan_actions(views, [Target("1", 4)], gpus_per_node=4, free_gpus=16)
    assert actions == [] and skipped[0].reason == "held by someone else"


def test_shrink_in_place_only_when_allowed_and_possible():
    views = [JobView("a", R, Shape(2, 4), shrink_inplace=True),
             JobView("b", R, Shape(2, 4), shrink_inplace=False),
             JobView("c", R, Shape(1, 4), shrink_inplace=True)]
    actions, _ = plan_actions(views, [Target("a", 4), Target("b", 4), Target("c", 2)],
                              gpus_per_node=4, free_gpus=0)
    assert kinds(actions) == [("a", ActionKind.SHRINK, 4), ("b", ActionKind.REQUEUE, 4),
                              ("c", ActionKind.REQUEUE, 2)]


def test_shrinks_before_grows_and_grow_needs_freed_gpus():
    views = [JobView("big", R, Shape(3, 4)), JobView("small", R, Shape(1, 4))]
    targets = [Target("small", 8), Target("big", 8)]  # plan order: small first
    actions, skipped = plan_actions(views, targets, gpus_per_node=4, free_gpus=0)
    assert kinds(actions) == [("big", ActionKind.REQUEUE, 8), ("small", ActionKind.REQUEUE, 8)]
    assert skipped == []
    # Without the shrink there is nothing to grow into.
    actions, skipped = plan_actions(views, [Target("small", 8)], gpus_per_node=4, free_gpus=0)
    assert actions == [] and "needs 4 GPUs, 0 free" in skipped[0].reason


def test_requeue_cap_counts_in_flight():
    views = [JobView(str(i), R, Shape(2, 4)) for i in range(4)]
    targets = [Target(str(i), 4) for i in range(4)]
    actions, skipped = plan_actions(views, targets, gpus_per_node=4, free_gpus=0,
                                    requeues_in_flight=1, max_requeues=3)
    assert len(actions) == 2
    assert [s.reason for s in skipped] == ["requeue cap reached"] * 2


def test_busy_and_backed_off_jobs_are_skipped():
    views = [JobView("1", R, Shape(2, 4), busy=True), JobView("2", R, Shape(2, 4),
                                                              requeue_blocked=True)]
    actions, skipped = plan_actions(views, [Target("1", 4), Target("2", 4)], gpus_per_node=4,
                                    free_gpus=0)
    assert actions == []
    assert [s.reason for s in skipped] == ["action in flight", "requeue backed off or not allowed"]


def test_preempt_is_requeue_to_zero():
    actions, _ = plan_actions([JobView("1", R, Shape(1, 2))], [Target("1", 0)], gpus_per_node=4,
                              free_gpus=0)
    assert kinds(actions) == [("1", ActionKind.REQUEUE, 0)] and actions[0].to_shape is None


def test_unheld_pending_job_uses_budget_before_later_admissions():
    views = [JobView("1", P, Shape(1, 4)), JobView("2", P, Shape(1, 4), held=True,
                                                     held_by_daemon=True)]
    actions, skipped = plan_actions(views, [Target("1", 4), Target("2", 4)], gpus_per_node=4,
                                    free_gpus=4)
    assert actions == [] and "needs 4 GPUs, 0 free" in skipped[0].reason


def test_no_action_when_plan_matches_and_unknown_jobs_ignored():
    views = [JobView("1", R, Shape(1, 4)), JobView("2", P, Shape(1, 2))]
    actions, skipped = plan_actions(views, [Target("1", 4), Target("2", 2), Target("9", 4)],
                                    gpus_per_node=4, free_gpus=2)
    assert actions == [] and skipped == []


# ---------------------------------------------------------------- placement node by node


def test_a_grow_no_node_can_hold_is_skipped_not_requeued():
    """2 nodes x 4 GPUs: A runs on 2 GPUs of n1, a rigid job on 2 of n2, B on 1 of n2.
    The policy's packing may move A to make room, but A keeps its size, so it stays:
    B at 4 GPUs (one node) has no node. By GPU count alone (3 free with B's own) it was
    requeued and pended in Slurm until the rigid job ended (found on the harness)."""
    views = [JobView("A", R, Shape(1, 2), placement=(("n1", 2),)),
             JobView("B", R, Shape(1, 1), placement=(("n2", 1),))]
    targets = [Target("A", 2), Target("B", 4)]
    pool = {"n1": 2, "n2": 1}   # the malleable pool (n1 4, n2 2) less A and B where they run
    actions, skipped = plan_actions(views, targets, gpus_per_node=4, free_gpus=3,
                                    free_by_node=pool)
    assert actions == []
    assert [(s.job_id, s.reason) for s in skipped] == [
        ("B", "no placement: needs 1 node(s) with 4 free GPUs, 0 have them (most free on "
              "one node: 2)")]
    # Without the node list: GPU counts only, as before.
    actions, _ = plan_actions(views, targets, gpus_per_node=4, free_gpus=3)
    assert kinds(actions) == [("B", ActionKind.REQUEUE, 4)]
    # A leaves n1: B fits there, with its own GPU on n2 given back.
    actions, skipped = plan_actions(views, [Target("A", 0), Target("B", 4)], gpus_per_node=4,
                                    free_gpus=3, free_by_node=pool)
    assert kinds(actions) == [("A", ActionKind.REQUEUE, 0), ("B", ActionKind.REQUEUE, 4)]
    assert skipped == []


def test_a_job_an_action_in_flight_is_starting_keeps_its_room():
    """J was requeued to 4 GPUs by an earlier decision and waits, held, for its release
    (its old GPUs on n1 are free in Slurm now). B runs on n2 beside a rigid job. B's
    grow this cycle must not take n1: J would then pend in Slurm behind B. Before, a
    busy job reserved nothing, and B was requeued onto n1."""
    j = JobView("J", P, Shape(1, 2), held=True, held_by_daemon=True, busy=True,
                bound_for=start_shape("requeue", 4, 1))
    b = JobView("B", R, Shape(1, 2), placement=(("n2", 2),))
    targets = [Target("J", 4), Target("B", 4)]
    pool = {"n1": 4, "n2": 0, "n3": 2}      # 6 free GPUs, one whole node
    actions, skipped = plan_actions([j, b], targets, gpus_per_node=4, free_gpus=6,
                                    free_by_node=pool)
    assert actions == []
    assert [(s.job_id, s.reason) for s in skipped] == [
        ("J", "action in flight"),
        ("B", "no placement: needs 1 node(s) with 4 free GPUs, 0 have them (most free on "
              "one node: 2)")]
    # By GPU count too: J's 4 are spoken for.
    actions, skipped = plan_actions([j, b], targets, gpus_per_node=4, free_gpus=4)
    assert actions == [] and skipped[1].reason == "needs 2 GPUs, 0 free"
    # Room for both (n3 has 4 free): B grows onto n3 and J keeps n1.
    actions, skipped = plan_actions([j, b], targets, gpus_per_node=4, free_gpus=8,
                                    free_by_node={**pool, "n3": 4})
    assert kinds(actions) == [("B", ActionKind.REQUEUE, 4)]
    # A hold (or a preemption) in flight starts nothing: nothing is reserved for it.
    held = JobView("J", P, Shape(1, 2), held=True, held_by_daemon=True, busy=True,
                   bound_for=start_shape("hold", 0, None))
    actions, _ = plan_actions([held, b], [Target("J", 0), Target("B", 4)], gpus_per_node=4,
                              free_gpus=4, free_by_node=pool)
    assert kinds(actions) == [("B", ActionKind.REQUEUE, 4)]


def test_start_shape():
    assert start_shape("requeue", 8, 2) == Shape(2, 4)
    assert start_shape("admit", 3, 1) == Shape(1, 3)
    for args in (("requeue", 0, None), ("hold", 0, None), ("shrink", 4, 1),
                 ("admit", 4, None)):
        assert start_shape(*args) is None


def test_placement_of_admissions_multi_node_shapes_and_in_place_shrinks():
    # n1, n2 half free, n3 and n4 held by "big" (2x4): 4 GPUs free, but no whole node.
    pool = {"n1": 2, "n2": 2, "n3": 0, "n4": 0}
    views = [JobView("big", R, Shape(2, 4), shrink_inplace=True,
                     placement=(("n3", 4), ("n4", 4))),
             JobView("new", P, Shape(1, 4), held=True, held_by_daemon=True)]
    actions, skipped = plan_actions(views, [Target("big", 8), Target("new", 4)],
                                    gpus_per_node=4, free_gpus=4, free_by_node=pool)
    assert actions == [] and skipped[0].job_id == "new"
    assert skipped[0].reason == ("no placement: needs 1 node(s) with 4 free GPUs, 0 have "
                                 "them (most free on one node: 2)")
    # big shrinks in place to one node: Slurm keeps n3 and gives back n4, where new fits.
    actions, skipped = plan_actions(views, [Target("big", 4), Target("new", 4)],
                                    gpus_per_node=4, free_gpus=4, free_by_node=pool)
    assert kinds(actions) == [("big", ActionKind.SHRINK, 4), ("new", ActionKind.ADMIT, 4)]
    assert skipped == []
    # Two whole nodes for a 2x4 admission: n4 and ... none: it waits.
    views[1] = JobView("new", P, Shape(2, 4), held=True, held_by_daemon=True)
    actions, skipped = plan_actions(views, [Target("big", 4), Target("new", 8)],
                                    gpus_per_node=4, free_gpus=4, free_by_node=pool)
    assert kinds(actions) == [("big", ActionKind.SHRINK, 4)]
    assert skipped[0].reason.startswith("no placement: needs 2 node(s) with 4 free GPUs, 1 ")
    # A sub-node admission goes to the fullest node that has room (best fit).
    views2 = [JobView("x", P, Shape(1, 2), held=True, held_by_daemon=True),
              JobView("y", P, Shape(1, 3), held=True, held_by_daemon=True)]
    actions, skipped = plan_actions(views2, [Target("x", 2), Target("y", 3)],
                                    gpus_per_node=4, free_gpus=6,
                                    free_by_node={"n1": 2, "n2": 4})
    # (x on n1, the fullest with room, leaves n2 whole for y; on n2 it would block y.)
    assert kinds(actions) == [("x", ActionKind.ADMIT, 2), ("y", ActionKind.ADMIT, 3)]


def test_a_requeue_to_a_smaller_shape_that_fits_nowhere_is_skipped():
    # 2x2 (two half nodes) down to 1x3: neither of its nodes has 3 once it leaves them.
    views = [JobView("j", R, Shape(2, 2), placement=(("n1", 2), ("n2", 2)))]
    actions, skipped = plan_actions(views, [Target("j", 3)], gpus_per_node=4, free_gpus=0,
                                    free_by_node={"n1": 0, "n2": 0})
    assert actions == [] and skipped[0].reason.startswith("no placement: needs 1 node(s) with 3")


def test_an_unheld_pending_job_is_resized_to_its_target_even_where_no_node_has_room_yet():
    """An unheld pending job waits in Slurm's queue whatever the daemon does: it is resized
    to the policy's size and waits there (FIFO's first job keeps its claim). Leaving it at
    its old request instead (tried after the review) tripled fifo's average JCT on
    workload-1 (11,369 -> 33,474 s): Slurm then started it at a size the plan did not
    choose. Its room is not reserved: a held job that fits now is admitted."""
    views = [JobView("p", P, Shape(1, 2))]
    actions, skipped = plan_actions(views, [Target("p", 4)], gpus_per_node=4, free_gpus=4,
                                    free_by_node={"n1": 2, "n2": 2})
    assert kinds(actions) == [("p", ActionKind.ADMIT, 4)] and skipped == []
    views.append(JobView("h", P, Shape(1, 2), held=True, held_by_daemon=True))
    actions, skipped = plan_actions(views, [Target("p", 4), Target("h", 2)], gpus_per_node=4,
                                    free_gpus=8, free_by_node={"n1": 2, "n2": 2})
    assert kinds(actions) == [("p", ActionKind.ADMIT, 4), ("h", ActionKind.ADMIT, 2)]


def test_a_smaller_restart_is_placed_after_every_free_of_the_plan():
    """(From the review.) j (2x2 on n1, n2) restarts at 1x3; k leaving n3 makes room, in
    whichever order the plan lists them."""
    views = [JobView("j", R, Shape(2, 2), placement=(("n1", 2), ("n2", 2))),
             JobView("k", R, Shape(1, 4), placement=(("n3", 4),))]
    pool = {"n1": 0, "n2": 0, "n3": 0}
    for order in (["j", "k"], ["k", "j"]):
        targets = [Target("j", 3) if x == "j" else Target("k", 0) for x in order]
        actions, skipped = plan_actions(views, targets, gpus_per_node=4, free_gpus=0,
                                        free_by_node=pool)
        assert sorted(kinds(actions)) == [("j", ActionKind.REQUEUE, 3),
                                          ("k", ActionKind.REQUEUE, 0)], order
        assert skipped == []
    # Without k leaving, j keeps running as it is (its requeue slot is not used up).
    actions, skipped = plan_actions(views, [Target("j", 3), Target("k", 4)], gpus_per_node=4,
                                    free_gpus=0, free_by_node=pool, max_requeues=1)
    assert actions == [] and skipped[0].job_id == "j"
