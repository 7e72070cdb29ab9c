"""Job setups per policy (the Pollux artifact's) and trace handling for runs: formats,
model mapping, load scaling and the busiest window that fits a cluster."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from malleable.policies.registry import DEFAULT
from malleable.sim.engine import Engine
from malleable.sim.jobs import ProfileJob
from malleable.sim.jobsetup import (
    POLICY_SETUPS,
    legal_size,
    oracle_samples,
    prepare_jobs,
    setup_for,
)
from malleable.sim.profiles import load_profile
from malleable.sim.slurm import SimSlurm
from malleable.sim.traces import TraceError, TraceJob
from malleable.sim.workloads import (
    busiest_fitting_window,
    detect_format,
    load_workload,
    map_models,
    scale_load,
    trace_file_problem,
    unique_names,
)
from malleable.slurm.records import SubmitRequest
from malleable.spec import parse_spec

DATA = Path("/work/shared/data")
POLLUX_WL = Path(__file__).resolve().parents[2] / "malleable/sim/data/pollux/workloads"


def test_legal_size_rounds_without_bias():
    assert [legal_size(k, 4, 0.99) for k in (1, 2, 3, 4, 8, 12)] == [1, 2, 3, 4, 8, 12]
    # 6 on 4-GPU nodes: 4 or 8, each half the time; 10: 8 (p 0.5) or 12.
    u = np.random.default_rng(0).random(20000)
    six = np.array([legal_size(6, 4, x) for x in u])
    assert set(six) == {4, 8} and abs(six.mean() - 6) < 0.05
    seven = np.array([legal_size(7, 4, x) for x in u])
    assert set(seven) == {4, 8} and abs(seven.mean() - 7) < 0.05
    with pytest.raises(ValueError):
        legal_size(0, 4, 0.5)


def test_setups_follow_the_pollux_artifact():
    job = [TraceJob("cifar10-0", 0.0, 6, model="cifar10", batch_size=2048),
           TraceJob("ncf-1", 5.0, 1, model="ncf", batch_size=32768)]
    kw = {"gpus_per_node": 4, "total_gpus": 64, "seed": 0, "restart_cost_s": 30.0}
    pollux = prepare_jobs(job, setup_for("pollux"), **kw)
    spec = parse_spec(pollux[0].comment)
    prof = load_profile("cifar10")
    # Pollux: 1..max GPUs, starts on one, the model's initial batch, adapts it itself.
    assert (spec.min_gpus, pollux[0].trace.gpus, pollux[0].adaptive) == (1, 1, True)
    assert spec.batch_size == prof.init_batch_size and spec.max_batch_size == prof.max_batch_size
    assert spec.restart_cost_s == 30.0 and spec.max_local_batch_size is None
    # NCF runs on one GPU at its fixed batch in every setup (artifact: max_replicas = 1).
    assert parse_spec(pollux[1].comment).max_gpus == 1 and pollux[1].batch == 32768
    las = prepare_jobs(job, setup_for("las"), **kw)
    s = parse_spec(las[0].comment)
    assert s.min_gpus == s.max_gpus == las[0].trace.gpus in (4, 8)
    assert s.batch_size == s.max_batch_size == 2048 and las[0].requested == 6
    opt = prepare_jobs(job, setup_for("optimus"), **kw)
    s = parse_spec(opt[0].comment)
    assert (s.min_gpus, s.max_gpus) == (1, 64)          # 2048 // 32 = 64 replicas
    assert s.target_samples == oracle_samples(prof, 2048)
    assert setup_for("fifo") == setup_for("fifo", "elastic")
    # "default" is the registry's default policy, with that policy's setup.
    assert setup_for("default") == setup_for(DEFAULT) == POLICY_SETUPS[DEFAULT]
    assert setup_for("las", oracle_work=True).oracle_work is True
    assert set(POLICY_SETUPS) == {"pollux", "las", "static", "optimus"}
    with pytest.raises(ValueError, match="job setup 'x'"):
        setup_for("las", "x")


def test_a_request_is_not_rounded_up_past_the_fixed_batch():
    # 6 GPUs at batch 6 on 4-GPU nodes: 8 GPUs would leave a GPU without a sample (no
    # batch fits, the job would be held for good), so it becomes 4 whatever the draw;
    # at a batch with room the rounding is as before (4 or 8, half the time each).
    kw = {"gpus_per_node": 4, "total_gpus": 64}
    small = [TraceJob("bert-0", 0.0, 6, model="bert", batch_size=6)]
    big = [TraceJob("bert-0", 0.0, 6, model="bert", batch_size=384)]
    for setup in ("las", "static"):
        got = {prepare_jobs(small, setup_for(setup), seed=s, **kw)[0].trace.gpus
               for s in range(20)}
        assert got == {4}, (setup, got)
        spec = parse_spec(prepare_jobs(small, setup_for(setup), seed=1, **kw)[0].comment)
        assert (spec.min_gpus, spec.max_gpus, spec.batch_size) == (4, 4, 6)
        assert {prepare_jobs(big, setup_for(setup), seed=s, **kw)[0].trace.gpus
                for s in range(20)} == {4, 8}
    # Adaptive jobs choose their own batch: the trace's does not bound their size.
    assert parse_spec(prepare_jobs(small, setup_for("pollux"), seed=1, **kw)[0].comment
                      ).max_gpus == 64   # (bert: 384 // 4 = 96 replicas, capped at 64)


def test_a_job_with_fewer_samples_than_gpus_is_refused():
    job = [TraceJob("cifar10-7", 0.0, 2, model="cifar10", batch_size=1)]
    for setup in ("las", "static", "optimus", "pollux"):
        with pytest.raises(ValueError, match=r"job 'cifar10-7': batch size 1 is below its 2 "
                                             r"GPUs \(at least one sample per GPU\)"):
            prepare_jobs(job, setup_for(setup), gpus_per_node=4, total_gpus=64, seed=0)


def test_oracle_work_is_what_the_job_trains():
    """The declared total work equals the samples a job at that fixed batch processes."""
    prof = load_profile("cifar10")
    engine = Engine()
    slurm = SimSlurm(engine, 1, 4)
    job = ProfileJob(prof, batch=512)
    slurm.submit_sim(SubmitRequest(script="x", nodes=1, gpus_per_node=4), job)
    engine.run()
    assert job.done
    assert math.isclose(job.samples, oracle_samples(prof, 512), rel_tol=0.01)


def test_formats_are_detected_from_the_real_files():
    assert detect_format(POLLUX_WL / "workload-1.csv") == "pollux"
    assert detect_format(DATA / "philly_pollux/philly.csv") == "philly"
    assert detect_format(DATA / "gavel/philly_msr_vc_traces.csv.gz") == "gavel"
    assert detect_format(DATA / "pwa_swf/NASA-iPSC-1993-3.1-cln.swf.gz") == "swf"
    assert detect_format(DATA / "nrel_eagle_slurm/sample_eagle_data.csv") == "sacct"
    with pytest.raises(TraceError, match="no such file"):
        load_workload("/nonexistent.csv")


def test_a_trace_that_is_not_a_regular_file_is_named_as_such(tmp_path):
    assert trace_file_problem(tmp_path / "none.csv") == "no such file"
    assert trace_file_problem(tmp_path) == "is a directory"
    with pytest.raises(TraceError, match=r"^/dev/null: not a regular file \(a character "
                                         r"device\); give a trace file$"):
        load_workload("/dev/null")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert trace_file_problem(fifo) == "not a regular file (a named pipe); give a trace file"


def test_an_unknown_or_empty_trace_names_the_formats(tmp_path):
    other = tmp_path / "dist.csv"
    other.write_text("duration_s,num_gpus\r\n10,1\r\n")   # not a trace (CRLF too)
    with pytest.raises(TraceError, match=r"dist.csv:1: field header='duration_s,num_gpus': "
                                         r"no known trace format: expected a Pollux CSV"):
        detect_format(other)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty.csv: empty file"):
        load_workload(empty)
    with pytest.raises(TraceError, match="empty.csv: empty file"):
        load_workload(empty, "pollux")
    blank = tmp_path / "blank.csv"
    blank.write_text("\n")
    with pytest.raises(TraceError, match="empty first line: no trace format to recognise"):
        load_workload(blank)
    for first, fmt in [('{"jobs": []}', "sacct"), ("JobID|Submit|", "sacct"),
                       ("job_id,user,submit_time", "sacct")]:
        f = tmp_path / "s.txt"
        f.write_text(first + "\n")
        assert detect_format(f) == fmt


def test_gavel_and_sacct_jobs_get_profiled_models(tmp_path):
    gavel = load_workload(DATA / "gavel/philly_msr_vc_traces.csv.gz", window_days=14,
                          capacity_gpus=64)
    assert gavel and {j.model for j in gavel} <= {"cifar10", "imagenet", "ncf", "bert",
                                                  "deepspeech2", "yolov3"}
    eagle = load_workload(DATA / "nrel_eagle_slurm/sample_eagle_data.csv")
    assert all(j.model is None for j in eagle)          # rigid unless asked
    mapped = load_workload(DATA / "nrel_eagle_slurm/sample_eagle_data.csv",
                           gpu_time_classes=True)
    gpu = [j for j in mapped if j.gpus > 0]
    assert gpu and all(j.model is not None for j in gpu)
    assert all(j.model is None for j in mapped if j.gpus == 0)
    with pytest.raises(ValueError, match="no profiled model"):
        map_models([TraceJob("x", 0.0, 1, model="GPT")], "gavel")


def test_load_scale_and_names():
    jobs = [TraceJob("a", 100.0, 1), TraceJob("b", 300.0, 1)]
    assert [j.arrival_s for j in scale_load(jobs, 2.0)] == [50.0, 150.0]
    with pytest.raises(ValueError):
        scale_load(jobs, 0.0)
    # A scale so small that an arrival becomes infinite: the engine failed on it (exit 1).
    with pytest.raises(ValueError, match=r"^--load-scale 5e-324: job a's arrival, 100 s, "
                                         r"divided by it is no finite time$"):
        scale_load(jobs, 5e-324)
    assert scale_load([TraceJob("z", 0.0, 1)], 5e-324)[0].arrival_s == 0.0
    assert unique_names(["/x/w.csv", "/y/v.csv.gz"]) == ["w", "v"]
    assert unique_names(["/x/w.csv", "/y/w.csv"]) == ["x-w", "y-w"]
    with pytest.raises(ValueError, match=r"^traces whose runs would share a name \(c-a\): "
                                         r"/c/a\.csv, /c/a\.swf; rename or move one"):
        unique_names(["/c/a.csv", "/d/b.csv", "/c/a.swf"])


def test_busiest_fitting_window():
    day = 86400.0
    # Group A: 10 one-GPU jobs of a day each, arriving 0.1 day apart; group B: 3 such
    # jobs on day 5. Demand of a 1-day window = GPU-days of the jobs arriving in it.
    a = [TraceJob(f"a{i}", i * 0.1 * day, 1, duration_s=day, group="A") for i in range(10)]
    b = [TraceJob(f"b{i}", 5 * day + i, 1, duration_s=day, group="B") for i in range(3)]
    g, start, w = busiest_fitting_window(a + b, day, 100.0)
    assert (g, start, len(w)) == ("A", 0.0, 10)
    # 4 GPUs: A's first window (10) does not fit; from its 7th job on, 4 jobs do (4 > B's 3).
    g, start, w = busiest_fitting_window(a + b, day, 4.0)
    assert (g, len(w)) == ("A", 4) and math.isclose(start, 0.6 * day)
    assert w[0].arrival_s == 0.0 and [j.name for j in w] == ["a6", "a7", "a8", "a9"]
    # 3.5 GPUs: A fits 3 jobs, B all 3; equal demand, the first group by name wins.
    assert busiest_fitting_window(a + b, day, 3.5)[0] == "A"
    assert busiest_fitting_window(b + a[:1], day, 3.5)[0] == "B"
    _, _, w = busiest_fitting_window(a + b, day, 4.0, by_group=False)
    assert sum(j.gpus * j.duration_s for j in w) / day <= 4.0
    with pytest.raises(ValueError, match="fits"):
        busiest_fitting_window(a, 0.5 * day, 0.5)
