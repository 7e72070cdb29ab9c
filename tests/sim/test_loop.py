"""The daemon's decision loop in simulation: real `Daemon`, simulated Slurm, virtual clock.

Every run here is the production cycle (poll, ingest, estimators, policy,
reconciler, actuator) against `SimSlurm`, with an in-memory SQLite state store
and a spool directory the simulated jobs write progress lines to.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from malleable.config import parse_config
from malleable.sim.jobsetup import prepare_jobs, setup_for
from malleable.sim.loop import SimOptions, UnfinishedJob, run_prepared, run_simulation
from malleable.sim.metrics import write_summary
from malleable.sim.traces import TraceJob
from malleable.spec import format_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]

# Three ncf jobs (about a minute each on one GPU) and three cifar10 jobs (the
# artifact's initial batch 128 trains in tens of minutes) on 2 nodes x 4 GPUs.
JOBS = [
    TraceJob("cifar10-0", 0.0, 2, model="cifar10", batch_size=256),
    TraceJob("ncf-1", 20.0, 1, model="ncf", batch_size=32768),
    TraceJob("cifar10-2", 45.0, 4, model="cifar10", batch_size=512),
    TraceJob("ncf-3", 130.0, 1, model="ncf", batch_size=32768),
    TraceJob("cifar10-4", 200.0, 2, model="cifar10", batch_size=256),
    TraceJob("ncf-5", 260.0, 1, model="ncf", batch_size=32768),
]


def config(policy: str):
    return parse_config({"policy": {"name": policy, "min_gain": 0.0, "cooldown_s": 0.0,
                                    "min_run_restarts": 0.0},
                         "daemon": {"max_concurrent_requeues": 8}})


def run(policy: str, seed: int = 0, **kw):
    opts = SimOptions(nodes=2, gpus_per_node=4, seed=seed, restart_cost_s=30.0,
                      setup=setup_for(policy), max_time_s=6 * 3600.0, **kw)
    return run_simulation(JOBS, config(policy), opts)


@pytest.fixture(scope="module")
def pollux_run():
    return run("pollux")


def test_small_workload_finishes_through_the_daemon(pollux_run):
    r = pollux_run
    s = r.summary
    assert r.finished and s["all_finished"] is True
    assert s["jobs"] == s["jobs_finished"] == len(JOBS)
    # The daemon decided every minute until the last job ended.
    assert s["decide_cycles"] == s["decisions"] >= r.sim_s // 60
    assert all(o.end_s is not None and o.end_s > o.arrival_s for o in r.outcomes)
    assert 0 < s["gpu_utilization"] <= 1


def test_a_finished_run_lists_no_unfinished_job(pollux_run):
    assert pollux_run.unfinished == [] and pollux_run.summary["unfinished_jobs"] == []


def test_a_request_rounded_up_past_its_batch_runs_instead_of_being_held():
    # bert on 6 GPUs at batch 6, 4-GPU nodes: seed 1 draws u = 0.33, which rounds 6 up to
    # 8. On 8 GPUs no batch of 6 fits (a GPU would get no sample): static held the job
    # for the whole run ("no feasible size fits: min 8 GPUs"). It now runs on 4.
    jobs = [TraceJob("bert-0", 0.0, 6, model="bert", batch_size=6)]
    opts = SimOptions(nodes=2, gpus_per_node=4, seed=1, restart_cost_s=30.0,
                      setup=setup_for("static"), max_time_s=3600.0)
    r = run_simulation(jobs, config("static"), opts)
    (o,) = r.outcomes
    assert o.gpus_requested == 6 and o.start_s == 0.0
    assert r.unfinished == [UnfinishedJob("bert-0", o.job_id, "running", "")]
    assert o.gpu_seconds == pytest.approx(4 * 3600.0)   # on 4 GPUs all along
    assert {gpus for _, _, gpus in r.allocation_log} == {4}
    assert r.summary["unfinished_jobs"] == [{"state": "running", "reason": "", "jobs": 1,
                                             "names": ["bert-0"]}]


def test_jobs_that_cannot_run_are_named_with_the_daemons_reason(caplog):
    # A job whose spec no size of this cluster can serve (16 GPUs on 8: the trace loaders
    # and the job setup refuse it, a replay recipe could still say it) is held by the
    # daemon until the end of the run; the run says which job and why, as it does for a
    # job that arrives after the end.
    jobs = [TraceJob("cifar10-0", 0.0, 2, model="cifar10", batch_size=2),
            TraceJob("ncf-1", 10.0, 1, model="ncf", batch_size=32768),
            TraceJob("ncf-late", 99999.0, 1, model="ncf", batch_size=32768)]
    prepared = prepare_jobs(jobs, setup_for("static"), gpus_per_node=4, total_gpus=8, seed=0)
    spec = dataclasses.replace(parse_spec(prepared[0].comment), min_gpus=16, max_gpus=16,
                               batch_size=16, max_batch_size=16)
    prepared[0] = dataclasses.replace(prepared[0], comment=format_spec(spec), batch=16)
    opts = SimOptions(nodes=2, gpus_per_node=4, max_time_s=3600.0)
    with caplog.at_level(logging.WARNING, logger="malleable.sim.loop"):
        r = run_prepared(prepared, config("static"), opts)
    assert not r.finished and r.summary["jobs_finished"] == 1   # ncf-1
    held, late = r.unfinished
    assert (held.name, held.state, late) == (
        "cifar10-0", "held",
        UnfinishedJob("ncf-late", "", "not submitted", "arrives after the end of the run"))
    assert held.reason.startswith("no feasible size fits: min 16 GPUs"), held.reason
    assert r.summary["unfinished_jobs"] == [
        {"state": "held", "reason": held.reason, "jobs": 1, "names": ["cifar10-0"]},
        {"state": "not submitted", "reason": "arrives after the end of the run", "jobs": 1,
         "names": ["ncf-late"]}]
    (warning,) = [m for m in caplog.messages if m.startswith("run stopped")]
    assert warning == (f"run stopped at 3600 s with 2 job(s) unfinished, 2 of them not "
                       f"running: held: {held.reason} (1: cifar10-0); not submitted: arrives "
                       f"after the end of the run (1: ncf-late)")


def test_rigid_jobs_run_for_their_recorded_time_beside_malleable_ones():
    # Trace jobs of no profiled model (a CPU-only one, a GPU one) stay rigid: Slurm runs
    # them for their recorded duration and the daemon leaves them alone.
    jobs = [TraceJob("rigid-gpu", 0.0, 4, duration_s=600.0),
            TraceJob("cpu-only", 10.0, 0, duration_s=300.0),
            TraceJob("ncf-1", 20.0, 1, model="ncf", batch_size=32768)]
    opts = SimOptions(nodes=2, gpus_per_node=4, restart_cost_s=30.0,
                      setup=setup_for("pollux"), max_time_s=3 * 3600.0)
    r = run_simulation(jobs, config("pollux"), opts)
    assert r.finished and r.summary["jobs_finished"] == 3
    by = {o.name: o for o in r.outcomes}
    assert by["rigid-gpu"].end_s - by["rigid-gpu"].start_s == 600.0
    assert by["cpu-only"].end_s - by["cpu-only"].start_s == 300.0
    assert by["rigid-gpu"].restarts == by["cpu-only"].restarts == 0
    assert by["rigid-gpu"].gpu_seconds == 4 * 600.0 and by["cpu-only"].gpu_seconds == 0.0
    assert by["rigid-gpu"].model is None and by["ncf-1"].model == "ncf"


def test_jobs_are_resized_by_checkpoint_requeue(pollux_run):
    s = pollux_run.summary
    # Pollux grows the jobs that start on one GPU: checkpoint, requeue, resize, release.
    assert s["actions"].get("requeue:done", 0) >= 1
    sizes: dict[str, set[int]] = {}
    for _, job, gpus in pollux_run.allocation_log:
        if gpus:
            sizes.setdefault(job, set()).add(gpus)
    assert any(len(v) >= 2 for v in sizes.values()), sizes
    assert sum(o.restarts for o in pollux_run.outcomes) >= s["actions"]["requeue:done"]


def test_tiresias_runs_jobs_at_their_request_and_preempts_only():
    r = run("las")
    assert r.finished
    requested = {o.job_id: o.gpus_requested for o in r.outcomes}
    for _, job, gpus in r.allocation_log:
        # las as Tiresias: a job runs on its request (legal here) or not at all.
        assert gpus in (0, requested[job]), (job, gpus)


def test_same_seed_gives_byte_identical_summary(tmp_path, pollux_run):
    again = run("pollux")
    a = write_summary(pollux_run.summary, tmp_path / "a.json").read_bytes()
    b = write_summary(again.summary, tmp_path / "b.json").read_bytes()
    assert a == b
    assert json.loads(a)["decisions_sha256"] == pollux_run.summary["decisions_sha256"]


def test_summary_identical_in_a_fresh_process_with_another_hash_seed(tmp_path, pollux_run):
    """Set iteration order of strings changes with PYTHONHASHSEED; the run must not."""
    code = (
        "import sys; sys.path.insert(0, {root!r})\n"
        "from tests.sim.test_loop import run\n"
        "from malleable.sim.metrics import write_summary\n"
        "write_summary(run('pollux').summary, {out!r})\n"
    ).format(root=str(ROOT), out=str(tmp_path / "child.json"))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300, cwd=ROOT)
    here = write_summary(pollux_run.summary, tmp_path / "here.json").read_bytes()
    assert (tmp_path / "child.json").read_bytes() == here


def test_skipping_idle_cycles_changes_nothing(pollux_run):
    full = run("pollux", skip_idle=False)
    assert full.summary == pollux_run.summary
    assert full.cycles.skipped_polls == full.cycles.skipped_ingests == 0
    assert pollux_run.cycles.skipped_polls > 0 and pollux_run.cycles.skipped_ingests > 0


def test_progress_is_ingested_into_the_state_store(tmp_path):
    db = tmp_path / "state.db"
    r = run_simulation(JOBS[:2], config("pollux"),
                       SimOptions(nodes=2, gpus_per_node=4, restart_cost_s=30.0,
                                  setup=setup_for("pollux"), max_time_s=3 * 3600.0),
                       workdir=tmp_path / "work", db_url=f"sqlite:///{db}")
    assert r.finished
    from sqlalchemy import create_engine, func, select

    from malleable.db.models import Job, JobEvent, ProgressSample

    eng = create_engine(f"sqlite:///{db}")
    with eng.connect() as c:
        samples = c.scalar(select(func.count()).select_from(ProgressSample))
        kinds = {k for (k,) in c.execute(select(JobEvent.kind).distinct())}
        malleable = c.scalar(select(func.count()).select_from(Job).where(Job.malleable))
    eng.dispose()
    assert samples > 0
    assert {"new", "started", "finished"} <= kinds
    assert malleable == 2
    lines = (tmp_path / "work" / "spool").glob("*.jsonl")
    assert sum(1 for f in lines for _ in f.open()) >= samples


def test_an_idle_stretch_is_passed_over_with_the_same_jobs_and_decisions():
    # ncf takes about a minute; the second job arrives 20,000 s after the first one ended.
    jobs = [TraceJob("ncf-a", 0.0, 1, model="ncf", batch_size=32768),
            TraceJob("ncf-b", 20_000.0, 1, model="ncf", batch_size=32768)]

    def go(skip: bool):
        opts = SimOptions(nodes=2, gpus_per_node=4, restart_cost_s=30.0, skip_idle=skip,
                          setup=setup_for("pollux"), max_time_s=10 * 3600.0)
        return run_simulation(jobs, config("pollux"), opts)

    fast, full = go(True), go(False)
    assert fast.finished and full.finished
    assert fast.outcomes == full.outcomes
    counts = ("decide_cycles", "decisions")
    assert {k: v for k, v in fast.summary.items() if k not in counts} == \
        {k: v for k, v in full.summary.items() if k not in counts}
    # The decide ticks of the empty cluster (after MinJobAge) are not run, and are counted.
    assert full.cycles.skipped_decides == 0
    assert fast.cycles.skipped_decides > 300
    assert fast.summary["decide_cycles"] + fast.cycles.skipped_decides == \
        full.summary["decide_cycles"]
    assert fast.summary["decisions_sha256"] == full.summary["decisions_sha256"]


def test_an_arrival_after_the_end_of_the_run_skips_the_housekeeping_in_between():
    # The second job arrives long after --max-time: after the first one, the run is idle to
    # its end; retention's deletions by age are the last tick's alone.
    jobs = [TraceJob("ncf-a", 0.0, 1, model="ncf", batch_size=32768),
            TraceJob("ncf-b", 60 * 3600.0, 1, model="ncf", batch_size=32768)]

    def go(skip: bool):
        opts = SimOptions(nodes=2, gpus_per_node=4, restart_cost_s=30.0, skip_idle=skip,
                          setup=setup_for("pollux"), max_time_s=20 * 3600.0)
        return run_simulation(jobs, config("pollux"), opts)

    fast, full = go(True), go(False)
    assert not fast.finished and not full.finished
    assert fast.outcomes == full.outcomes
    assert fast.sim_s == full.sim_s == 20 * 3600.0
    counts = ("decide_cycles", "decisions")
    assert {k: v for k, v in fast.summary.items() if k not in counts} == \
        {k: v for k, v in full.summary.items() if k not in counts}
    assert full.cycles.housekeeping == 20
    assert fast.cycles.housekeeping == 1   # (the last tick before the end alone)
