"""The simulator's pieces together: a Pollux workload replayed on SimSlurm with simulated
jobs under the test-only static driver (plain Slurm behaviour); metrics and determinism."""

from __future__ import annotations

import json

import pytest

from malleable.sim.metrics import JOB_COLUMNS
from malleable.sim.profiles import DATA_DIR, load_profile
from malleable.sim.traces import TraceJob, load_philly, load_pollux_workload
from malleable.sim.workload import shape_for
from tests.sim.static_driver import run_static
from tests.sim.test_traces import PHILLY, need_shared

WORKLOAD = DATA_DIR / "workloads" / "workload-1.csv"


@pytest.fixture(scope="module")
def pollux_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("static-1")
    spool = out / "spool"
    spool.mkdir()
    jobs = load_pollux_workload(WORKLOAD)
    return out, spool, jobs, run_static(jobs, out, spool_dir=spool)


def test_every_job_of_the_workload_finishes(pollux_run):
    out, spool, jobs, run = pollux_run
    assert run.summary["jobs"] == run.summary["jobs_finished"] == 160
    assert run.replay.all_done() and run.slurm.active_jobs == 0 and run.slurm.used_gpus == 0
    assert all(o.end_s is not None and o.restarts == 0 for o in run.outcomes)
    assert run.cycles > 0 and run.slurm.rpc_count >= run.cycles


def test_each_job_runs_its_truth_model_time_on_the_shape_it_asked_for(pollux_run):
    _, _, jobs, run = pollux_run
    by_name = {j.name: j for j in jobs}
    for o in run.outcomes:
        t = by_name[o.name]
        nodes, gpn = shape_for(t.gpus, 4)
        prof = load_profile(t.model)
        expected = prof.restart_cost_s * 0.9 + prof.isolated_time(
            nodes * gpn, batch=t.batch_size, placement=(gpn,) * nodes)
        assert o.end_s - o.start_s == pytest.approx(expected, rel=1e-9), o.name
        assert o.start_s >= o.arrival_s
        assert o.gpu_seconds == pytest.approx((o.end_s - o.start_s) * nodes * gpn)


def test_the_summary_is_consistent_with_the_jobs(pollux_run):
    out, _, _, run = pollux_run
    s = json.loads((out / "summary.json").read_text())
    for key in ("avg_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization",
                "restarts_per_job", "ftf_rho_avg", "ftf_rho_max"):
        assert key in s
    jcts = sorted(o.jct_s for o in run.outcomes)
    assert s["avg_jct_s"] == pytest.approx(sum(jcts) / len(jcts), abs=1e-3)
    assert s["median_jct_s"] <= s["avg_jct_s"] <= s["p99_jct_s"] <= s["max_jct_s"]
    assert 0.0 < s["gpu_utilization"] <= 1.0
    gpu_hours = sum(o.gpu_seconds for o in run.outcomes) / 3600
    assert s["gpu_hours"] == pytest.approx(gpu_hours, abs=1e-3)
    assert s["ftf_rho_max"] >= s["ftf_rho_avg"] > 0
    header = (out / "jobs.csv").read_text().splitlines()[0]
    assert header == ",".join(JOB_COLUMNS)
    assert len((out / "jobs.csv").read_text().splitlines()) == 161


def test_every_job_wrote_a_well_formed_progress_file(pollux_run):
    _, spool, _, run = pollux_run
    files = sorted(spool.glob("*.jsonl"))
    assert len(files) == 160
    for f in files:
        recs = [json.loads(line) for line in f.read_text().splitlines()]
        assert recs[0]["event"] == "started" and recs[-1]["event"] == "finished"
        assert all(r["v"] == 1 and r["job"] == f.stem for r in recs)
        r = run.replay.by_id[f.stem]
        assert all((x["nodes"], x["gpus"]) == (r.nodes, r.nodes * r.gpus_per_node) for x in recs)


def test_same_input_gives_byte_identical_outputs(pollux_run, tmp_path):
    out, spool, jobs, _ = pollux_run
    spool2 = tmp_path / "spool"
    spool2.mkdir()
    run_static(jobs, tmp_path, spool_dir=spool2)
    assert (tmp_path / "summary.json").read_bytes() == (out / "summary.json").read_bytes()
    assert (tmp_path / "jobs.csv").read_bytes() == (out / "jobs.csv").read_bytes()
    for f in sorted(spool.glob("*.jsonl"))[:20]:
        assert (spool2 / f.name).read_bytes() == f.read_bytes()


@need_shared
def test_philly_seed_decides_the_models_and_the_same_seed_the_same_bytes(tmp_path):
    def small(seed: int) -> list[TraceJob]:
        jobs = load_philly(PHILLY, seed=seed, min_duration_s=60)
        picked = [j for j in jobs if j.gpu_time_s < 3 * 3600][:40]
        return [TraceJob(j.name, j.arrival_s - picked[0].arrival_s, min(j.gpus, 8), j.model,
                         j.duration_s) for j in picked]

    outs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        d = tmp_path / name
        d.mkdir()
        run = run_static(small(seed), d, nodes=4, gpus_per_node=4)
        assert run.summary["jobs_finished"] == 40
        outs[name] = (d / "summary.json").read_bytes()
    assert outs["a"] == outs["b"]
    assert outs["a"] != outs["c"]


def test_replay_options_restart_cost_oversize_and_shapes():
    from malleable.sim.engine import Engine
    from malleable.sim.jobs import ProfileJob, RigidJob
    from malleable.sim.slurm import SimSlurm
    from malleable.sim.workload import Replay

    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4)
    jobs = [TraceJob("m", 0.0, 16, model="cifar10", batch_size=512),
            TraceJob("r", 5.0, 2, duration_s=50.0)]
    rep = Replay(eng, s, jobs, restart_cost_s=30.0)
    assert rep.capped == ["m"] and (rep.jobs[0].nodes, rep.jobs[0].gpus_per_node) == (2, 4)
    assert isinstance(rep.jobs[0].program, ProfileJob) and isinstance(rep.jobs[1].program, RigidJob)
    assert rep.jobs[0].program.profile.restart_cost_s == 30.0
    rep.start()
    with pytest.raises(RuntimeError):
        rep.start()
    eng.run()
    assert rep.all_done() and rep.finished == 2
    with pytest.raises(ValueError, match="asks for 16 GPUs, the cluster has 8"):
        Replay(Engine(), SimSlurm(Engine(), nodes=2, gpus_per_node=4), jobs, oversize="error")
    with pytest.raises(ValueError, match="has no profile and the job has no duration"):
        Replay(eng, s, [TraceJob("x", 0.0, 1, model="ResNet-50")])
    assert [shape_for(g, 4) for g in (1, 4, 6, 8, 10, 12, 7, 16, 48)] == \
        [(1, 1), (1, 4), (2, 3), (2, 4), (5, 2), (3, 4), (2, 4), (4, 4), (12, 4)]
    assert shape_for(0, 4) == (1, 0)
    with pytest.raises(ValueError):
        shape_for(-1, 4)
