"""The simulator's prediction of a `malleable replay` (malleable/sim/predict.py)."""

from __future__ import annotations

import pytest

from malleable.config import parse_config
from malleable.replay import recipe
from malleable.sim.jobs import ProfileJob
from malleable.sim.predict import CompressedProfile, predict_replay, prepare_replay
from malleable.sim.profiles import load_profile
from malleable.sim.traces import TraceJob

TRACE = [TraceJob("cifar10-0", 100.0, 4, model="cifar10", batch_size=2048),
         TraceJob("ncf-1", 400.0, 1, model="ncf", batch_size=32768),
         TraceJob("cifar10-2", 1300.0, 8, model="cifar10", batch_size=2048)]


def config(policy: str):
    # The demo's daemon settings, on the compressed clock (no lease, as in the demo).
    return parse_config({"daemon": {"poll_interval_s": 2, "ingest_interval_s": 2,
                                    "decide_interval_s": 4},
                         "policy": {"name": policy, "cooldown_s": 16, "min_run_restarts": 0}})


def test_compressed_profile_divides_time_and_keeps_the_rest():
    p = load_profile("cifar10")
    c = CompressedProfile(p, 40.0, 1.5)
    assert c.step_time((2,), 256) == pytest.approx(p.step_time((2,), 256) / 40.0)
    assert c.isolated_time(4) == pytest.approx(p.isolated_time(4) / 40.0)
    assert c.restart_cost_s == 1.5 and c.target_progress == p.target_progress
    assert c.best_batch((4,), 0.0) == p.best_batch((4,), 0.0)   # invariant to the scale
    with pytest.raises(ValueError, match="speedup"):
        CompressedProfile(p, 0.0, 1.0)
    with pytest.raises(ValueError, match="restart_cost_s"):
        CompressedProfile(p, 2.0, -1.0)


def test_prepare_replay_keeps_the_recipes_and_compresses_arrivals():
    recipes = [recipe(t, gpus_per_node=4, max_gpus=8) for t in TRACE]
    fixed = recipe(TRACE[0], gpus_per_node=4, max_gpus=8, adaptive_batch=False)
    jobs = prepare_replay([*recipes, fixed], speedup=40.0, restart_cost_s=0.9)
    assert [j.trace.arrival_s for j in jobs] == [0.0, 7.5, 30.0, 0.0]
    assert [j.trace.gpus for j in jobs] == [4, 1, 8, 4]
    assert all(j.adaptive and j.batch is None for j in jobs[:3])
    assert not jobs[3].adaptive and jobs[3].batch == 2048
    # A save of a tenth and the measured 0.9 s at every start.
    assert jobs[0].profile.restart_cost_s == pytest.approx(1.0)
    assert "model=cifar10" in jobs[0].comment


def test_predicted_replay_finishes_every_job_on_the_compressed_clock():
    recipes = [recipe(t, gpus_per_node=4, max_gpus=8) for t in TRACE]
    r = predict_replay(recipes, config("default"), speedup=40.0, nodes=2, gpus_per_node=4,
                       restart_cost_s=1.0)
    assert r.finished and len(r.outcomes) == 3
    # Every job ends, later than its compressed arrival and within minutes, not hours.
    for o in r.outcomes:
        assert o.end_s is not None and 0 < o.end_s - o.arrival_s < 900
    static = predict_replay(recipes, config("static"), speedup=40.0, nodes=2,
                            gpus_per_node=4, restart_cost_s=1.0)
    assert static.finished and static.summary["restarts_per_job"] == 0


def test_follow_plan_takes_the_plans_batch_for_its_gpu_count(tmp_path):
    from malleable.progress.plan import write_plan
    from malleable.progress.reporter import Plan
    from malleable.sim.engine import Engine
    from malleable.sim.slurm import SimSlurm
    from malleable.slurm.client import SubmitRequest

    engine = Engine()
    slurm = SimSlurm(engine, 1, 4)
    job = ProfileJob(load_profile("cifar10"), spool_dir=tmp_path, batch=256, follow_plan=True)
    other = ProfileJob(load_profile("cifar10"), spool_dir=tmp_path, batch=256)
    ids = [slurm.submit_sim(SubmitRequest(script="x", nodes=1, gpus_per_node=2, name=n), p)
           for n, p in (("a", job), ("b", other))]
    for i in ids:
        write_plan(tmp_path, Plan(job=i, t=0.0, gpus=2, nodes=1, batch=512))
    engine.run(until=60.0)
    assert job.batch == 512 and job.current_batch == 512
    assert other.batch == 256 and other.current_batch == 256
