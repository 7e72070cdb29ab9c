"""The daemon's cycle in-process against the simulator's Slurm, for what the harness
cannot make happen on cue.

`Daemon` runs here exactly as in the service, with `SimSlurm` (the project's model
of Slurm 22.05, malleable/sim/slurm.py) as its port, the simulator's clock and a
real SQLite store: a job that Slurm keeps pending after its release (its GPUs
went to an earlier job), the pause rules, and a poll that skipped a job record it
could not parse (the CLI port's ``parse_errors``; the subclass below stands in for
a record 22.05 would not let us corrupt on cue).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from malleable.config import parse_config
from malleable.daemon.cycle import CycleReport, Daemon
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import VANISHED, Action, Decision, Job, JobEvent, Target
from malleable.sim.engine import Engine
from malleable.sim.jobs import ProfileJob, RigidJob
from malleable.sim.profiles import load_profile
from malleable.sim.slurm import SimSlurm
from malleable.slurm.client import SlurmParseError, SlurmRejected, SlurmUnavailable
from malleable.slurm.records import JobState, SubmitRequest

SPEC = "malleable:gpus=2-4,step=2,grace=60,batch=512,restart_cost=0"


class SkippingSlurm(SimSlurm):
    """SimSlurm whose ``jobs()`` leaves out the ids in ``skip`` and reports them in
    ``parse_errors`` (what the CLI port does with a record it cannot parse)."""

    skip: frozenset[str] = frozenset()
    lookup_fails = False
    parse_errors: list[SlurmParseError] = []

    def jobs(self):
        out = super().jobs()
        self.parse_errors = [SlurmParseError(f"jobs[?].job_state: unknown (job {j})",
                                             field="job_state") for j in sorted(self.skip)]
        return [j for j in out if j.job_id not in self.skip]

    def job(self, job_id):
        if self.lookup_fails:
            self.rpc_count += 1
            raise SlurmParseError("scontrol show job: JobState=??? unreadable", field="JobState")
        return super().job(job_id)


class FlakySlurm(SimSlurm):
    """SimSlurm whose listed methods fail: ``down`` ones as an unanswered controller
    (`SlurmUnavailable`), ``refuse`` ones as a refusal (`SlurmRejected`)."""

    down: frozenset[str] = frozenset()
    refuse: frozenset[str] = frozenset()

    def __getattribute__(self, name):
        if name in object.__getattribute__(self, "down"):
            def unavailable(*_a, **_k):
                self.rpc_count += 1
                raise SlurmUnavailable(f"{name}: Unable to contact slurm controller")
            return unavailable
        if name in object.__getattribute__(self, "refuse"):
            def refused(job_id, *_a, **_k):
                self.rpc_count += 1
                raise SlurmRejected(f"{name} {job_id}: refused", job_id=job_id,
                                    slurm_message="Job is no longer pending execution")
            return refused
        return super().__getattribute__(name)


class Cluster:
    """A simulated cluster, a state store and a `Daemon` on them."""

    def __init__(self, tmp: Path, nodes: int = 2, slurm_cls=SimSlurm,
                 queue_depth: int = 100) -> None:
        self.engine = Engine()
        self.slurm = slurm_cls(self.engine, nodes=nodes, gpus_per_node=4)
        self.spool = tmp / "spool"
        self.spool.mkdir()
        db = make_engine(f"sqlite:///{tmp}/m.db")
        schema.prepare_schema(db)
        self.sessions = session_factory(db)
        config = parse_config({"progress": {"spool_dir": str(self.spool)},
                               "policy": {"name": "equi", "min_gain": 0.0, "cooldown_s": 0.0,
                                          "min_run_restarts": 0.0, "queue_depth": queue_depth},
                               "daemon": {"poll_interval_s": 10.0, "decide_interval_s": 20.0}})
        self.daemon = Daemon(slurm=self.slurm, sessions=self.sessions,
                             clock=self.engine.datetime_at, spool_dir=str(self.spool),
                             config=config)

    def submit(self, nodes: int, gpus_per_node: int, program, comment: str = "") -> str:
        return self.slurm.submit_sim(SubmitRequest(script="/bin/true", nodes=nodes,
                                                   gpus_per_node=gpus_per_node, comment=comment,
                                                   requeue=True), program)

    def malleable(self, nodes: int = 1, gpus_per_node: int = 2) -> str:
        return self.submit(nodes, gpus_per_node, ProfileJob(load_profile("cifar10"),
                                                            spool_dir=self.spool, batch=512),
                           SPEC)

    def advance(self, seconds: float) -> None:
        self.engine.run(until=self.engine.now + seconds)

    def job(self, job_id: str):
        """The job as the simulated controller has it (bypassing a failing lookup)."""
        return SimSlurm.job(self.slurm, job_id)

    def actions(self, job_id: str) -> list[Action]:
        with self.sessions() as s:
            return list(s.scalars(select(Action).join(Job, Job.id == Action.job_id)
                                  .where(Job.slurm_job_id == job_id).order_by(Action.id)))

    def db_id(self, job_id: str) -> int:
        with self.sessions() as s:
            return s.scalar(select(Job.id).where(Job.slurm_job_id == job_id))


def test_a_job_slurm_keeps_pending_after_its_release_is_not_blocked_by_observe(tmp_path):
    c = Cluster(tmp_path)
    c.submit(1, 4, RigidJob(1e6))                     # node1
    p = c.malleable()                                 # node2, 2 of 4 GPUs
    q = c.submit(1, 4, RigidJob(1e6))                 # pending: node2 has 2 GPUs free
    c.advance(60)                                     # P is past its start-up, training
    r = c.daemon.decide_cycle()                       # equi: P grows to 4 (requeue)
    assert [(x.job_id, x.kind.value, x.to_gpus) for x in r.planned] == [(p, "requeue", 4)]
    c.advance(15)                                     # P checkpoints
    c.daemon.poll_cycle()                             # requeue_hold ... release
    c.advance(10)
    # Q, earlier in the queue, took node2 when P was requeued; P pends behind it.
    assert c.job(q).state == JobState.RUNNING and c.job(p).state == JobState.PENDING
    assert not c.job(p).held
    c.daemon.poll_cycle()
    (a,) = c.actions(p)
    assert a.state == "observe" and a.note == "PENDING, waiting to run"
    c.advance(10)
    r = c.daemon.decide_cycle()                       # no GPU left for P: target 0
    a, hold = c.actions(p)
    assert a.state == "done" and a.note.startswith(f"superseded by decision {r.decision_id} "
                                                   "(target 0 GPUs)")
    assert hold.kind == "hold" and hold.state == "done" and c.job(p).held


def test_paused_drops_untouched_actions_finishes_started_ones_and_releases_holds(tmp_path):
    c = Cluster(tmp_path)
    p = c.malleable()                                 # node1
    u = c.malleable()                                 # node1
    h = c.submit(2, 4, RigidJob(1e6), SPEC)           # pending: needs both nodes
    c.advance(60)
    c.daemon.poll_cycle()
    now = c.engine.datetime_at()
    c.slurm.hold(h)
    c.slurm.signal(p, "USR1")
    with c.sessions() as s, s.begin():
        ids = store.job_ids(s, [p, u, h])
        # H: held by the daemon (its hold is recorded, done).
        done = store.create_action(s, job_id=ids[h], kind="hold", state="hold", to_gpus=0,
                                   now=now, from_gpus=8)
        store.update_action(s, done.id, now=now, state="done", finished=True)
        # P: signalled, waiting for its checkpoint (past the point of no return).
        signalled = store.create_action(s, job_id=ids[p], kind="requeue",
                                        state="wait_checkpoint", to_gpus=4, to_nodes=1,
                                        now=now, from_gpus=2)
        store.update_action(s, signalled.id, now=now, signalled_at=now)
        # U: recorded, never started.
        store.create_action(s, job_id=ids[u], kind="requeue", state="signal", to_gpus=4,
                            to_nodes=1, now=now, from_gpus=2)
        store.set_paused(s, True)
    c.advance(15)
    report = c.daemon.poll_cycle()
    assert report.paused
    (ua,) = c.actions(u)
    assert ua.state == "abandoned" and ua.note == "paused by an operator"
    release = c.actions(h)[-1]
    assert (release.kind, release.state) == ("admit", "done") and not c.job(h).held
    # P's requeue went on (it had checkpointed): requeued, resized, released while paused.
    assert report.drive.calls == {"requeue_hold": 1, "resize_pending": 1, "start_now": 1,
                                  "release": 2}
    assert c.actions(p)[0].state == "observe"
    c.advance(60)
    c.daemon.poll_cycle()
    assert c.actions(p)[0].state == "done"
    assert c.job(p).gpus == 4 and c.job(p).restart_count == 1
    assert c.job(u).state == JobState.RUNNING and c.job(u).restart_count == 0
    # Paused decisions are recorded; no action is started.
    n = sum(len(c.actions(j)) for j in (p, u, h))
    r = c.daemon.decide_cycle()
    assert r.paused and r.decision_id is not None and r.planned
    assert sum(len(c.actions(j)) for j in (p, u, h)) == n


def test_a_job_missing_from_a_poll_with_parse_errors_is_not_taken_as_finished(tmp_path):
    c = Cluster(tmp_path, slurm_cls=SkippingSlurm)
    p = c.malleable()
    h = c.submit(2, 4, RigidJob(1e6), SPEC)           # pending
    c.advance(1)
    c.daemon.poll_cycle()
    now = c.engine.datetime_at()
    with c.sessions() as s, s.begin():
        store.create_action(s, job_id=store.job_ids(s, [h])[h], kind="hold", state="hold",
                            to_gpus=0, now=now, from_gpus=8)

    c.slurm.skip = frozenset({p, h})
    c.slurm.lookup_fails = True
    c.advance(10)
    r = c.daemon.decide_cycle()                       # drives twice: looks H up once
    with c.sessions() as s:
        states = dict(s.execute(select(Job.slurm_job_id, Job.state)).all())
        vanished = s.scalars(select(JobEvent).where(JobEvent.detail.like("%no longer%"))).all()
    assert states == {p: "RUNNING", h: "PENDING"} and vanished == []
    (a,) = c.actions(h)                               # looked up, unreadable: it waits
    assert a.state == "hold" and a.finished_at is None and not c.job(h).held
    # The poll, one lookup (not one per drive), and the first node-list read.
    assert (r.rpc, r.rpc_poll, r.rpc_nodes) == (3, 1, 1)
    assert r.decision_id is not None                  # the others are still decided for

    c.slurm.lookup_fails = False
    c.advance(10)
    r = c.daemon.poll_cycle()                         # looked up, held
    (a,) = c.actions(h)
    assert a.state == "done" and c.job(h).held
    assert r.rpc == 3 and r.drive.calls == {"hold": 1}

    # A job that is really gone (cancelled, purged after MinJobAge) is finished.
    c.slurm.skip = frozenset()
    c.slurm.cancel(p)
    c.advance(400)
    c.daemon.poll_cycle()
    with c.sessions() as s:
        # (Cancelled and purged before a poll saw it; no "finished" line: not COMPLETED.)
        assert s.scalar(select(Job.state).where(Job.slurm_job_id == p)) in ("CANCELLED",
                                                                            VANISHED)


def test_a_steady_decide_cycle_costs_one_rpc(tmp_path):
    c = Cluster(tmp_path)
    jobs = [c.malleable() for _ in range(4)]          # 2 per node: equi keeps them at 2
    c.advance(1)
    c.daemon.refresh_nodes(c.engine.datetime_at(), force=True)
    for _ in range(3):
        c.advance(20)
        r = c.daemon.decide_cycle()
        assert r.managed == 4 and not r.planned
        assert (r.rpc, r.rpc_poll, r.rpc_nodes, r.drive.rpc_count) == (1, 1, 0, 0)
    assert all(c.job(j).restart_count == 0 for j in jobs)


def grow_one(tmp_path) -> tuple[Cluster, str]:
    """P on 2 GPUs alone on a 1-node cluster: equi grows it to 4 (checkpoint-requeue)."""
    c = Cluster(tmp_path, nodes=1, slurm_cls=FlakySlurm)
    p = c.malleable()
    c.advance(60)
    r = c.daemon.decide_cycle()
    assert [(x.kind.value, x.to_gpus) for x in r.planned] == [("requeue", 4)]
    c.advance(15)                                     # P checkpoints
    return c, p


def test_slurm_down_in_the_middle_of_an_action_leaves_the_step_to_retry(tmp_path):
    c, p = grow_one(tmp_path)
    c.slurm.down = frozenset({"requeue_hold"})
    r = c.daemon.decide_cycle()
    (a,) = c.actions(p)
    assert r.slurm_unavailable and r.decision_id is None      # no decision on it either
    assert a.state == "requeue_hold" and "Unable to contact" in a.last_error
    assert c.job(p).state == JobState.RUNNING and c.job(p).restart_count == 0
    c.slurm.down = frozenset({"jobs"})                # the poll fails: nothing is driven
    c.advance(10)
    r = c.daemon.poll_cycle()
    assert r.slurm_unavailable and r.rpc == 1 and c.actions(p)[0].state == "requeue_hold"
    c.slurm.down = frozenset()
    c.advance(10)
    c.daemon.poll_cycle()
    c.advance(10)
    c.daemon.poll_cycle()
    (a,) = c.actions(p)
    assert a.state == "done" and c.job(p).gpus == 4 and c.job(p).restart_count == 1


def test_a_stop_releases_a_job_held_mid_requeue(tmp_path):
    c, p = grow_one(tmp_path)
    c.slurm.refuse = frozenset({"resize_pending"})    # requeued and held, resize refused
    c.daemon.poll_cycle()
    (a,) = c.actions(p)
    assert a.state == "resize" and a.next_attempt_at is not None
    assert c.job(p).state == JobState.PENDING and c.job(p).held
    assert c.daemon.release_holds() == 1
    (a,) = c.actions(p)
    assert a.state == "observe" and a.note == "released on daemon stop"
    assert not c.job(p).held
    c.advance(5)
    j = c.job(p)                                      # restarted at the size it had
    assert j.state == JobState.RUNNING and j.gpus == 2 and j.restart_count == 1


def test_a_poll_records_its_time_even_with_no_job(tmp_path):
    """`malleable status` said "last poll: never" while the daemon polled an empty queue:
    the time came from the jobs' last_seen only. A successful poll records its time; a
    failed one does not."""
    c = Cluster(tmp_path)
    c.advance(5)
    c.daemon.poll_cycle()
    with c.sessions() as s:
        first = store.get_setting(s, store.LAST_POLL_KEY)
    assert first == c.engine.datetime_at().isoformat()
    c.advance(30)
    c.daemon.poll_cycle()
    with c.sessions() as s:
        assert store.get_setting(s, store.LAST_POLL_KEY) == c.engine.datetime_at().isoformat()


def test_waiting_jobs_beyond_the_queue_depth_stay_held_and_move_up(tmp_path):
    c = Cluster(tmp_path, nodes=1, queue_depth=1)
    rigid = c.submit(1, 4, RigidJob(100))             # the node, for 100 s
    p, q, r = c.malleable(), c.malleable(), c.malleable()   # waiting, in this order
    c.advance(1)
    report = c.daemon.decide_cycle()
    # P is the queue's head: the policy allocates it (nothing free: held). Q and R are
    # beyond the depth: held, not allocated, no target or estimate recorded.
    assert [(x.job_id, x.kind.value) for x in report.planned] == [
        (p, "hold"), (q, "hold"), (r, "hold")]
    assert [x.reason for x in report.planned[1:]] == ["waiting beyond the queue depth"] * 2
    assert report.planned[0].reason != "waiting beyond the queue depth"
    assert report.managed == 1
    assert all(c.job(j).held for j in (p, q, r))
    with c.sessions() as s:
        recorded = s.scalars(select(Job.slurm_job_id).join(Target, Target.job_id == Job.id)
                             .where(Target.decision_id == report.decision_id)).all()
    assert recorded == [p]
    # Held already: no new action for them while they wait.
    c.advance(20)
    assert c.daemon.decide_cycle().planned == []
    # The rigid job ends: P is admitted and Q moves up to the head of the waiting queue.
    c.advance(100)
    c.daemon.decide_cycle()
    c.advance(20)
    c.daemon.decide_cycle()
    assert c.job(rigid).state == JobState.COMPLETED
    assert c.job(p).state == JobState.RUNNING
    # Q, the head of the waiting queue now, is given GPUs (equi: 2 + 2, P shrinks by a
    # requeue). A job the last decision gave GPUs counts outside the depth while it
    # starts (`split_queue`), so R, the next pending job, is in the problem too: given
    # none, it stays held.
    for _ in range(2):
        c.advance(20)
        report = c.daemon.decide_cycle()
    with c.sessions() as s:
        recorded = {sid: k for sid, k in s.execute(select(Job.slurm_job_id, Target.gpus).join(
            Target, Target.job_id == Job.id).where(Target.decision_id == report.decision_id))}
        assert s.scalar(select(Decision.id).order_by(Decision.id.desc()).limit(1)) \
            == report.decision_id
    assert recorded == {p: 2, q: 2, r: 0}
    assert [(x.job_id, x.kind.value, x.to_gpus) for x in report.planned] == [
        (p, "requeue", 2), (q, "admit", 2)]
    assert c.job(r).held


def test_a_requeued_job_beyond_the_queue_depth_stays_held_and_moves_up(tmp_path):
    # The depth counts every pending job, started before or not: two jobs that ran,
    # requeued and pending again, with a depth of 1 put only the older one in the
    # policy's problem.
    c = Cluster(tmp_path, nodes=1, queue_depth=1)
    p, q = c.malleable(), c.malleable()               # both run: 2 + 2 of 4 GPUs
    c.advance(60)
    c.daemon.poll_cycle()
    for j in (p, q):                                  # as `scontrol requeue` does
        c.slurm.requeue_hold(j)
        c.slurm.release(j)
    c.advance(20)
    report = c.daemon.decide_cycle()
    assert c.job(q).restart_count == 1 and c.job(q).state == JobState.PENDING
    assert report.managed == 1
    assert ("hold", "waiting beyond the queue depth") in {
        (x.kind.value, x.reason) for x in report.planned if x.job_id == q}
    with c.sessions() as s:
        recorded = s.scalars(select(Job.slurm_job_id).join(Target, Target.job_id == Job.id)
                             .where(Target.decision_id == report.decision_id)).all()
    assert recorded == [p]
    assert c.job(q).held
    # The policy gives P GPUs, and it runs once its requeue's begin time (121 s)
    # passes; Q, the only pending job left, moves up into the problem.
    for _ in range(8):
        c.advance(20)
        report = c.daemon.decide_cycle()
    assert c.job(p).state == JobState.RUNNING
    with c.sessions() as s:
        recorded = set(s.scalars(select(Job.slurm_job_id).join(Target, Target.job_id == Job.id)
                                 .where(Target.decision_id == report.decision_id)))
    assert recorded == {p, q}


def test_split_queue_keeps_every_running_job_and_the_first_pending_ones():
    from types import SimpleNamespace

    from malleable.daemon.inputs import split_queue
    from malleable.slurm.records import SlurmJob

    def row(sid, restarts=0, attained=0.0):
        return SimpleNamespace(id=100 + int(sid), slurm_job_id=sid, restart_count=restarts,
                               attained_gpu_s=attained)

    jobs = [row("1"), row("2", attained=60.0), row("3"), row("4", restarts=1), row("5"),
            row("6"), row("7", restarts=2, attained=600.0)]
    states = {"1": JobState.PENDING, "2": JobState.PENDING, "3": JobState.RUNNING,
              "4": JobState.PENDING, "5": JobState.PENDING, "6": JobState.PENDING,
              "7": JobState.RUNNING}
    observed = {k: SlurmJob(job_id=k, job_id_num=int(k), state=v) for k, v in states.items()}
    kept, queued = split_queue(jobs, observed, 3)
    # Pending: 1, 2, 4, 5, 6, started before or not (2 has attained service, 4 was
    # requeued); the first three stay, with both running jobs wherever they arrived.
    assert [j.slurm_job_id for j in kept] == ["1", "2", "3", "4", "7"]
    assert [j.slurm_job_id for j in queued] == ["5", "6"]
    kept, queued = split_queue(jobs, observed, 1)
    assert [j.slurm_job_id for j in kept] == ["1", "3", "7"]
    assert [j.slurm_job_id for j in queued] == ["2", "4", "5", "6"]
    # A pending job the last decision gave GPUs (4, 6: being started) stays, outside
    # the count, wherever it is in the queue.
    kept, queued = split_queue(jobs, observed, 1, starting={104, 106})
    assert [j.slurm_job_id for j in kept] == ["1", "3", "4", "6", "7"]
    assert [j.slurm_job_id for j in queued] == ["2", "5"]
    assert split_queue(jobs, observed, 0) == (jobs, [])
    assert split_queue(jobs, observed, 5) == (jobs, [])


def test_the_policy_an_operator_sets_is_read_with_the_pause_by_the_poll(tmp_path):
    c = Cluster(tmp_path)
    c.malleable()
    c.advance(1)
    with c.sessions() as s, s.begin():
        store.set_policy(s, "fifo", {}, c.engine.datetime_at())
    r = c.daemon.decide_cycle()
    with c.sessions() as s:
        assert s.get(Decision, r.decision_id).policy == "fifo"
    with c.sessions() as s, s.begin():
        assert store.clear_policy(s)
        store.set_paused(s, True, c.engine.datetime_at())
    c.advance(20)
    r = c.daemon.decide_cycle()
    assert r.paused
    with c.sessions() as s:
        assert s.get(Decision, r.decision_id).policy == "equi"   # the configuration's


def test_a_settings_row_that_is_not_json_does_not_stop_the_poll(tmp_path, caplog):
    """A hand-edited store (`UPDATE settings SET value = '{bad'`): the poll's read of the
    operator's settings raised the JSON decoder's error, so every poll (and the ingest and
    decision after it) failed until the row was repaired. An unreadable pause now reads
    as paused, an unreadable policy as the configuration's, each with an error in the log."""
    from sqlalchemy import text

    c = Cluster(tmp_path)
    c.malleable()
    c.advance(1)
    with c.sessions() as s, s.begin():
        store.set_policy(s, "fifo", {}, c.engine.datetime_at())
        store.set_paused(s, False, c.engine.datetime_at())
        s.execute(text("UPDATE settings SET value = '{bad' WHERE key IN (:p, :q)"),
                  {"p": store.PAUSED_KEY, "q": store.POLICY_PARAMS_KEY})
    caplog.set_level(logging.ERROR, logger="malleable.db.store")
    r = c.daemon.decide_cycle()
    assert r.paused and r.decision_id is not None
    with c.sessions() as s:
        assert s.get(Decision, r.decision_id).policy == "equi"   # the configuration's
    said = [rec.getMessage() for rec in caplog.records]
    assert f"settings row '{store.PAUSED_KEY}' holds '{{bad', which is not valid JSON: taken " \
           "as paused (no action is started); `malleable resume` (or `pause`) rewrites it" in said
    assert any(m.startswith(f"settings row '{store.POLICY_PARAMS_KEY}' holds '{{bad'") and
               m.endswith("using the configuration's policy; `malleable policy reset` clears it")
               for m in said), said
    # Params that are JSON but not an object: the configuration's policy too.
    with c.sessions() as s, s.begin():
        s.execute(text("UPDATE settings SET value = '[1, 2]' WHERE key = :q"),
                  {"q": store.POLICY_PARAMS_KEY})
        s.execute(text("UPDATE settings SET value = 'false' WHERE key = :p"),
                  {"p": store.PAUSED_KEY})
    c.advance(20)
    r = c.daemon.decide_cycle()
    assert not r.paused
    with c.sessions() as s:
        assert s.get(Decision, r.decision_id).policy == "equi"


def test_lines_of_an_ingest_that_did_not_commit_are_read_again(tmp_path):
    """A write that fails within the poll's transaction (a full disk; here a trigger
    raising in the real SQLite) rolled the samples back but left the cursors past them:
    the re-read lines were rejected as decreasing_step and lost for good (a tester
    filled the disk under a running daemon)."""
    import sqlalchemy.exc
    from sqlalchemy import func, text

    from malleable.db.models import ProgressSample

    c = Cluster(tmp_path)
    p = c.malleable()
    c.advance(60)
    c.daemon.poll_cycle()

    def stored() -> int:
        with c.sessions() as s:
            return s.scalar(select(func.count()).select_from(ProgressSample)
                            .where(ProgressSample.job_id == c.db_id(p)))

    def written() -> int:
        lines = (c.spool / f"{p}.jsonl").read_text().splitlines()
        return sum(json.loads(x)["event"] == "progress" for x in lines)

    assert 0 < stored() == written()
    with c.sessions() as s, s.begin():
        s.execute(text("CREATE TRIGGER full BEFORE INSERT ON progress_samples "
                       "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"))
    c.advance(120)   # several lines: all but the last would have been refused
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="disk is full"):
        c.daemon.poll_cycle()
    before = stored()
    assert before < written()
    with c.sessions() as s, s.begin():
        s.execute(text("DROP TRIGGER full"))
    c.advance(30)
    r = c.daemon.poll_cycle()
    assert not r.ingest.rejected
    assert before < stored() == written()


def test_a_spool_that_cannot_be_opened_is_logged_once(tmp_path, caplog):
    """The spool directory removed under the daemon: no progress was read and nothing
    said why (a tester on the harness). One error when it goes, one line when it is back."""
    c = Cluster(tmp_path)
    c.daemon.poll_cycle()
    caplog.set_level(logging.INFO, logger="malleable.daemon.cycle")
    c.spool.rename(tmp_path / "gone")
    for _ in range(3):
        c.advance(10)
        c.daemon.poll_cycle()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "spool" in r.getMessage()]
    assert said == [("ERROR", f"spool {c.spool}: No such file or directory: no progress line "
                              "is read until it can be opened (the jobs write there; the "
                              "daemon creates it at start)")]
    assert not c.daemon._read_all   # (every file is read once the spool is back)
    (tmp_path / "gone").rename(c.spool)
    c.advance(10)
    c.daemon.poll_cycle()
    assert [r.getMessage() for r in caplog.records if "spool" in r.getMessage()][1:] == [
        f"spool {c.spool} readable again"]
    assert c.daemon._read_all


def test_pause_resume_and_policy_changes_are_in_the_daemon_log(tmp_path, caplog):
    """The admin commands write only the store; the daemon logs when it takes them up."""
    c = Cluster(tmp_path)
    c.malleable()
    c.advance(1)

    def cycle() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="malleable.daemon.cycle"):
            c.daemon.poll_cycle()
        c.advance(10)
        return [r.getMessage() for r in caplog.records
                if "operator" in r.getMessage() and r.name == "malleable.daemon.cycle"]

    assert cycle() == []                                # nothing set: nothing said
    with c.sessions() as s, s.begin():
        store.set_paused(s, True, c.engine.datetime_at())
        store.set_policy(s, "fifo", {"x": 1}, c.engine.datetime_at())
    said = cycle()
    assert any(m.startswith("paused by an operator: observing and planning") for m in said)
    assert 'policy fifo {"x": 1} set by an operator: it decides from the next decision' in said
    assert cycle() == []                                # said once, not every poll
    with c.sessions() as s, s.begin():
        store.set_paused(s, False, c.engine.datetime_at())
        store.clear_policy(s)
    said = cycle()
    assert "resumed by an operator: acting on decisions again" in said
    assert any(m.startswith("the operator's policy choice was reset: the configuration's "
                            "policy equi") for m in said)
    # A new process finds a pause (and a policy) in force: it says so at its first poll.
    with c.sessions() as s, s.begin():
        store.set_paused(s, True, c.engine.datetime_at())
        store.set_policy(s, "las", {}, c.engine.datetime_at())
    c.daemon = Daemon(slurm=c.slurm, sessions=c.sessions, clock=c.engine.datetime_at,
                      spool_dir=str(c.spool), config=c.daemon.config)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="malleable.daemon.cycle"):
        assert c.daemon.read_operator_settings(start=True)   # as the service at start
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("starting paused by an operator") for m in said)
    assert "policy las {} set by an operator (in force at start): it decides from the next " \
           "decision" in said
    assert cycle() == []                                # the poll after: nothing new
    # A process that is not the service (e.g. `malleable plan`'s dry-run cycle) reads
    # them silently.
    c.daemon = Daemon(slurm=c.slurm, sessions=c.sessions, clock=c.engine.datetime_at,
                      spool_dir=str(c.spool), config=c.daemon.config)
    assert cycle() == [] and c.daemon.paused



def test_the_daemon_log_names_who_paused_and_set_the_policy(tmp_path, caplog):
    """The commands record who ran them (`store.record_operator_change`); the daemon's
    log line for the change names them, and a record of another command is not used."""
    c = Cluster(tmp_path)
    c.malleable()
    c.advance(1)
    c.daemon.poll_cycle()
    now = c.engine.datetime_at()
    with c.sessions() as s, s.begin():
        store.set_paused(s, True, now)
        store.record_operator_change(s, store.PAUSED_BY_KEY, "pause", "alice (uid 1000)",
                                     "login1", now)
        store.set_policy(s, "fifo", {}, now)
        store.record_operator_change(s, store.POLICY_BY_KEY, "policy reset",
                                     "carol (uid 1002)", "login2", now)   # not this change
    with caplog.at_level(logging.INFO, logger="malleable.daemon.cycle"):
        c.daemon.poll_cycle()
    said = [r.getMessage() for r in caplog.records]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert any(m.startswith(f"paused by an operator (malleable pause by alice (uid 1000) on "
                            f"login1 at {stamp}): observing") for m in said), said
    assert "policy fifo {} set by an operator: it decides from the next decision" in said


def test_a_pause_during_a_slurm_outage_is_acknowledged_at_once(tmp_path, caplog):
    """The guide recommends `pause` for Slurm maintenance: the failed polls of the
    outage still read the store, and the log says the pause was taken up."""
    c = Cluster(tmp_path, slurm_cls=FlakySlurm)
    c.malleable()
    c.advance(1)
    c.daemon.poll_cycle()
    c.slurm.down = frozenset({"jobs"})
    with c.sessions() as s, s.begin():
        store.set_paused(s, True, c.engine.datetime_at())
    with caplog.at_level(logging.INFO, logger="malleable.daemon.cycle"):
        r = c.daemon.decide_cycle()
    assert r.slurm_unavailable and r.paused
    said = [x.getMessage() for x in caplog.records]
    assert any(m.startswith("poll failed, Slurm unavailable") for m in said)
    assert any(m.startswith("paused by an operator: observing and planning") for m in said)
    # A poll a stop cut short (Ctrl-C reaches squeue too) is not logged as an outage.
    caplog.clear()
    c.daemon.stopping = lambda: True
    with caplog.at_level(logging.INFO, logger="malleable.daemon.cycle"):
        c.daemon.poll_cycle()
    assert [(x.levelno, x.getMessage().split(":")[0]) for x in caplog.records
            if x.getMessage().startswith(("poll failed", "poll cut"))] == \
        [(logging.INFO, "poll cut short by the stop")]


def test_the_inputs_cache_gives_what_reading_the_events_gives(tmp_path):
    from malleable.daemon.inputs import build_inputs

    c = Cluster(tmp_path)
    c.submit(1, 4, RigidJob(1e6))                     # node1
    p = c.malleable()                                 # node2, 2 of 4 GPUs
    c.advance(60)
    c.daemon.decide_cycle()                           # equi: P grows to 4 (requeue)
    for _ in range(8):
        c.advance(10)
        c.daemon.poll_cycle()
    assert c.job(p).restart_count == 1 and c.job(p).gpus == 4
    c.advance(20)
    c.daemon.decide_cycle()                           # the cache now holds P's values

    def inputs(cache):
        with c.sessions() as s:
            return build_inputs(s, c.daemon.observed, c.daemon.nodes, c.daemon.book,
                                c.engine.datetime_at(), c.daemon.config, cache=cache).jobset

    cached, read = inputs(c.daemon.inputs_cache), inputs(None)
    assert c.daemon.inputs_cache.last_change[c.db_id(p)] is not None
    np.testing.assert_array_equal(cached.since_change, read.since_change)
    np.testing.assert_array_equal(cached.requested, read.requested)
    assert read.requested.tolist() == [2] and np.isfinite(read.since_change).all()


def test_the_inputs_from_the_kept_job_rows_are_those_read_from_the_store(tmp_path):
    """`build_inputs` with the rows the daemon keeps (`JobRows.in_states`) gives the jobs,
    what is left out and why, the queue beyond the depth and the JobSet that reading
    the ``jobs`` table gives: running, pending, held, beyond the depth, rigid, and a
    job whose spec is invalid."""
    from malleable.daemon.inputs import MANAGED_STATES, build_inputs

    c = Cluster(tmp_path, queue_depth=2)
    c.submit(1, 4, RigidJob(1e6))                     # node1
    c.submit(1, 2, RigidJob(1e6), "malleable:gpus=banana")   # invalid spec: rigid
    ids = [c.malleable() for _ in range(5)]
    for _ in range(6):
        c.advance(20)
        c.daemon.decide_cycle()
    kept = c.daemon.job_rows.in_states(MANAGED_STATES)
    assert kept is not None and len(kept) == 7        # (5 malleable, 2 rigid)
    assert {c.job(j).state for j in ids} == {JobState.RUNNING, JobState.PENDING}

    def inputs(known):
        with c.sessions() as s:
            return build_inputs(s, c.daemon.observed, c.daemon.nodes, c.daemon.book,
                                c.engine.datetime_at(), c.daemon.config, known=known)

    a, b = inputs(kept), inputs(None)
    assert [j.id for j in a.jobs] == [j.id for j in b.jobs] and len(a.jobs) >= 2
    assert [j.id for j in a.queued] == [j.id for j in b.queued] and len(a.queued) >= 1
    assert list(a.excluded.items()) == list(b.excluded.items())   # (in one order)
    for name in ("ids", "min_gpus", "max_gpus", "step", "current", "attained", "age",
                 "restart_cost", "since_change", "requested", "restarts"):
        np.testing.assert_array_equal(getattr(a.jobset, name), getattr(b.jobset, name))
    assert a.digest == b.digest


class _NoGradients:
    """A model profile whose job logs no gradient statistics (grad_sqr, grad_var)."""

    def __init__(self, profile) -> None:
        self._profile = profile

    def __getattr__(self, name):
        return getattr(self._profile, name)

    def grad_stats(self, progress, batch):
        return None, None


@pytest.mark.parametrize("gradients", [True, False])
def test_the_plan_advises_a_batch_size_only_from_gradient_statistics(tmp_path, gradients):
    """The plan file written for a requeue carries the estimators' batch size only when
    the job logs gradient statistics; without them that batch is the spec's m0, no
    advice about the batch the job runs at, so the plan says null (keep yours)."""
    c = Cluster(tmp_path)
    c.submit(1, 4, RigidJob(1e6))                     # node1
    profile = load_profile("cifar10")
    p = c.submit(1, 2, ProfileJob(profile if gradients else _NoGradients(profile),
                                  spool_dir=c.spool, batch=512), SPEC)
    c.advance(60)
    r = c.daemon.decide_cycle()                       # equi: P grows to 4 (requeue)
    assert [(x.job_id, x.kind.value, x.to_gpus) for x in r.planned] == [(p, "requeue", 4)]
    plan = json.loads((c.spool / f"{p}.plan.json").read_text())
    assert plan["gpus"] == 4
    if gradients:
        assert isinstance(plan["batch"], int) and plan["batch"] >= 512
    else:
        assert plan["batch"] is None


def test_an_invalid_spec_is_logged_once_when_first_seen(tmp_path, caplog):
    """The daemon said nothing about a job whose spec is invalid (it is left rigid): only
    `job show` told (a helper). It warns once, when it first parses the spec."""
    c = Cluster(tmp_path)
    j = c.submit(1, 2, RigidJob(1e6), "malleable:gpus=1-8 step=4")
    with caplog.at_level(logging.WARNING, logger="malleable"):
        c.daemon.poll_cycle()
        c.advance(30)
        c.daemon.poll_cycle()
    said = [r for r in caplog.records if "invalid malleable spec" in r.getMessage()]
    assert len(said) == 1, said
    assert "left to Slurm as a rigid job: malleable spec: step=4: after a blank" in \
        said[0].getMessage()
    assert said[0].job == j


def test_a_decide_cycle_stores_a_job_estimate_only_when_it_changed(tmp_path):
    """A waiting job's estimate stays the same from cycle to cycle: it is stored once
    (`StoredEstimates`), its newest row has this cycle's values, and a cycle whose
    transaction did not commit (a trigger raising in the real SQLite) makes the next
    one store every job's estimate again."""
    import sqlalchemy.exc
    from sqlalchemy import func, text

    from malleable.db.models import Estimate

    c = Cluster(tmp_path, nodes=1)
    a, b = c.malleable(), c.malleable()   # one 4-GPU node: b waits
    waiting = c.malleable(1, 4)
    c.advance(1)

    def rows(job_id: str) -> list[Estimate]:
        with c.sessions() as s:
            return list(s.scalars(select(Estimate).where(Estimate.job_id == c.db_id(job_id))
                                  .order_by(Estimate.id)))

    def count() -> int:
        with c.sessions() as s:
            return s.scalar(select(func.count()).select_from(Estimate))

    for _ in range(4):
        c.advance(20)
        c.daemon.decide_cycle()
    assert c.job(waiting).state == JobState.PENDING
    stored = rows(waiting)
    assert len(stored) == 1 and stored[0].params["progress"] == 0.0
    # Running jobs report progress: theirs change and are stored again.
    assert len(rows(a)) > 1 and len(rows(b)) > 1
    # The newest row is what this cycle computed, for every job.
    inputs, _ = c.daemon.decide(c.engine.datetime_at(), CycleReport("decide", 0,
                                                                     c.engine.datetime_at()))
    for i, j in enumerate(inputs.jobs):
        assert rows(j.slurm_job_id)[-1].params["progress"] == \
            pytest.approx(float(inputs.estimates.progress[i]))
    # A cycle that does not commit: nothing it wrote is stored, and the next cycle
    # writes all three jobs' estimates.
    with c.sessions() as s, s.begin():
        s.execute(text("CREATE TRIGGER full BEFORE INSERT ON decisions "
                       "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"))
    c.advance(20)
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="disk is full"):
        c.daemon.decide_cycle()
    with c.sessions() as s, s.begin():
        s.execute(text("DROP TRIGGER full"))
    before = count()
    c.advance(20)
    c.daemon.decide_cycle()
    assert count() == before + 3
    assert len(rows(waiting)) == 2
