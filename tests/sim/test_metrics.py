"""Metrics on hand-computed cases, the files they write, and the plots."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from malleable.sim.metrics import (
    JOB_COLUMNS,
    JobOutcome,
    contention,
    fairness_rho,
    summarize,
    utilization,
    write_jobs_csv,
    write_summary,
)
from malleable.sim.plots import plot_gpus_per_job, plot_jct_cdf, plot_utilization


def outcome(name, arrival, start, end, restarts=0, gpu_s=0.0, ideal=None, gpus=1):
    return JobOutcome(name=name, job_id=name, model="cifar10", gpus_requested=gpus,
                      arrival_s=arrival, start_s=start, end_s=end, restarts=restarts,
                      gpu_seconds=gpu_s, ideal_time=ideal)


def test_contention_is_the_time_average_of_jobs_in_the_system():
    # a: [0, 10), b: [5, 15), c: [20, 20) (zero length).
    n = contention(np.array([0.0, 5.0, 20.0]), np.array([10.0, 15.0, 20.0]))
    # a sees 1 job for 5 s then 2 for 5 s: 1.5; b the same; c counts itself: 1.
    assert n.tolist() == pytest.approx([1.5, 1.5, 1.0])
    with pytest.raises(ValueError):
        contention(np.array([1.0]), np.array([0.0]))
    assert contention(np.zeros(0), np.zeros(0)).size == 0


def test_fairness_rho_divides_jct_by_the_time_alone_on_an_equal_share():
    shares: list[float] = []

    def ideal(share: float) -> float:
        shares.append(share)
        return 100.0 / share          # perfectly scalable job of 100 GPU-seconds

    outs = [outcome("a", 0.0, 0.0, 10.0, ideal=ideal), outcome("b", 5.0, 5.0, 15.0, ideal=ideal),
            outcome("c", 0.0, None, None, ideal=ideal), outcome("d", 1.0, 1.0, 2.0)]
    rho = fairness_rho(outs, total_gpus=8)
    # While a is in the system ([0, 10)): c the whole time (submitted at 0, never
    # finished: a run stopped with it pending), d in [1, 2), b in [5, 15).
    n_a = (2 * 1 + 3 * 1 + 2 * 3 + 3 * 5) / 10     # 2.6
    assert shares[0] == pytest.approx(8 / n_a)
    assert rho[0] == pytest.approx(10.0 / (100.0 / (8 / n_a)))
    assert np.isnan(rho[2]) and np.isnan(rho[3])   # unfinished; no model
    assert fairness_rho([], 8).size == 0


def rigid(duration: float, gpus: int):
    """A rigid job's time alone on a share (as `malleable.sim.workload` models one)."""
    return lambda share: duration * max(1.0, gpus / share)


def test_jobs_a_stopped_run_left_unfinished_count_as_sharing_the_gpus():
    """8 GPUs. a: 4 GPUs, [0, 100), finished. b: 4 GPUs, running since 0 when the run
    stopped. c: 4 GPUs, arrived at 50, pending. d: never submitted (arrives later).
    N_a = (2 * 50 + 3 * 50) / 100 = 2.5, share 8 / 2.5 = 3.2 GPUs, a's time alone on it
    100 * 4 / 3.2 = 125 s: rho_a = 100 / 125 = 0.8. Counting only the finished jobs
    gave N_a = 1 and rho 1.0."""
    outs = [outcome("a", 0.0, 0.0, 100.0, ideal=rigid(100.0, 4), gpus=4),
            outcome("b", 0.0, 0.0, None, ideal=rigid(500.0, 4), gpus=4),
            outcome("c", 50.0, None, None, ideal=rigid(500.0, 4), gpus=4),
            JobOutcome("d", "", None, 4, 60.0, None, None, ideal_time=rigid(500.0, 4))]
    rho = fairness_rho(outs, total_gpus=8)
    assert rho[0] == pytest.approx(0.8)
    assert np.isnan(rho[1:]).all()                  # no rho for the unfinished
    s = summarize(outs, total_gpus=8)
    assert (s["ftf_rho_avg"], s["ftf_rho_max"], s["ftf_unfair_fraction"]) == (0.8, 0.8, 0.0)
    # A job arriving after every finished job ended changes nothing.
    late = outcome("e", 100.0, 100.0, None, ideal=rigid(1.0, 4), gpus=4)
    assert fairness_rho([*outs, late], 8)[0] == pytest.approx(0.8)


def test_cpu_only_jobs_are_outside_finish_time_fairness(tmp_path):
    """4 GPUs. g: 4 GPUs, [0, 100). x: 0 GPUs (a CPU job of the Eagle sample), [0, 100),
    with the rigid model it used to get (a 1-GPU job). x had rho 1.0 and halved g's share
    (N_g = 2: rho_g 0.5); with 100 such CPU jobs, x's rho was 100 / (100 * 101 / 4) =
    0.04 without waiting. Now x has no rho and does not count: N_g = 1, rho_g = 1."""
    g = outcome("g", 0.0, 0.0, 100.0, ideal=rigid(100.0, 4), gpus=4)
    cpu = [outcome(f"x{i}", 0.0, 0.0, 100.0, ideal=rigid(100.0, 1), gpus=0) for i in range(100)]
    rho = fairness_rho([g, *cpu], total_gpus=4)
    assert rho[0] == pytest.approx(1.0) and np.isnan(rho[1:]).all()
    s = summarize([g, *cpu], total_gpus=4)
    assert (s["ftf_rho_avg"], s["ftf_rho_max"], s["ftf_unfair_fraction"]) == (1.0, 1.0, 0.0)
    assert s["jobs"] == s["jobs_finished"] == 101 and s["avg_jct_s"] == 100.0
    rows = list(csv.DictReader(write_jobs_csv([g, cpu[0]], 4, tmp_path / "j.csv").open()))
    assert [(r["name"], r["ftf_rho"]) for r in rows] == [("g", "1.0"), ("x0", "")]
    assert summarize(cpu, total_gpus=4)["ftf_rho_avg"] is None   # no GPU job: no fairness


def test_a_cpu_only_replayed_job_has_no_ideal_time():
    from malleable.sim.jobs import RigidJob
    from malleable.sim.traces import TraceJob
    from malleable.sim.workload import ReplayedJob, _ideal_time

    cpu = ReplayedJob(TraceJob("x", 0.0, 0, duration_s=100.0), RigidJob(100.0), 1, 0)
    assert _ideal_time(cpu, 4, 0) is None
    gpu = ReplayedJob(TraceJob("y", 0.0, 2, duration_s=100.0), RigidJob(100.0), 1, 2)
    assert _ideal_time(gpu, 4, 2)(1.0) == 200.0 and _ideal_time(gpu, 4, 2)(4.0) == 100.0


def test_summary_on_a_hand_computed_run():
    outs = [outcome("a", 0.0, 0.0, 100.0, restarts=1, gpu_s=400.0),
            outcome("b", 10.0, 50.0, 300.0, restarts=0, gpu_s=500.0),
            outcome("c", 20.0, None, None, restarts=0)]
    times = np.array([0.0, 50.0, 100.0, 300.0])
    used = np.array([4, 6, 2, 0])
    s = summarize(outs, total_gpus=8, timeline=(times, used))
    assert s["jobs"] == 3 and s["jobs_finished"] == 2
    assert s["avg_jct_s"] == 195.0 and s["median_jct_s"] == 195.0
    assert s["p99_jct_s"] == pytest.approx(100 + 0.99 * 190, abs=1e-3)
    assert s["max_jct_s"] == 290.0
    assert s["makespan_s"] == 300.0
    # (4*50 + 6*50 + 2*200) / (8 * 300)
    assert s["gpu_utilization"] == pytest.approx(900 / 2400, abs=1e-3)
    assert s["gpu_hours"] == 0.25
    assert s["restarts_per_job"] == pytest.approx(1 / 3, abs=1e-3)
    assert s["avg_wait_s"] == 20.0
    assert s["ftf_rho_avg"] is None      # no job has a model of its ideal time here
    empty = summarize([], 8)
    assert empty["avg_jct_s"] is None and empty["makespan_s"] is None
    assert empty["restarts_per_job"] is None and empty["gpu_hours"] == 0.0


def test_a_run_stopped_before_any_job_ended_has_no_jct_not_a_zero_one():
    # One job ran the whole hour on 8 GPUs and had not ended when the run stopped.
    outs = [outcome("a", 0.0, 0.0, None, gpu_s=8 * 3600.0), outcome("b", 10.0, None, None)]
    s = summarize(outs, 8, timeline=(np.array([0.0, 3600.0]), np.array([8, 0])))
    assert s["jobs_finished"] == 0
    for k in ("avg_jct_s", "median_jct_s", "p99_jct_s", "max_jct_s", "makespan_s",
              "gpu_utilization", "ftf_rho_avg", "ftf_rho_max", "ftf_unfair_fraction"):
        assert s[k] is None, k
    assert s["gpu_hours"] == 8.0 and s["avg_wait_s"] == 0.0 and s["restarts_per_job"] == 0.0


def test_utilization_clips_to_the_interval():
    t = np.array([0.0, 10.0])
    u = np.array([8, 4])
    assert utilization(t, u, 8, 0.0, 20.0) == pytest.approx((80 + 40) / 160)
    assert utilization(t, u, 8, 5.0, 15.0) == pytest.approx((40 + 20) / 80)
    assert utilization(t, u, 8, 5.0, 5.0) == 0.0


def test_summary_and_jobs_csv_are_sorted_rounded_and_reproducible(tmp_path):
    outs = [outcome("b", 10.0, 50.0, 300.123456, gpu_s=1.0 / 3, ideal=lambda s: 10.0),
            outcome("a", 0.0, 0.0, 100.0, restarts=2)]
    s = summarize(outs, 8)
    p1 = write_summary(s, tmp_path / "s1.json")
    p2 = write_summary(summarize(list(outs), 8), tmp_path / "s2.json")
    assert p1.read_bytes() == p2.read_bytes()
    loaded = json.loads(p1.read_text())
    assert list(loaded) == sorted(loaded)
    assert p1.read_text().endswith("}\n")
    assert loaded["avg_jct_s"] == round((290.123456 + 100.0) / 2, 3)
    c = write_jobs_csv(outs, 8, tmp_path / "jobs.csv")
    rows = list(csv.reader(c.open()))
    assert tuple(rows[0]) == JOB_COLUMNS
    assert [r[0] for r in rows[1:]] == ["a", "b"]        # by arrival
    b = dict(zip(rows[0], rows[2], strict=True))
    assert b["end_s"] == "300.123" and b["jct_s"] == "290.123" and b["gpu_seconds"] == "0.333"
    assert b["ftf_rho"] == "29.012"
    a = dict(zip(rows[0], rows[1], strict=True))
    assert a["ftf_rho"] == "" and a["restarts"] == "2"


def test_plots_are_written_as_png(tmp_path):
    png = b"\x89PNG\r\n\x1a\n"
    p = plot_jct_cdf({"static": [100.0, 2000.0, 30000.0], "other": [50.0, 900.0]},
                     tmp_path / "cdf.png")
    assert p.read_bytes()[:8] == png
    log = [(0.0, "1", 4), (10.0, "2", 8), (3600.0, "1", 0), (7200.0, "2", 0)]
    p = plot_gpus_per_job(log, tmp_path / "gpus.png", total_gpus=16)
    assert p.read_bytes()[:8] == png
    p = plot_utilization(np.array([0.0, 10.0, 3600.0, 7200.0]), np.array([4, 12, 8, 0]), 16,
                         tmp_path / "util.png")
    assert p.read_bytes()[:8] == png
    with pytest.raises(ValueError, match="no JCT"):
        plot_jct_cdf({"x": []}, tmp_path / "none.png")
    with pytest.raises(ValueError, match="empty allocation log"):
        plot_gpus_per_job([], tmp_path / "none.png")
    with pytest.raises(ValueError, match="same shape"):
        plot_utilization(np.zeros(2), np.zeros(3), 4, tmp_path / "none.png")


def test_importing_plots_and_metrics_does_not_import_matplotlib():
    code = ("import sys, malleable.sim.plots, malleable.sim.metrics; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_job_served_as_if_alone_is_not_counted_unfair():
    """ncf jobs can use 1 GPU: each ran alone at once on it, yet had rho 1.32-1.55 and
    made most of ftf_unfair_fraction (a helper). The equal share was not capped at the
    GPUs the job can use, and its JCT held its start-up while its ideal time did not."""
    from malleable.config import parse_config
    from malleable.sim.jobsetup import setup_for
    from malleable.sim.loop import SimOptions, run_simulation
    from malleable.sim.traces import load_pollux_workload

    jobs = load_pollux_workload("malleable/sim/data/pollux/workloads/workload-1.csv")[:10]
    r = run_simulation(jobs, parse_config({"policy": {"name": "pollux"}}, source="test"),
                       SimOptions(nodes=2, gpus_per_node=4, setup=setup_for("pollux")))
    rho = fairness_rho(r.outcomes, 8)
    ncf = [i for i, o in enumerate(r.outcomes) if o.model == "ncf"]
    assert len(ncf) == 5
    for i in ncf:
        o = r.outcomes[i]
        assert o.start_s == o.arrival_s                    # started at once, alone on 1 GPU
        assert rho[i] == pytest.approx(1.0, abs=1e-9)
    assert r.summary["ftf_unfair_fraction"] == pytest.approx(
        float(np.mean(rho[np.isfinite(rho)] > 1 + 1e-9)), abs=1e-3)
    assert r.summary["ftf_unfair_fraction"] <= 0.1
