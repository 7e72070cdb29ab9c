"""``malleable simulate``: a plain sweep, its outputs, bad input (exit 2), the Slurm array."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = """name,time,application,num_replicas,batch_size
ncf-0,0,ncf,1,32768
cifar10-1,30,cifar10,2,256
ncf-2,90,ncf,1,32768
"""


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.csv"
    p.write_text(WORKLOAD)
    return p


def simulate(*args: str):
    return CliRunner().invoke(main, ["simulate", "--no-progress", *args], prog_name="malleable")


def test_plain_sweep_writes_runs_and_comparison(tmp_path, workload):
    out = tmp_path / "out"
    res = simulate("--workload", str(workload), "--policy", "pollux,static", "--nodes", "2",
                   "--gpus-per-node", "4", "--seed", "3", "--restart-cost", "30",
                   "--out", str(out))
    assert res.exit_code == 0, res.output + (res.stderr or "")
    for pol in ("pollux", "static"):
        d = out / "tiny" / pol / "seed3"
        s = json.loads((d / "summary.json").read_text())
        assert (s["workload"], s["policy"], s["seed"]) == ("tiny", pol, 3)
        assert s["jobs"] == s["jobs_finished"] == 3
        rows = (d / "jobs.csv").read_text().splitlines()
        assert rows[0].startswith("name,job_id,model") and len(rows) == 4
        for png in ("jct_cdf.png", "gpus_per_job.png", "utilization.png"):
            assert (d / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    cmp = json.loads((out / "comparison.json").read_text())
    assert set(cmp["by_policy"]) == {"pollux", "static"}
    assert len(cmp["runs"]) == 2
    assert (out / "jct_cdf.png").exists() and (out / "tiny" / "jct_cdf.png").exists()
    assert "tiny" in res.output and "avg JCT" in res.output
    # --compare-only rebuilds the comparison from the runs on disk, running nothing.
    (out / "comparison.json").unlink()
    res = simulate("--compare-only", "--out", str(out))
    assert res.exit_code == 0 and "2 run(s) compared" in res.output, res.output
    assert json.loads((out / "comparison.json").read_text())["by_policy"] == cmp["by_policy"]


def test_parallel_runs_give_the_same_summaries_as_serial(tmp_path, workload):
    args = ["--workload", str(workload), "--policy", "las,optimus", "--nodes", "2",
            "--restart-cost", "30", "--no-plots", "--no-comparison"]
    assert simulate(*args, "--out", str(tmp_path / "a"), "--jobs", "1").exit_code == 0
    assert simulate(*args, "--out", str(tmp_path / "b"), "--jobs", "2").exit_code == 0
    for pol in ("las", "optimus"):
        rel = Path("tiny") / pol / "seed0" / "summary.json"
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


SACCT_HISTORY = """JobID|JobName|Partition|Submit|Start|End|Elapsed|NNodes|AllocTRES|State|
100|train|gpu|2024-03-01T10:00:00|2024-03-01T10:00:05|2024-03-01T11:00:05|01:00:00|2|cpu=8,gres/gpu=8,node=2|COMPLETED|
101_3|sweep|gpu|2024-03-01T10:30:00|2024-03-01T10:31:00|2024-03-01T11:01:00|00:30:00|1|cpu=2,gres/gpu:a100=2,node=1|COMPLETED|
102|cpujob|cpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:10:30|10:30|1|cpu=1,node=1|FAILED|
"""


@pytest.mark.parametrize("map_models", [False, True])
def test_site_history_with_rigid_and_cpu_only_jobs(tmp_path, map_models):
    # The documented sacct replay: jobs left rigid (all of them, or the CPU-only one
    # with --map-models) run for their recorded time.
    hist = tmp_path / "history.txt"
    hist.write_text(SACCT_HISTORY)
    out = tmp_path / "site"
    res = simulate("--workload", str(hist), "--format", "sacct",
                   *(["--map-models"] if map_models else []), "--policy", "default",
                   "--nodes", "2", "--no-plots", "--out", str(out))
    assert res.exit_code == 0, res.output
    s = json.loads((out / "history" / "default" / "seed0" / "summary.json").read_text())
    assert s["jobs"] == s["jobs_finished"] == 3
    rows = (out / "history" / "default" / "seed0" / "jobs.csv").read_text().splitlines()
    cpu = next(r.split(",") for r in rows if r.startswith("102,"))
    assert float(cpu[7]) == 630.0 and cpu[3] == "0"   # jct_s, gpus_requested
    assert cpu[11] == ""                              # ftf_rho: outside fairness
    # The CPU-only job is noted: how many of how many, and what the simulator does.
    assert (f"--workload {hist}: 1 of 3 job(s) request 0 GPUs (CPU-only); they are simulated "
            "as rigid jobs that hold no GPU") in " ".join(res.stderr.split())
    assert ("not in the fairness metrics (ftf_rho_*: they share no GPU), and add nothing to "
            "gpu_utilization") in res.stderr


EAGLE = Path("/work/shared/data/nrel_eagle_slurm/sample_eagle_data.csv")


@pytest.mark.skipif(not EAGLE.exists(), reason="the shared data folder is not here")
def test_cpu_only_jobs_of_the_eagle_sample_are_noted(tmp_path):
    # --slurm-array checks the trace (and notes) without simulating it.
    res = simulate("--workload", str(EAGLE), "--policy", "static", "--out", str(tmp_path),
                   "--slurm-array")
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if "CPU-only" in line]
    assert len(notes) == 1 and "996 of 1000 job(s) request 0 GPUs (CPU-only)" in notes[0]


@pytest.mark.parametrize("flag, expected", [([], 120.0), (["--interval", "30"], 30.0)])
def test_interval_comes_from_the_config_unless_given(tmp_path, workload, flag, expected):
    cfg = tmp_path / "d.toml"
    cfg.write_text("[daemon]\ndecide_interval_s = 120\n")
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--config", str(cfg), *flag, "--max-time", "0.5", "--no-plots",
                   "--no-comparison", "--out", str(out))
    assert res.exit_code == 0, res.output
    s = json.loads((out / "tiny" / "las" / "seed0" / "summary.json").read_text())
    assert s["interval_s"] == expected
    # Decide cycles at 0 s and every interval while jobs are left (at most 0.5 h).
    assert s["decide_cycles"] <= 1 + 1800 // expected


def test_summary_records_the_settings_that_change_decisions(tmp_path, workload):
    cfg = tmp_path / "d.toml"
    cfg.write_text("[policy]\nmin_gain = 0.2\ncooldown_s = 600\n[daemon]\npoll_interval_s = 15\n")
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--config", str(cfg), "--max-time", "0.5", "--no-plots",
                   "--no-comparison", "--out", str(out))
    assert res.exit_code == 0, res.output
    s = json.loads((out / "tiny" / "las" / "seed0" / "summary.json").read_text())
    assert s["settings"] == {"min_gain": 0.2, "cooldown_s": 600.0, "min_run_restarts": 10.0,
                             "default_restart_cost_s": 60.0,
                             "queue_depth": 100, "poll_interval_s": 15.0,
                             "ingest_interval_s": 30.0, "max_concurrent_requeues": 4,
                             "requeue_backoff_s": 600.0}


def test_a_run_stopped_by_max_time_says_so(tmp_path, workload):
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--max-time", "0.005", "--no-plots", "--out", str(out))   # 18 s
    assert res.exit_code == 0, res.output
    s = json.loads((out / "tiny" / "las" / "seed0" / "summary.json").read_text())
    assert s["all_finished"] is False and s["jobs_finished"] == 0
    assert s["avg_jct_s"] is None and s["makespan_s"] is None
    assert "0/3 jobs, avg JCT - s, p99 - s, makespan - h" in res.output
    assert "[stopped at --max-time: 3 job(s) unfinished]" in res.output
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["by_policy"]["las"]["incomplete_runs"] == 1
    assert cmp["by_policy"]["las"]["mean_avg_jct_s"] is None
    # A second sweep into the same folder compares with the runs already there.
    res = simulate("--workload", str(workload), "--policy", "static", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 0 and "(with 1 earlier run(s) found in" in res.output
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["by_policy"]["static"]["incomplete_runs"] == 0
    assert set(cmp["by_policy"]) == {"las", "static"}


def test_ctrl_c_surfacing_as_a_store_error_is_an_abort_not_a_traceback(tmp_path, workload,
                                                                          monkeypatch):
    from sqlalchemy.exc import ResourceClosedError

    from malleable.sim import sweep

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ResourceClosedError("This transaction is closed") from None

    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    res = simulate("--workload", str(workload), "--policy", "las", "--out", str(tmp_path / "o"))
    assert res.exit_code == 130 and "Aborted!" in res.output     # as a shell reports SIGINT
    assert not isinstance(res.exception, ResourceClosedError)


def test_ctrl_c_exits_130_and_end_of_input_at_a_prompt_exits_1(monkeypatch):
    """Ctrl-C exits as a shell reports SIGINT (128 + 2); click's other abort, an end of
    input at a prompt, keeps exit code 1."""
    import click

    from malleable import cli

    @click.command()
    def interrupted():
        raise KeyboardInterrupt

    @click.command()
    def prompted():
        click.prompt("name")

    for command, code in ((interrupted, 130), (prompted, 1)):
        monkeypatch.setitem(cli.COMMANDS, "probe", "x:y")
        monkeypatch.setattr(cli.LazyGroup, "get_command", lambda self, ctx, name, c=command: c)
        res = CliRunner().invoke(cli.main, ["probe"], input="")
        assert res.exit_code == code and "Aborted!" in res.output, (code, res.output)


def test_help_lists_every_policy_and_format():
    from malleable.policies.registry import available
    from malleable.sim.workloads import FORMATS

    res = CliRunner().invoke(main, ["simulate", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for name in available():
        assert name in text, name
    for fmt in FORMATS:
        assert fmt in text, fmt


def test_default_workers_one_per_usable_core_at_most_one_per_run(monkeypatch):
    from malleable.sim import sweep

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert [sweep.default_workers(n) for n in (1, 2, 3, 8)] == [1, 2, 3, 3]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})  # e.g. a 1-CPU Slurm step
    assert sweep.default_workers(8) == 1


@pytest.mark.parametrize("args, message", [
    (["--workload", "/nonexistent/w.csv", "--policy", "pollux"],
     "--workload /nonexistent/w.csv: no such file"),
    (["--policy", "nosuch"], "--policy 'nosuch': unknown policy"),
    (["--policy", "Pollux"], "unknown policy (known: default, equi, fifo, gittins, hesrpt, las, "
                             "optimus, pollux, srpt, static); did you mean 'pollux'? Names are lower case"),
    (["--policy", "pollux", "--seed", "x"], "--seed 'x': not an integer"),
    (["--policy", "pollux", "--seed", "-1"], "--seed '-1': expected an integer >= 0"),
    (["--policy", "pollux", "--seed", "1,2,1"], "--seed '1': given twice"),
    (["--policy", "las,static,las"], "--policy 'las': given twice"),
    (["--policy", "static,,las"], "--policy 'static,,las': an empty name between commas"),
    (["--policy", "las", "--seed", "1,,2"], "--seed '1,,2': an empty seed between commas"),
    (["--policy", "las", "--seed", "1,"], "--seed '1,': an empty seed between commas"),
    (["--policy", "las", "--seed", ""], "--seed '': give at least one seed"),
    (["--workload", "/dev/null", "--policy", "las"],
     "--workload /dev/null: not a regular file (a character device)"),
    (["--workload", "a.csv,,b.csv", "--policy", "las"],
     "--workload 'a.csv,,b.csv': an empty path between commas"),
    (["--policy", "las", "--interval", "nan"], "Invalid value for '--interval': 'nan' is not a "
                                               "finite number"),
    (["--policy", "las", "--nodes", "200000"], "Invalid value for '--nodes': 200000 is not in "
                                               "the range 1<=x<=100000"),
    (["--policy", "las", "--restart-cost", "700000"], "Invalid value for '--restart-cost': "
                                                      "700000.0 is not in the range 0<=x<=604800"),
    (["--policy", "las", "--interval", "0.5"], "Invalid value for '--interval': 0.5 is not in "
                                               "the range 1<=x<=86400"),
    (["--policy", "las", "--load-scale", "inf"], "Invalid value for '--load-scale': 'inf'"),
    (["--policy", "las", "--max-time", "1e306"], "Invalid value for '--max-time': 1e+306 is "
                                                 "not in the range 0<x<=1000000"),
    (["--policy", "pollux", "--format", "philly"], "missing column(s)"),
    (["--policy", "las", "--policy-params", 'pollux={"p": -1}'],
     "'pollux' is not among --policy (las); its parameters would be unused"),
    (["--policy", "las", "--policy-params", "las"], "expected NAME=JSON for a policy of"),
    (["--policy", "las", "--policy-params", 'las={"starve_s": 60}', "--policy-params",
      'las={"continuous": true}'], "parameters of 'las' given twice (give them in one JSON "
                                    "object)"),
    # (JSON keeps the last of two equal keys silently: a new-user tester)
    (["--policy", "las", "--policy-params", 'las={"starve_s": 1, "starve_s": 2}'],
     """--policy-params 'las={"starve_s": 1, "starve_s": 2}': key 'starve_s' given twice"""),
    (["--policy", "pollux", "--compare-only"],
     "--compare-only rebuilds the comparison of the runs already in --out; it runs nothing, "
     "so --workload, --policy would be ignored"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, workload, args, message):
    if "--workload" not in args:
        args = ["--workload", str(workload), *args]
    res = simulate(*args, "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("malleable simulate: error:") and message in err, err


def test_malformed_trace_row_is_named_with_its_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(WORKLOAD + "ncf-3,120,ncf,two,32768\n")
    res = simulate("--workload", str(bad), "--policy", "las", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert f"{bad}:5: field num_replicas='two': not an integer" in res.stderr
    assert res.stderr.count("\n") == 1


def test_a_batch_smaller_than_its_gpus_is_refused_with_its_line(tmp_path):
    # cifar10 on 2 GPUs at batch 1 was checkpointed to 0 GPUs and held until --max-time
    # (exit 0); it is a row no data-parallel job can run.
    bad = tmp_path / "bad.csv"
    bad.write_text(WORKLOAD + "cifar10-3,100,cifar10,2,1\n")
    res = simulate("--workload", str(bad), "--policy", "static", "--max-time", "0.5",
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"malleable simulate: error: --workload {bad}:5: field "
                          f"batch_size='1': below num_replicas (2): data-parallel training "
                          f"needs at least one sample per GPU\n")
    assert not (tmp_path / "o").exists()


def test_jobs_waiting_when_the_run_stops_are_named_with_why(tmp_path):
    two = tmp_path / "two.csv"
    two.write_text("name,time,application,num_replicas,batch_size\n"
                   "cifar10-0,0,cifar10,4,512\ncifar10-1,10,cifar10,4,512\n")
    res = simulate("--workload", str(two), "--policy", "static", "--nodes", "1",
                   "--max-time", "0.1", "--no-plots", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "o" / "two" / "static" / "seed0" / "summary.json").read_text())
    held, running = s["unfinished_jobs"]
    assert running == {"jobs": 1, "names": ["cifar10-0"], "reason": "", "state": "running"}
    assert (held["state"], held["jobs"], held["names"]) == ("held", 1, ["cifar10-1"])
    assert "4 GPUs" in held["reason"], held   # (static: "waits: request of 4 GPUs does not fit")
    assert (f"malleable simulate: note: two/static/seed0: 1 job(s) waiting when the run "
            f"stopped: held: {held['reason']} (1: cifar10-1)\n") in res.stderr


def test_unusable_out_is_refused_before_any_run(tmp_path, workload):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, message in [(str(afile), "exists and is not a directory"),
                         (str(afile / "sub"), "cannot write there"), ("", "give a directory")]:
        res = simulate("--workload", str(workload), "--policy", "las", "--out", out)
        assert res.exit_code == 2, (out, res.output)
        assert f"--out {out or repr(out)}: {message}" in res.stderr
        assert "Traceback" not in res.output
    # A new directory (and its parents) is created.
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--no-plots", "--out", str(tmp_path / "new" / "deep"))
    assert res.exit_code == 0 and (tmp_path / "new" / "deep" / "tiny" / "las").is_dir()


def test_a_run_folder_that_cannot_be_written_is_refused_before_any_run(tmp_path, workload):
    """A file where a run's folder goes, or a folder the user may not write, failed that
    run when it ended (exit 1, "a run failed: [Errno 17] File exists") and the sweep's
    other runs never ran; it is now exit 2 before any run, naming the run and the path."""
    out = tmp_path / "out"
    (out / "tiny" / "static").mkdir(parents=True)
    (out / "tiny" / "static" / "seed0").write_text("x")
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (f"malleable simulate: error: --out {out}: run "
                                  f"tiny/static/seed0: {out}/tiny/static/seed0 exists and is "
                                  "not a directory (move it, or give another --out)")
    assert not (out / "tiny" / "las").exists()   # no run ran
    # A folder where one of a run's files, or the comparison, goes (Errno 21, exit 1).
    (out / "tiny" / "static" / "seed0").unlink()
    (out / "tiny" / "static" / "seed0" / "jobs.csv").mkdir(parents=True)
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 2 and res.stderr.strip() == (
        f"malleable simulate: error: --out {out}: run tiny/static/seed0: {out}/tiny/static/"
        "seed0/jobs.csv is a directory where a file goes (move it, or give another --out)")
    (out / "tiny" / "static" / "seed0" / "jobs.csv").rmdir()
    (out / "comparison.json").mkdir()
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 2 and res.stderr.strip() == (
        f"malleable simulate: error: --out {out}: the comparison: {out}/comparison.json is a "
        "directory where a file goes (move it, or give another --out)")
    assert not (out / "tiny" / "las").exists()
    # A folder the user may not write (root may write any: the command runs as nobody).
    base = Path(tempfile.mkdtemp(prefix="malleable-sim-out-", dir="/tmp"))
    try:
        shutil.copy(workload, base / "tiny.csv")
        (base / "out" / "tiny").mkdir(parents=True)
        for d in (base, base / "out"):
            d.chmod(0o777)
        (base / "out" / "tiny").chmod(0o555)
        cmd = [sys.executable, "-m", "malleable", "simulate", "--no-progress", "--workload",
               str(base / "tiny.csv"), "--policy", "las", "--nodes", "2", "--out",
               str(base / "out")]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "nobody", "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == (f"malleable simulate: error: --out {base}/out: run "
                                    f"tiny/las/seed0: cannot write in {base}/out/tiny (not "
                                    "writable by this user)")
    finally:
        shutil.rmtree(base)


def test_a_trace_without_jobs_is_refused_and_oversized_requests_are_noted(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("name,time,application,num_replicas,batch_size\n")
    res = simulate("--workload", str(empty), "--policy", "las", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert f"--workload {empty}: no job to simulate" in res.stderr
    big = tmp_path / "big.csv"
    big.write_text("name,time,application,num_replicas,batch_size\n"
                   "j0,0,cifar10,16,256\nj1,10,ncf,1,32768\n")
    res = simulate("--workload", str(big), "--policy", "static", "--nodes", "2", "--no-plots",
                   "--out", str(tmp_path / "b"))
    assert res.exit_code == 0
    assert (f"--workload {big}: 1 job(s) ask for more GPUs than the cluster's 8; they run "
            "on 8") in res.stderr


def test_bad_config_file_is_refused(tmp_path, workload):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\npoll_interval_s = 'soon'\n")
    res = simulate("--workload", str(workload), "--policy", "las", "--config", str(cfg),
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert "daemon.poll_interval_s" in res.stderr
    assert f"--config {cfg}: daemon.poll_interval_s = 'soon'" in res.stderr   # names the file


def test_command_line_entry_point(tmp_path, workload):
    """The installed entry: ``python -m malleable simulate`` in a fresh process."""
    proc = subprocess.run([sys.executable, "-m", "malleable", "simulate", "--workload",
                           str(workload), "--policy", "nosuch", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.startswith("malleable simulate: error: --policy 'nosuch'")


def test_slurm_array_tasks_take_the_sweeps_policy_parameters(tmp_path, workload):
    """Every task gets the sweep's --policy-params and --config; a task of another policy
    than theirs runs (it refused them: 'not among --policy'). Task 1 here, by bash."""
    cfg = tmp_path / "d.toml"
    cfg.write_text('[policy]\nname = "las"\nparams = {starve_s = 600.0}\n')
    out = tmp_path / "array"
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "2",
                   "--policy-params", 'las={"starve_s": 7200}', "--config", str(cfg),
                   "--max-time", "0.2", "--no-plots", "--out", str(out), "--slurm-array")
    assert res.exit_code == 0, res.stderr
    proc = subprocess.run(["bash", str(out / "simulate-array.sbatch")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert [p.parent.parent.name for p in out.glob("*/*/seed*/summary.json")] == ["static"]
    # --sweep-policies (the tasks' option) must include --policy.
    res = simulate("--workload", str(workload), "--policy", "las", "--sweep-policies", "static",
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "does not include --policy (las)" in res.stderr


@pytest.mark.slurm
def test_slurm_array_runs_the_sweep_on_a_real_cluster(tmp_path, workload, slurm):
    """The written job array runs on the harness's Slurm: one task per run, then the
    comparison job after them."""
    out = tmp_path / "array"
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "2",
                   "--policy-params", 'las={"starve_s": 7200}',
                   "--restart-cost", "30", "--no-plots", "--out", str(out), "--slurm-array")
    assert res.exit_code == 0, res.stderr
    script = out / "simulate-array.sbatch"
    assert "#SBATCH --array=0-1" in script.read_text()
    assert "sbatch --dependency=afterany:" in res.output
    env = {**slurm.env, "PYTHONPATH": str(ROOT)}
    jid = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                         text=True, check=True, timeout=30).stdout.strip().split(";")[0]
    subprocess.run(["sbatch", f"--dependency=afterany:{jid}",
                    str(out / "simulate-compare.sbatch")], env=env, capture_output=True,
                   text=True, check=True, timeout=30)
    wait_until(lambda: (out / "comparison.json").exists(), timeout=240,
               what="the comparison job's output")
    cmp = json.loads((out / "comparison.json").read_text())
    assert {(r["policy"], r["jobs_finished"]) for r in cmp["runs"]} == {("las", 3),
                                                                         ("static", 3)}
    assert not [p for p in out.glob("slurm-*.out") if "Traceback" in p.read_text()]
    assert os.access(script, os.X_OK)


@pytest.mark.parametrize("toml, args, message", [
    ("[policy]\nparams = {bogus = 1}\n", ["--policy", "pollux"],
     "[policy] name = 'default', params = {'bogus': 1}: policy pollux: unknown parameter 'bogus'"),
    ("[policy]\nname = \"nosuch\"\n", ["--policy", "pollux"], "unknown policy 'nosuch'"),
    ("[policy]\nname = \"hesrpt\"\nparams = {p = 0.5}\n", ["--policy", "las"],
     "[policy] params {'p': 0.5} are those of policy 'hesrpt', which is not among --policy "
     "(las); they would be unused")])
def test_config_policy_name_and_params_are_checked_before_any_run(tmp_path, workload, toml,
                                                                  args, message):
    cfg = tmp_path / "d.toml"
    cfg.write_text(toml)
    res = simulate("--workload", str(workload), *args, "--config", str(cfg), "--max-time", "0.5",
                   "--no-plots", "--no-comparison", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o" / "tiny").exists()


def test_config_params_go_to_their_policy_and_its_name_is_the_default_policy(tmp_path, workload):
    cfg = tmp_path / "d.toml"
    cfg.write_text("[policy]\nname = \"hesrpt\"\nparams = {p = 0.5}\n")
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "hesrpt,static", "--config",
                   str(cfg), "--nodes", "2", "--max-time", "0.5", "--no-plots", "--no-comparison",
                   "--out", str(out))
    assert res.exit_code == 0, res.output
    hes = json.loads((out / "tiny" / "hesrpt" / "seed0" / "summary.json").read_text())
    static = json.loads((out / "tiny" / "static" / "seed0" / "summary.json").read_text())
    assert hes["policy_params"] == {"p": 0.5} and static["policy_params"] == {}
    assert "unusable" not in res.output
    # No --policy: the config's [policy] name.
    out2 = tmp_path / "o2"
    res = simulate("--workload", str(workload), "--config", str(cfg), "--nodes", "2",
                   "--max-time", "0.5", "--no-plots", "--no-comparison", "--out", str(out2))
    assert res.exit_code == 0, res.output
    assert [p.name for p in (out2 / "tiny").iterdir() if p.is_dir()] == ["hesrpt"]


def test_an_alias_and_its_policy_are_one_policy(tmp_path, workload):
    res = simulate("--workload", str(workload), "--policy", "pollux,default", "--out",
                   str(tmp_path / "o"))
    assert res.exit_code == 2
    assert "'default' and 'pollux' are the same policy" in res.output


def test_arrivals_after_max_time_are_noted_and_an_idle_gap_is_quick(tmp_path):
    late = tmp_path / "late.csv"
    late.write_text("name,time,application,num_replicas,batch_size\n"
                    "j0,0,ncf,1,32768\nj1,1000000,ncf,1,32768\nj2,1e300,ncf,1,32768\n")
    res = simulate("--workload", str(late), "--policy", "static", "--nodes", "2",
                   "--no-plots", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    assert (f"--workload {late}: 1 job(s) arrive after --max-time (2880 h): they are never "
            "submitted and count as unfinished") in res.stderr
    summary = json.loads((tmp_path / "o" / "late" / "static" / "seed0" / "summary.json").read_text())
    # j0 and j1 ran (j1 after an empty cluster for ~11 days: those decide ticks are passed
    # over, not run); j2 never arrives.
    assert summary["jobs_finished"] == 2 and summary["decide_cycles"] < 100


# ----------------------------------------------------------------------------- comparison


def _summary(workload: str = "tiny", policy: str = "las", seed: int = 0, **changes) -> dict:
    """A summary.json as `sweep.write_run` writes it (the keys the comparison reads)."""
    s = {"workload": workload, "policy": policy, "seed": seed, "jobs": 2, "jobs_finished": 2,
         "all_finished": True, "avg_jct_s": 100.0, "median_jct_s": 100.0, "p99_jct_s": 150.0,
         "makespan_s": 300.0, "gpu_utilization": 0.5, "restarts_per_job": 0.0,
         "ftf_rho_avg": 1.0, "nodes": 16, "gpus_per_node": 4, "interval_s": 60.0,
         "restart_cost_s": None, "load_scale": 1.0, "job_setup": "auto", "window_days": None,
         "policy_params": {}, "settings": {"min_gain": 0.05, "cooldown_s": 300.0}}
    s.update(changes)
    return s


def _run_folder(out: Path, summary: dict | str, jobs_csv: str = "name,jct_s\na,50\nb,150\n",
                where: tuple[str, str, int] | None = None) -> Path:
    wl, pol, seed = where or (summary["workload"], summary["policy"], summary["seed"])
    d = out / wl / pol / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(summary if isinstance(summary, str)
                                    else json.dumps(summary))
    (d / "jobs.csv").write_text(jobs_csv)
    return d


@pytest.mark.parametrize("summary, jobs_csv, file, message", [
    ("{bad", None, "summary.json",
     "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    ("[]", None, "summary.json", "expected a JSON object, got list"),
    ("{}", None, "summary.json", "field workload=missing: expected a non-empty string"),
    (_summary(avg_jct_s="fast"), None, "summary.json",
     'field avg_jct_s="fast": expected a finite number or null'),
    (_summary(gpu_utilization=float("nan")), None, "summary.json",
     "field gpu_utilization=NaN: expected a finite number or null"),
    (_summary(jobs="2"), None, "summary.json", 'field jobs="2": expected an integer >= 0'),
    (_summary(seed=True), None, "summary.json", "field seed=true: expected an integer >= 0"),
    (_summary(policy=["las"]), None, "summary.json",
     'field policy=["las"]: expected a non-empty string'),
    (_summary(all_finished="yes"), None, "summary.json",
     'field all_finished="yes": expected true or false'),
    (_summary(nodes=float("inf")), None, "summary.json",
     "field nodes=Infinity: holds a number that is not finite"),
    ("[" * 100000, None, "summary.json", "not valid JSON (maximum recursion depth exceeded"),
    (_summary(policy="static"), None, "summary.json",
     "it is the run tiny/static/seed0, not that of its folder tiny/las/seed0 (a copied or "
     "renamed run folder)"),
    (_summary(), "name,jct_s\na,soon\n", "jobs.csv:2", "field jct_s='soon': not a finite number"),
    (_summary(), "name,end_s\na,5\n", "jobs.csv:1", "no jct_s column"),
])
def test_compare_only_skips_a_corrupt_run_folder_with_a_note(tmp_path, summary, jobs_csv, file,
                                                             message):
    out = tmp_path / "o"
    _run_folder(out, _summary(policy="static"))
    bad = _run_folder(out, summary, *([jobs_csv] if jobs_csv else []),
                      where=("tiny", "las", 0))
    res = simulate("--compare-only", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and res.exception is None
    notes = [line for line in res.stderr.splitlines() if "note:" in line]
    assert len(notes) == 1, res.stderr
    assert notes[0].startswith(f"malleable simulate: note: {bad / file}: {message}"), notes
    assert notes[0].endswith(": run folder skipped (not compared)")
    assert "1 run(s) compared" in res.stdout and "(1 run folder(s) skipped" in res.stdout
    cmp = json.loads((out / "comparison.json").read_text())
    assert [(r["policy"], r["avg_jct_s"]) for r in cmp["runs"]] == [("static", 100.0)]
    # comparison.json says so too (it had warnings [] with a folder skipped).
    assert cmp["warnings"] == [notes[0].removeprefix("malleable simulate: note: ")]


def test_compare_only_without_a_valid_run_is_one_error_line_and_exit_2(tmp_path):
    out = tmp_path / "o"
    res = simulate("--compare-only", "--out", str(out))   # nothing there: as before
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"malleable simulate: error: --out {out}: no run "
                                  "(*/*/seed*/summary.json) to compare")
    _run_folder(out, "[]", where=("tiny", "las", 0))
    res = simulate("--compare-only", "--out", str(out))
    assert res.exit_code == 2 and "Traceback" not in res.output
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert errors == [f"malleable simulate: error: --out {out}: no valid run to compare "
                      "(1 run folder(s) skipped: see the notes above)"]
    assert "summary.json: expected a JSON object, got list" in res.stderr
    assert not (out / "comparison.json").exists()


def test_a_sweep_into_a_folder_with_a_corrupt_run_compares_its_own_runs(tmp_path, workload):
    out = tmp_path / "o"
    bad = _run_folder(out, "{}", where=("tiny", "static", 0))
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert f"{bad / 'summary.json'}: field workload=missing" in res.stderr
    assert "(1 run folder(s) skipped: see the notes)" in res.stdout
    cmp = json.loads((out / "comparison.json").read_text())
    assert [r["policy"] for r in cmp["runs"]] == ["las"] and cmp["mixed_settings"] == []
    assert (bad / "summary.json").read_text() == "{}"   # left as it was


def test_runs_of_different_settings_compared_together_are_noted(tmp_path):
    out = tmp_path / "o"
    _run_folder(out, _summary(policy="static"))
    _run_folder(out, _summary(policy="static", seed=1))
    _run_folder(out, _summary(policy="las"))
    res = simulate("--compare-only", "--out", str(out))
    assert res.exit_code == 0 and "note:" not in res.stderr, res.output
    assert json.loads((out / "comparison.json").read_text())["mixed_settings"] == []
    _run_folder(out, _summary(policy="las", seed=1, nodes=2, policy_params={"starve_s": 5}))
    res = simulate("--compare-only", "--out", str(out))
    assert res.exit_code == 0, res.output
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["mixed_settings"] == [
        {"setting": "nodes", "policy": None,
         "values": [{"value": 16, "runs": ["tiny/las/seed0", "tiny/static/seed0",
                                           "tiny/static/seed1"]},
                    {"value": 2, "runs": ["tiny/las/seed1"]}]},
        {"setting": "policy_params", "policy": "las",
         "values": [{"value": {"starve_s": 5}, "runs": ["tiny/las/seed1"]},
                    {"value": {}, "runs": ["tiny/las/seed0"]}]}]
    nodes = ("comparison.json mixes runs made with different nodes: 16 (3 run(s): "
             "tiny/las/seed0, tiny/static/seed0, tiny/static/seed1); 2 (1 run(s): tiny/las/seed1)")
    assert cmp["warnings"][0] == nodes
    assert f"malleable simulate: note: {nodes}\n" in res.stderr
    assert ("note: comparison.json mixes runs of policy las made with different policy_params: "
            '{"starve_s": 5} (1 run(s): tiny/las/seed1); {} (1 run(s): tiny/las/seed0)'
            in res.stderr)


def test_format_oracle_work_and_max_time_are_recorded_and_compared(tmp_path, workload):
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "static", "--nodes", "2",
                   "--no-plots", "--out", str(out))
    assert res.exit_code == 0 and "note:" not in res.stderr, res.output
    summary = json.loads((out / "tiny" / "static" / "seed0" / "summary.json").read_text())
    assert (summary["format"], summary["map_models"], summary["oracle_work"],
            summary["max_time_s"]) == ("pollux", False, None, 2880 * 3600.0)
    # The same run with the format named: the same settings, nothing to say.
    res = simulate("--workload", str(workload), "--format", "pollux", "--policy", "static",
                   "--nodes", "2", "--no-plots", "--out", str(out))
    assert res.exit_code == 0 and "note:" not in res.stderr, res.output
    res = simulate("--workload", str(workload), "--policy", "las", "--nodes", "2",
                   "--oracle-work", "--max-time", "100", "--no-plots", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert ("comparison.json mixes runs made with different max_time_s: 10368000.0 (1 run(s): "
            "tiny/static/seed0); 360000.0 (1 run(s): tiny/las/seed0)") in res.stderr
    assert ("comparison.json mixes runs made with different oracle_work: null (1 run(s): "
            "tiny/static/seed0); true (1 run(s): tiny/las/seed0)") in res.stderr


def test_a_sweep_replacing_a_run_of_other_settings_says_so(tmp_path, workload):
    out = tmp_path / "o"
    res = simulate("--workload", str(workload), "--policy", "las,static", "--nodes", "4",
                   "--out", str(out))
    assert res.exit_code == 0 and "note:" not in res.stderr, res.output
    static = out / "tiny" / "static" / "seed0"
    assert (static / "plots" / "utilization.png").exists()
    res = simulate("--workload", str(workload), "--policy", "static", "--nodes", "2",
                   "--interval", "30", "--no-plots", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert (f"malleable simulate: note: --out {out}: this sweep replaces tiny/static/seed0 (1 "
            "run folder(s)), made with other settings: interval_s=60.0 (now 30.0), nodes=4 "
            "(now 2)\n") in res.stderr
    assert "comparison.json mixes runs made with different nodes: 2 (1 run(s): " \
        "tiny/static/seed0); 4 (1 run(s): tiny/las/seed0)" in res.stderr
    assert json.loads((static / "summary.json").read_text())["nodes"] == 2
    # The replaced run's plots went with it (this run drew none).
    assert not list((static / "plots").glob("*.png"))
    assert (out / "tiny" / "las" / "seed0" / "plots" / "utilization.png").exists()
    # The same settings again: nothing to say.
    res = simulate("--workload", str(workload), "--policy", "static", "--nodes", "2",
                   "--interval", "30", "--no-plots", "--no-comparison", "--out", str(out))
    assert res.exit_code == 0 and "replaces" not in res.stderr, res.output


def test_runs_of_same_named_traces_with_other_contents_are_warned(tmp_path, workload):
    """summary.json records the trace's SHA-256: runs compared under one workload name that
    read different files are a warning (comparison.json and stderr), and so is a sweep
    replacing a run made from another file of the same name."""
    other = tmp_path / "other" / "tiny.csv"
    other.parent.mkdir()
    lines = WORKLOAD.strip().splitlines()
    other.write_text("\n".join(lines[:-1]) + "\n")          # one job fewer
    out = tmp_path / "out"
    common = ("--nodes", "2", "--max-time", "0.2", "--no-plots", "--out", str(out))
    assert simulate("--workload", str(workload), "--policy", "static", *common).exit_code == 0
    res = simulate("--workload", str(other), "--policy", "las", *common)
    assert res.exit_code == 0, res.stderr
    s = json.loads((out / "tiny" / "las" / "seed0" / "summary.json").read_text())
    assert s["workload_sha256"] == hashlib.sha256(other.read_bytes()).hexdigest()
    warned = json.loads((out / "comparison.json").read_text())["warnings"]
    assert len(warned) == 1 and warned[0].startswith(
        "comparison.json mixes runs of workload 'tiny' made from different trace files")
    assert "tiny/las/seed0" in warned[0] and "tiny/static/seed0" in warned[0]
    assert "made from different trace files" in res.stderr
    res = simulate("--workload", str(workload), "--policy", "las", *common)
    assert "another trace file of the same name" in res.stderr, res.stderr
    assert json.loads((out / "comparison.json").read_text())["warnings"] == []


def test_rows_a_loader_leaves_out_are_noted(tmp_path):
    """sacct jobs that never started or still run are left out, with a note (the count
    was dropped: with every job left out, only 'no job to simulate' said anything)."""
    f = tmp_path / "sacct.txt"
    f.write_text(
        "JobID|JobName|Partition|Submit|Start|End|Elapsed|NNodes|AllocTRES|State|\n"
        "100|a|gpu|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:05:00|00:05:00|1|"
        "gres/gpu=4|COMPLETED|\n"
        "103|b|gpu|2024-03-01T11:05:00|Unknown|Unknown|00:00:00|1||CANCELLED by 0|\n"
        "104|c|gpu|2024-03-01T11:06:00|2024-03-01T11:07:00|Unknown|00:10:00|1|gres/gpu=1|"
        "RUNNING|\n")
    res = simulate("--workload", str(f), "--policy", "las", "--nodes", "2", "--max-time", "0.5",
                   "--no-plots", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    assert (f"malleable simulate: note: --workload {f}: 2 job(s) that never started or still "
            f"run left out") in res.stderr
    assert res.stderr.count("left out") == 1


def test_a_trace_directory_means_its_traces_not_its_readme(tmp_path, workload):
    d = tmp_path / "traces"
    d.mkdir()
    (d / "tiny.csv").write_text(WORKLOAD)
    (d / "README.txt").write_text("These traces come from ...\n")
    (d / "LICENSE.txt").write_text("CC-BY-4.0\n")
    res = simulate("--workload", str(d), "--policy", "static", "--nodes", "2", "--max-time",
                   "0.2", "--no-plots", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    assert [p.name for p in (tmp_path / "o").iterdir() if p.is_dir()] == ["tiny"]


def test_slurm_array_passes_a_trace_path_with_a_comma_whole(tmp_path):
    """A trace found in a directory, named with a comma: its array task ran
    `--workload /dir/a,b.csv`, which the command split into '/dir/a' and 'b.csv' (exit 2,
    'no such file'). The task now passes it with --workload-path; bash runs task 0 here."""
    d = tmp_path / "traces"
    d.mkdir()
    (d / "a,b.csv").write_text(WORKLOAD)
    out = tmp_path / "array"
    res = simulate("--workload", str(d), "--policy", "static", "--nodes", "2", "--max-time",
                   "0.2", "--no-plots", "--out", str(out), "--slurm-array")
    assert res.exit_code == 0, res.stderr
    script = out / "simulate-array.sbatch"
    # What bash hands the command: one argument, the whole path.
    fake = tmp_path / "argv.sh"
    fake.write_text("#!/bin/bash\nprintf '%s\\0' \"$@\"\n")
    fake.chmod(0o755)
    text = script.read_text().replace(f"exec {sys.executable} ", f"exec {fake} ")
    assert text != script.read_text()
    (tmp_path / "argv.sbatch").write_text(text)
    argv = subprocess.run(["bash", str(tmp_path / "argv.sbatch")], capture_output=True,
                          check=True, timeout=60,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": "0"}).stdout.split(b"\0")
    i = argv.index(b"--workload-path")
    assert argv[i + 1] == str(d.resolve() / "a,b.csv").encode()
    assert b"--workload" not in argv
    # And the task itself runs that trace.
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "SLURM_ARRAY_TASK_ID": "0",
                                         "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    s = json.loads((out / "a,b" / "static" / "seed0" / "summary.json").read_text())
    assert s["workload"] == "a,b" and s["jobs"] == 3


def test_a_path_with_a_comma_is_given_with_workload_path(tmp_path):
    f = tmp_path / "site,2024.csv"
    f.write_text(WORKLOAD)
    res = simulate("--workload", str(f), "--policy", "static", "--out", str(tmp_path / "o"),
                   "--slurm-array")
    assert res.exit_code == 2
    assert res.stderr == (f"malleable simulate: error: --workload {str(f)!r}: --workload splits "
                          f"its value at commas (into {str(tmp_path / 'site')!r}, '2024.csv'); "
                          "give a path with a comma with --workload-path\n")
    res = simulate("--workload-path", str(f), "--policy", "static", "--nodes", "2",
                   "--max-time", "0.2", "--no-plots", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "o" / "site,2024" / "static" / "seed0" / "summary.json").exists()
    res = simulate("--workload-path", str(tmp_path / "nope,x.csv"), "--policy", "static",
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and res.stderr == (
        f"malleable simulate: error: --workload-path {tmp_path / 'nope,x.csv'}: no such file\n")


def test_json_nested_too_deeply_is_refused_not_a_traceback(tmp_path, workload):
    """A trace, --policy-params or --config of deeply nested lists raised RecursionError
    (a traceback, exit code 1)."""
    f = tmp_path / "deep.json"
    f.write_text('{"jobs": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = simulate("--workload", str(f), "--policy", "static", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"malleable simulate: error: --workload {f}: JSON nested too "
                                 "deeply to read")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    deep = "[" * 20_000 + "]" * 20_000
    res = simulate("--workload", str(workload), "--policy", "static", "--policy-params",
                   f"static={deep}", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"malleable simulate: error: --policy-params {'static=' + '[' * 73!r}: "
                          "JSON nested too deeply to read (more than about "
                          f"{sys.getrecursionlimit()} levels)\n")
    toml = tmp_path / "deep.toml"
    toml.write_text("a = " + deep + "\n")
    res = simulate("--workload", str(workload), "--policy", "static", "--config", str(toml),
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"malleable simulate: error: --config {toml}: TOML nested too deeply "
                          f"to read\n")


def test_a_trace_none_of_whose_jobs_can_run_says_why(tmp_path):
    """Every job left out by the loader: the error said only 'no job to simulate (the trace
    has none, or none is left after the loader's filters)', and the note of what was left
    out was never printed."""
    swf = tmp_path / "log.swf"
    swf.write_text("1 0 5 100 -1 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n"
                   "2 10 5 100 -1 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n")
    res = simulate("--workload", str(swf), "--policy", "static", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert res.stderr == (f"malleable simulate: error: --workload {swf}: field alloc_procs=-1: "
                          "no job to simulate: the processor count (field 5, alloc_procs, and 8, "
                          "req_procs) is unknown (-1) on all 2 job(s) (the first on line 1)\n")
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(
        "JobID|Submit|Start|End|Elapsed|AllocTRES|State|\n"
        "103|2024-03-01T11:05:00|Unknown|Unknown|00:00:00||CANCELLED by 0|\n"
        "104|2024-03-01T11:06:00|2024-03-01T11:07:00|Unknown|00:10:00|gres/gpu=1|RUNNING|\n")
    res = simulate("--workload", str(sacct), "--policy", "static", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert res.stderr == (f"malleable simulate: error: --workload {sacct}: no job to simulate "
                          "(the loader's filters left none: 2 job(s) that never started or "
                          "still run left out)\n")


GAVEL = ("seed,vc,line_no,job_type,num_steps_arg,needs_data_dir,total_steps,arrival_time_s,"
         "scale_factor\n"
         "0,v,0,ResNet-18 (batch size 64),--num_steps,1,1000,0.0,1\n"
         "0,v,1,ResNet-18 (batch size 64),--num_steps,1,900000,30.0,1\n")


def test_gavel_seed_the_file_lacks_and_the_unused_total_steps_are_said(tmp_path):
    """A Gavel file holding seed 0 only: --seed 6 reads its seed 1, and the command said
    'no job to simulate (the trace has none, ...)'. A loaded Gavel trace is noted: its
    total_steps (here 1000 and 900000) do not set the jobs' work."""
    f = tmp_path / "gavel.csv"
    f.write_text(GAVEL)
    res = simulate("--workload", str(f), "--policy", "static", "--seed", "0,6",
                   "--out", str(tmp_path / "o"), "--slurm-array")
    assert res.exit_code == 2
    assert res.stderr.endswith(f"malleable simulate: error: --workload {f}: field seed=1: no "
                               "row of seed 1: the file's seeds are 0 (the run's seed 6 reads "
                               "the file's seed 6 % 5 = 1)\n")
    res = simulate("--workload", str(f), "--policy", "static", "--nodes", "1", "--no-plots",
                   "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    notes = [n for n in res.stderr.splitlines() if "total_steps" in n]
    assert notes == [f"malleable simulate: note: --workload {f}: Gavel's total_steps and the "
                     "job type's batch size are not used: each job trains its model's profile "
                     "(the same family's, e.g. Transformer -> bert) to the profile's target at "
                     "the profile's batch sizes, as a Philly job does whatever its duration "
                     "(docs/simulator.md, Traces)"]
    rows = list(csv.DictReader((tmp_path / "o" / "gavel" / "static" / "seed0" /
                                "jobs.csv").open()))
    assert [r["model"] for r in rows] == ["cifar10", "cifar10"]
    # Same model, GPUs and batch, 900 times the steps: the same training, alone on 1 GPU.
    assert float(rows[0]["jct_s"]) == pytest.approx(float(rows[1]["jct_s"]), rel=1e-6)


def test_slurm_array_keeps_a_percent_in_the_output_folder(tmp_path):
    """Slurm replaces %j, %A, ... in --output: a folder named "pct%j" got the job id in
    the log's path, a folder that does not exist (a new-user tester). "%%" is one "%"."""
    from malleable.sim.sweep import write_slurm_array

    out = tmp_path / "pct%j"
    array, compare = write_slurm_array(["/w/a.csv"], ["las"], [0], [], out)
    assert f"#SBATCH --output={tmp_path}/pct%%j/slurm-%A_%a.out\n" in array.read_text()
    assert f"#SBATCH --output={tmp_path}/pct%%j/slurm-compare-%j.out\n" in compare.read_text()
    # the commands themselves take the folder as it is
    assert f" --out {tmp_path}/pct%j" in array.read_text()
