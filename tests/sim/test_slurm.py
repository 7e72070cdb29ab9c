"""SimSlurm: the simulated controller against the SlurmClient protocol and Slurm 22.05's behaviour.

The expected messages and behaviours were observed on the project's Slurm 22.05.8
harness (see malleable/sim/slurm.py); these tests pin the simulator to them.
"""

from __future__ import annotations

import pytest

from malleable.sim.engine import Engine
from malleable.sim.slurm import IdleProgram, Run, SimSlurm
from malleable.slurm.client import InvalidJobId, SlurmClient, SlurmRejected
from malleable.slurm.hostlist import compress_hostlist as hostlist
from malleable.slurm.records import JobState, SignalTarget, SubmitRequest


class Recorder:
    """A job program that records what Slurm did to it and runs until told to exit."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.run: Run | None = None

    def on_start(self, run: Run) -> None:
        self.run = run
        self.events.append(("start", run.engine.now, run.placement, run.restart_count))

    def on_signal(self, signal: str, target: SignalTarget) -> None:
        self.events.append(("signal", signal, target))

    def on_shrink(self, placement: tuple[int, ...]) -> None:
        self.events.append(("shrink", placement))

    def on_kill(self, reason: str) -> None:
        self.events.append(("kill", reason))


def req(nodes: int = 1, gpn: int = 4, **kw) -> SubmitRequest:
    return SubmitRequest(script="train.sbatch", nodes=nodes, gpus_per_node=gpn, **kw)


@pytest.fixture
def sim():
    eng = Engine()
    return eng, SimSlurm(eng, nodes=4, gpus_per_node=4)


def test_it_is_a_slurm_client_and_reports_cluster_and_nodes(sim):
    eng, s = sim
    assert isinstance(s, SlurmClient)
    info = s.cluster()
    assert (info.version, info.version_tuple, info.gpus_per_node, info.nodes) == \
        ("22.05.8", (22, 5, 8), 4, 4)
    assert info.partitions == ("gpu",) and info.default_partition == "gpu"
    s.submit_sim(req(1, 2), Recorder())
    eng.run()
    nodes = s.nodes()
    assert [n.name for n in nodes] == ["node1", "node2", "node3", "node4"]
    assert [(n.state, n.gpus_allocated) for n in nodes] == \
        [("mixed", 2), ("idle", 0), ("idle", 0), ("idle", 0)]
    assert all(n.usable and n.gpus == 4 for n in nodes)


def test_a_submitted_job_starts_on_first_fit_nodes_and_completes(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(2, 4, name="big"), prog)
    assert s.job(jid).state == JobState.PENDING and s.job(jid).reason == "None"
    eng.run()
    job = s.job(jid)
    assert job.state == JobState.RUNNING and job.nodes == "node[1-2]"
    assert (job.node_count, job.gpus, job.gpus_per_node, job.name) == (2, 8, 4, "big")
    assert prog.events == [("start", 0.0, (4, 4), 0)]
    assert prog.run.node_names == ("node1", "node2")
    eng.schedule(100.0, prog.run.exit)
    eng.run()
    job = s.job(jid)
    assert job.state == JobState.COMPLETED
    assert job.end_time == eng.datetime_at(100.0)
    acct = {a.job_id: a for a in s.accounting()}[jid]
    assert (acct.started, acct.ended, acct.gpu_seconds, acct.max_gpus) == (0.0, 100.0, 800.0, 8)
    prog.run.exit()   # a second exit of an ended run is ignored
    assert s.used_gpus == 0


def test_fifo_blocks_without_backfill_and_backfill_starts_a_smaller_job():
    for backfill, small_runs in ((False, False), (True, True)):
        eng = Engine()
        s = SimSlurm(eng, nodes=2, gpus_per_node=4, backfill=backfill)
        s.submit_sim(req(1, 4), Recorder())                 # takes node1
        big = s.submit_sim(req(2, 4), Recorder())            # needs both nodes: blocked
        small = s.submit_sim(req(1, 2), Recorder())          # fits on node2
        eng.run()
        assert s.job(big).state == JobState.PENDING and s.job(big).reason == "Resources"
        assert (s.job(small).state == JobState.RUNNING) is small_runs
        if not backfill:
            assert s.job(small).reason == "Priority"


def test_backfill_interval_starts_a_smaller_job_at_the_next_backfill_cycle():
    # Slurm's main scheduler stops at the first blocked job; sched/backfill starts the
    # smaller one at its next cycle (bf_interval, here 30 s), not at once.
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4, backfill_interval_s=30.0)
    s.submit_sim(req(1, 4), Recorder())                 # takes node1
    eng.run(until=5.0)
    big = s.submit_sim(req(2, 4), Recorder())            # blocked
    small = s.submit_sim(req(1, 2), Recorder())          # fits on node2
    eng.run(until=29.0)
    assert s.job(big).reason == "Resources" and s.job(small).state == JobState.PENDING
    eng.run(until=30.0)
    assert s.job(small).state == JobState.RUNNING and s.job(big).state == JobState.PENDING
    assert s.job(small).start_time == eng.datetime_at(30.0)
    with pytest.raises(ValueError, match="backfill_interval_s"):
        SimSlurm(Engine(), nodes=1, gpus_per_node=1, backfill_interval_s=-1.0)


def test_requeue_latency_delays_the_restart_even_after_start_now():
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4, requeue_latency_s=4.0)
    jid = s.submit_sim(req(1, 4), Recorder())
    eng.run(until=10.0)
    s.requeue_hold(jid)
    s.start_now(jid)
    s.release(jid)
    eng.run(until=13.9)
    assert s.job(jid).state == JobState.PENDING
    eng.run(until=14.0)
    assert s.job(jid).state == JobState.RUNNING and s.job(jid).restart_count == 1


def test_best_fit_puts_a_one_node_job_on_the_fullest_node_that_fits():
    eng = Engine()
    s = SimSlurm(eng, nodes=3, gpus_per_node=4, placement="best_fit")
    s.submit_sim(req(1, 1), Recorder())     # node1: 3 free
    s.submit_sim(req(1, 3), Recorder())     # best fit: node1 (3 free) rather than node2 (4)
    eng.run()
    assert [n.gpus_allocated for n in s.nodes()] == [4, 0, 0]


def test_requeue_hold_then_release_waits_for_begin_time_and_start_now_clears_it(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(2, 4), prog)
    eng.run(until=50.0)
    s.requeue_hold(jid)
    job = s.job(jid)
    assert (job.state, job.held, job.reason, job.restart_count) == \
        (JobState.PENDING, True, "job_requeued_in_held_state", 1)
    assert job.submit_time == eng.datetime_at(50.0)          # Slurm resets it
    assert job.eligible_time == eng.datetime_at(50.0 + 121.0)
    assert prog.events[-1] == ("kill", "requeued")
    assert s.used_gpus == 0
    s.resize_pending(jid, 1, 2)
    s.release(jid)
    eng.run(until=60.0)
    job = s.job(jid)
    assert (job.state, job.held, job.reason) == (JobState.PENDING, False, "BeginTime")
    s.start_now(jid)
    eng.run(until=60.0)
    job = s.job(jid)
    assert job.state == JobState.RUNNING and (job.node_count, job.gpus) == (1, 2)
    assert prog.events[-1] == ("start", 60.0, (2,), 1)
    acct = {a.job_id: a for a in s.accounting()}[jid]
    assert acct.submitted == 0.0 and acct.restarts == 1
    assert acct.gpu_seconds == pytest.approx(8 * 50.0)


def test_a_requeued_job_left_alone_starts_itself_after_the_begin_time(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(1, 4), prog)
    eng.run(until=10.0)
    s.requeue_hold(jid)
    s.release(jid)
    eng.run(until=130.0)
    assert s.job(jid).state == JobState.PENDING
    eng.run(until=132.0)
    assert s.job(jid).state == JobState.RUNNING
    assert prog.events[-1] == ("start", 131.0, (4,), 1)


def test_requeue_is_refused_for_pending_and_non_requeueable_jobs(sim):
    eng, s = sim
    pend = s.submit_sim(req(1, 4), Recorder())
    s.hold(pend)
    with pytest.raises(SlurmRejected) as err:
        s.requeue_hold(pend)
    assert err.value.slurm_message == "Job is pending execution"
    assert err.value.job_id == pend
    rigid = s.submit_sim(req(1, 1, requeue=False), Recorder())
    eng.run()
    with pytest.raises(SlurmRejected) as err:
        s.requeue_hold(rigid)
    assert err.value.slurm_message == "Requested operation is presently disabled"
    assert s.job(rigid).state == JobState.RUNNING


def test_resize_pending_rules_follow_slurm(sim):
    eng, s = sim
    running = s.submit_sim(req(1, 4), Recorder())
    eng.run()
    with pytest.raises(SlurmRejected) as err:
        s.resize_pending(running, 1, 2)
    assert err.value.slurm_message == "Job is no longer pending execution"
    pend = s.submit_sim(req(1, 1), Recorder())
    s.hold(pend)
    with pytest.raises(SlurmRejected) as err:
        s.resize_pending(pend, 0, 4)
    assert err.value.slurm_message == "Node count specification invalid"
    with pytest.raises(SlurmRejected) as err:
        s.resize_pending(pend, 1, 5)
    assert err.value.slurm_message == "Requested node configuration is not available"
    s.resize_pending(pend, 9, 4)           # accepted, as Slurm does, but it can never start
    s.release(pend)
    eng.run()
    job = s.job(pend)
    assert (job.state, job.reason, job.node_count, job.gpus) == \
        (JobState.PENDING, "PartitionNodeLimit", 9, 36)
    s.resize_pending(pend, 3, 4)
    eng.run()
    assert s.job(pend).state == JobState.RUNNING


def test_submit_rejects_what_sbatch_rejects(sim):
    _, s = sim
    with pytest.raises(SlurmRejected, match="Requested node configuration is not available"):
        s.submit_sim(req(1, 5), Recorder())
    with pytest.raises(SlurmRejected, match="Node count specification invalid"):
        s.submit_sim(req(0, 1), Recorder())
    jid = s.submit_sim(req(5, 1), Recorder())    # more nodes than the partition: pends
    s.engine.run()
    assert s.job(jid).reason == "PartitionConfig"


def test_shrink_keeps_first_nodes_refuses_growth_and_a_second_shrink_on_22_05(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(3, 4), prog)
    eng.run(until=10.0)
    with pytest.raises(SlurmRejected) as err:
        s.shrink_running(jid, 4)
    assert err.value.slurm_message == "Requested operation not supported on this system"
    with pytest.raises(SlurmRejected) as err:
        s.shrink_running(jid, 0)
    assert err.value.slurm_message == "Node count specification invalid"
    s.shrink_running(jid, 2)
    job = s.job(jid)
    assert (job.nodes, job.node_count, job.gpus) == ("node[1-2]", 2, 8)
    assert prog.events[-1] == ("shrink", (4, 4))
    assert prog.run.node_names == ("node1", "node2")
    assert s.used_gpus == 8
    with pytest.raises(SlurmRejected) as err:
        s.shrink_running(jid, 1)
    assert "DB index is being set" in err.value.slurm_message
    # As on 22.05, the request a requeued job restarts with is not changed by a shrink.
    s.requeue_hold(jid)
    assert s.job(jid).node_count == 2          # what Slurm reports while pending ...
    s.release(jid)
    s.start_now(jid)
    eng.run(until=20.0)
    assert s.job(jid).node_count == 3          # ... and what it starts with
    assert prog.events[-1] == ("start", 10.0, (4, 4, 4), 1)


def test_second_shrink_is_allowed_when_configured_like_23_11():
    eng = Engine()
    s = SimSlurm(eng, nodes=4, gpus_per_node=4, second_shrink_fails=False)
    jid = s.submit_sim(req(3, 4), Recorder())
    eng.run()
    s.shrink_running(jid, 2)
    s.shrink_running(jid, 1)
    assert s.job(jid).nodes == "node1"


def test_shrinking_a_pending_job_is_refused(sim):
    _, s = sim
    jid = s.submit_sim(req(2, 4), Recorder())
    with pytest.raises(SlurmRejected, match="Job is pending execution"):
        s.shrink_running(jid, 1)


def test_hold_keeps_a_pending_job_back_and_does_not_stop_a_running_one(sim):
    eng, s = sim
    running = s.submit_sim(req(1, 4), Recorder())
    eng.run()
    held = s.submit_sim(req(1, 4), Recorder())
    s.hold(held)
    s.hold(running)
    eng.run()
    assert (s.job(held).state, s.job(held).held, s.job(held).reason) == \
        (JobState.PENDING, True, "JobHeldAdmin")
    r = s.job(running)
    assert (r.state, r.held, r.reason) == (JobState.RUNNING, True, "JobHeldAdmin")
    s.release(held)
    eng.run()
    assert s.job(held).state == JobState.RUNNING


def test_signals_reach_a_running_program_and_are_refused_for_pending_jobs(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(1, 4), prog)
    pend = s.submit_sim(req(4, 4), Recorder())
    eng.run()
    s.signal(jid, "SIGUSR1", SignalTarget.BATCH)
    s.signal(jid, "usr2", SignalTarget.FULL)
    assert prog.events[-2:] == [("signal", "USR1", SignalTarget.BATCH),
                                ("signal", "USR2", SignalTarget.FULL)]
    with pytest.raises(SlurmRejected) as err:
        s.signal(pend, "USR1")
    assert err.value.slurm_message == "Job can not be altered now, try again later"
    with pytest.raises(ValueError, match="signal name"):
        s.signal(jid, "")


def test_cancel_kills_and_finished_jobs_are_forgotten_after_min_job_age(sim):
    eng, s = sim
    prog = Recorder()
    jid = s.submit_sim(req(1, 4), prog)
    eng.run(until=5.0)
    s.cancel(jid)
    assert prog.events[-1] == ("kill", "cancelled")
    assert s.job(jid).state == JobState.CANCELLED
    s.cancel(jid)   # no-op, as scancel of a finished job
    with pytest.raises(SlurmRejected, match="Job has already finished"):
        s.hold(jid)
    eng.run(until=5.0 + 299.0)
    assert s.job(jid) is not None
    eng.run(until=5.0 + 300.0)
    assert s.job(jid) is None and all(j.job_id != jid for j in s.jobs())
    with pytest.raises(SlurmRejected) as err:
        s.release(jid)
    assert err.value.slurm_message == "Invalid job id specified"
    assert [a.state for a in s.accounting()] == [JobState.CANCELLED]


def test_job_ids_are_validated_before_anything_else(sim):
    _, s = sim
    with pytest.raises(InvalidJobId):
        s.job("abc")
    with pytest.raises(InvalidJobId):
        s.cancel("12;rm")
    with pytest.raises(SlurmRejected, match="Invalid job id specified"):
        s.requeue_hold("99")
    assert s.job("99") is None and s.job("7_1") is None


def test_every_protocol_call_is_one_rpc(sim):
    eng, s = sim
    start = s.rpc_count
    jid = s.submit_sim(req(1, 4), Recorder())
    s.jobs()
    s.job(jid)
    s.nodes()
    s.cluster()
    s.hold(jid)
    s.release(jid)
    eng.run()
    s.signal(jid, "USR1")
    s.requeue_hold(jid)
    s.start_now(jid)
    s.resize_pending(jid, 1, 2)
    s.cancel(jid)
    assert s.rpc_count - start == 12


def test_plain_submit_uses_the_factory_or_an_idle_program():
    eng = Engine()
    made: list[SubmitRequest] = []

    def factory(r: SubmitRequest) -> Recorder:
        made.append(r)
        return Recorder()

    s = SimSlurm(eng, nodes=1, gpus_per_node=4, job_factory=factory)
    jid = s.submit(req(1, 2, comment="malleable:min=1,max=4"))
    eng.run()
    assert made and made[0].comment == "malleable:min=1,max=4"
    assert s.job(jid).comment == "malleable:min=1,max=4"
    s2 = SimSlurm(Engine(), nodes=1, gpus_per_node=4)
    jid2 = s2.submit(req(1, 4))
    s2.engine.run(until=1e6)
    assert s2.job(jid2).state == JobState.RUNNING   # IdleProgram never ends
    assert isinstance(IdleProgram(), IdleProgram)


def test_constructor_and_hostlist_validation():
    with pytest.raises(ValueError, match="nodes must be a positive integer"):
        SimSlurm(Engine(), nodes=0)
    with pytest.raises(ValueError, match="placement must be"):
        SimSlurm(Engine(), placement="random")
    with pytest.raises(ValueError, match="version must look like"):
        SimSlurm(Engine(), version="22.05")
    assert hostlist(["node1", "node2", "node3", "node7", "node9", "node10"]) == \
        "node[1-3,7,9-10]"
    assert hostlist(["node4"]) == "node4" and hostlist([]) == ""


def test_gpu_timeline_and_allocation_log_record_every_change(sim):
    eng, s = sim
    a, b = Recorder(), Recorder()
    ja = s.submit_sim(req(2, 4), a)
    eng.run(until=10.0)
    jb = s.submit_sim(req(1, 2), b)
    eng.run(until=20.0)
    s.shrink_running(ja, 1)
    eng.schedule(30.0, a.run.exit)
    eng.run(until=40.0)
    times, used = s.gpu_timeline()
    assert times.tolist() == [0.0, 10.0, 20.0, 30.0]
    assert used.tolist() == [8, 10, 6, 2]
    assert s.allocation_log == [(0.0, ja, 8), (10.0, jb, 2), (20.0, ja, 4), (30.0, ja, 0)]


def test_queue_order_is_by_submit_time_and_a_requeued_job_goes_to_the_back():
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4, requeue_delay_s=0.0, backfill=False)
    first = Recorder()
    j1 = s.submit_sim(req(1, 4), first)
    eng.run(until=1.0)
    j2 = s.submit_sim(req(1, 2), Recorder())     # shapes differ: order still by submit time
    eng.run(until=2.0)
    j3 = s.submit_sim(req(1, 4), Recorder())
    eng.run(until=3.0)
    assert [s.job(j).reason for j in (j2, j3)] == ["Resources", "Priority"]
    s.requeue_hold(j1)                           # submit time reset to 3.0: behind j2, j3
    s.release(j1)
    eng.run(until=3.0)
    assert s.job(j2).state == JobState.RUNNING
    assert s.job(j3).state == JobState.PENDING   # strict FIFO: 4 GPUs do not fit next to j2
    assert s.job(j1).state == JobState.PENDING and s.job(j1).reason == "Priority"
    s.cancel(j2)
    eng.run(until=4.0)
    assert s.job(j3).state == JobState.RUNNING and s.job(j1).state == JobState.PENDING


def test_many_pending_jobs_start_in_submit_order_without_backfill():
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4, backfill=False)
    progs = [Recorder() for _ in range(40)]
    ids = [s.submit_sim(req(1 + i % 2, 4 if i % 3 else 2), p) for i, p in enumerate(progs)]

    def finish_running() -> None:
        for p in progs:
            if p.run is not None and p.run.alive:
                p.run.exit()
        if s.active_jobs:
            eng.schedule_in(10.0, finish_running)

    eng.schedule(10.0, finish_running)
    eng.run()
    acct = {a.job_id: a for a in s.accounting()}
    starts = [acct[j].started for j in ids]
    assert starts == sorted(starts)              # strict FIFO: never overtaken
    assert starts[-1] > starts[0]
    assert all(a.state == JobState.COMPLETED for a in acct.values()) and s.used_gpus == 0


def test_unchanged_since_tells_whether_a_poll_would_return_the_same_records(sim):
    eng, s = sim
    first = Recorder()
    s.submit_sim(req(4, 4), first)
    waiting = s.submit_sim(req(1, 4), Recorder())     # pends: the cluster is full
    eng.run(until=10.0)
    rpc = s.rpc_count
    seen = s.jobs()
    assert [j.state for j in seen] == [JobState.RUNNING, JobState.PENDING]
    eng.run(until=20.0)
    assert s.unchanged_since(seen)                      # nothing happened
    assert s.rpc_count == rpc + 1                       # only the poll was an RPC
    assert not s.unchanged_since(seen[:1])              # a different job list
    s.hold(waiting)
    assert not s.unchanged_since(seen)                  # a hold changes the record
    seen = s.jobs()
    first.run.exit(JobState.COMPLETED)
    eng.run(until=30.0)
    assert not s.unchanged_since(seen)                  # a job ended
    seen = s.jobs()
    assert s.unchanged_since(seen)
    eng.run(until=30.0 + 301.0)
    assert not s.unchanged_since(seen)                  # forgotten after MinJobAge


def test_ended_jobs_counts_the_accounting_entries_with_an_end_time(sim):
    """`ended_jobs` (O(1), used for the progress bar) agrees with `accounting` through
    completion, cancellation, a requeue of a running job and of a finished one."""
    eng, s = sim

    def ended() -> int:
        return sum(1 for a in s.accounting() if a.ended is not None)

    progs = [Recorder() for _ in range(4)]
    ids = [s.submit_sim(req(1, 4, requeue=True), p) for p in progs]
    eng.run(until=5.0)
    assert s.ended_jobs == ended() == 0
    progs[0].run.exit(JobState.COMPLETED)
    s.cancel(ids[1])
    eng.run(until=10.0)
    assert s.ended_jobs == ended() == 2
    s.requeue_hold(ids[2])     # running -> pending: still active
    s.requeue_hold(ids[0])     # completed -> pending: active again
    assert s.ended_jobs == ended() == 1
    eng.run(until=1000.0)
    progs[3].run.exit(JobState.FAILED)
    eng.run(until=1001.0)
    assert s.ended_jobs == ended() == 2
