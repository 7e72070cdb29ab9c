"""`malleable replay`'s pure parts: the trace-job recipe, the subset, the CLI's bad input."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.replay import legal_gpus, recipe, select
from malleable.sim.traces import TraceJob
from malleable.spec import format_spec, parse_spec
from malleable.submit import initial_shape

WORKLOAD = "malleable/sim/data/pollux/workloads/workload-1.csv"


def test_legal_gpus_rounds_down_to_one_node_or_whole_nodes():
    assert [legal_gpus(k, 4, 16) for k in (1, 3, 4, 6, 8, 12, 16, 32)] == \
        [1, 3, 4, 4, 8, 12, 16, 16]
    assert legal_gpus(0, 4, 16) == 1 and legal_gpus(9, 8, 64) == 8


def test_recipe_uses_the_profile_and_the_trace():
    t = TraceJob(name="cifar10-0", arrival_s=107.0, gpus=6, model="cifar10", batch_size=2048)
    # Default: the job tunes its batch itself; m0 is the model's smallest batch (128).
    r = recipe(t, gpus_per_node=4, max_gpus=16, grace_s=30)
    assert r.initial_gpus == 4 and r.batch == 2048 and r.model == "cifar10" and r.adaptive_batch
    s = r.spec
    assert (s.min_gpus, s.max_gpus, s.batch_size, s.max_batch_size, s.max_local_batch_size,
            s.model, s.grace_s, s.shrink_inplace) == (1, 16, 128, 4096, 1024, "cifar10", 30.0,
                                                      False)
    assert parse_spec(format_spec(s)) == s
    # Fixed batch: the trace's batch is m0.
    f = recipe(t, gpus_per_node=4, max_gpus=16, grace_s=30, adaptive_batch=False)
    assert not f.adaptive_batch and (f.spec.batch_size, f.spec.max_batch_size) == (2048, 4096)
    # BERT at its trace batch 384 cannot fit 12 per GPU on 16 GPUs: no memory limit.
    bert = recipe(TraceJob(name="bert-1", arrival_s=0.0, gpus=8, model="bert", batch_size=384),
                  gpus_per_node=4, max_gpus=16, adaptive_batch=False)
    assert bert.spec.batch_size == 384 and bert.spec.max_local_batch_size is None
    # The limit is judged on the size submitted: 4096 on 2 GPUs is 2048 per GPU, over
    # cifar10's 1024, so the job accumulates and can start on its 2 GPUs.
    two = recipe(TraceJob(name="c-2", arrival_s=0.0, gpus=2, model="cifar10", batch_size=4096),
                 gpus_per_node=4, max_gpus=16, adaptive_batch=False)
    assert two.spec.max_local_batch_size is None
    assert initial_shape(two.spec, two.initial_gpus, 4) == (1, 2)
    assert f.spec.max_local_batch_size == 1024   # 2048 on 4 GPUs: 512 each


def test_recipe_refuses_a_job_without_profile():
    t = TraceJob(name="x", arrival_s=0.0, gpus=1, model=None, duration_s=60.0)
    try:
        recipe(t, gpus_per_node=4, max_gpus=16)
    except ValueError as exc:
        assert "x" in str(exc) and "no profile" in str(exc)
    else:
        raise AssertionError("a job without a model must be refused")


def test_select_filters_thins_and_limits_in_arrival_order():
    jobs = [TraceJob(f"j{i}", float(100 - i), 1, "ncf" if i % 2 else "bert") for i in range(10)]
    out = select(jobs, models=["ncf"], every=2, limit=2)
    assert [j.name for j in out] == ["j9", "j5"]
    assert [j.name for j in select(jobs, until_s=93)] == ["j9", "j8"]


def test_cli_dry_run_offline_and_bad_input():
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "2",
                                  "--gpus-per-node", "4", "--nodes", "4", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert '"name": "cifar10-0"' in r.output and "malleable:gpus=1-16" in r.output
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--models", "gpt9",
                                  "--gpus-per-node", "4", "--nodes", "4", "--dry-run"])
    assert r.exit_code == 2 and "gpt9" in r.output
    r = CliRunner().invoke(main, ["replay", "--workload", "/nonexistent.csv"])
    assert r.exit_code == 2 and "/nonexistent.csv" in r.output


def test_cli_names_a_missing_default_script_as_relative(tmp_path, monkeypatch):
    workload = os.path.abspath(WORKLOAD)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["replay", "--workload", workload, "--limit", "2",
                                  "--gpus-per-node", "4", "--nodes", "4"])
    assert r.exit_code == 2
    assert "--script examples/emulated_job.sbatch: no such file (the default is relative" in r.output
    r = CliRunner().invoke(main, ["replay", "--workload", workload, "--script", "x.sbatch",
                                  "--gpus-per-node", "4", "--nodes", "4"])
    assert r.exit_code == 2 and "--script x.sbatch: no such file" in r.output
    assert "relative" not in r.output
    # A dry run submits nothing: it prints the recipes and warns (a helper outside the
    # checkout could not see them).
    r = CliRunner().invoke(main, ["replay", "--workload", workload, "--limit", "2",
                                  "--gpus-per-node", "4", "--nodes", "4", "--dry-run"])
    assert r.exit_code == 0 and '"name": "cifar10-0"' in r.stdout
    assert "malleable replay: warning: --script examples/emulated_job.sbatch: no such file " \
        "(the default is relative" in r.stderr


def test_a_trace_without_jobs_is_bad_input(tmp_path):
    empty = tmp_path / "w.csv"
    empty.write_text("name,time,application,num_replicas,batch_size\n")
    r = CliRunner().invoke(main, ["replay", "--workload", str(empty), "--gpus-per-node", "4",
                                  "--nodes", "4", "--dry-run"])
    assert r.exit_code == 2
    assert f"--workload {empty}: no job to replay (the trace has none)" in r.output


@pytest.mark.parametrize("opt, value, message", [
    ("--grace", "1e30", "--grace: malleable spec: grace=1e+30: too large"),
    ("--max-gpus", "99999999999999999999", "--max-gpus: malleable spec: gpus=99999999999999999999: "
                                           "too large"),
    ("--speedup", "inf", "Invalid value for '--speedup'")])
def test_cli_refuses_values_no_spec_can_hold_with_exit_2(opt, value, message):
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "2",
                                  "--gpus-per-node", "4", "--nodes", "4", "--dry-run", opt, value])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["--speedup", "nan"], "Invalid value for '--speedup': 'nan' is not a finite number"),
    (["--until", "nan"], "Invalid value for '--until': 'nan' is not a finite number"),
    (["--grace", "nan"], "Invalid value for '--grace': 'nan' is not a finite number"),
    (["--script", "/tmp"], "--script /tmp: a directory, not a batch script")])
def test_cli_refuses_nan_and_a_directory_script(args, message):
    dry = [] if args[0] == "--script" else ["--dry-run"]   # (a dry run only warns)
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "1",
                                  "--gpus-per-node", "4", "--nodes", "4", *dry, *args])
    assert r.exit_code == 2 and message in r.output, r.output


@pytest.mark.parametrize("given, missing", [("--gpus-per-node", "--nodes"),
                                            ("--nodes", "--gpus-per-node")])
def test_offline_dry_run_needs_both_cluster_sizes(given, missing):
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "1", "--dry-run",
                                  given, "4"])
    assert r.exit_code == 2
    assert f"{given} without {missing}: an offline --dry-run needs both" in r.output


@pytest.mark.parametrize("args, message", [
    (["--gpus-per-node", "2000", "--nodes", "4"], "'--gpus-per-node': 2000 is not in the range"),
    (["--gpus-per-node", "4", "--nodes", "9223372036854775807"], "'--nodes'")])
def test_cluster_sizes_are_bounded_like_simulate(args, message):
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "1", "--dry-run",
                                  *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert "--max-gpus" not in r.output


def test_max_gpus_above_the_cluster_is_noted():
    args = ["replay", "--workload", WORKLOAD, "--limit", "1", "--dry-run", "--gpus-per-node",
            "4", "--nodes", "2"]
    r = CliRunner().invoke(main, [*args, "--max-gpus", "64"])
    assert r.exit_code == 0, r.output
    assert ("malleable replay: note: --max-gpus 64 is above the cluster's 8 GPUs (2 node(s) "
            "x 4): no job gets more than 8\n") in r.stderr
    assert "malleable:gpus=1-64" in r.stdout   # the spec keeps what was asked
    r = CliRunner().invoke(main, [*args, "--max-gpus", "8"])
    assert r.exit_code == 0 and "note:" not in r.stderr, r.output


def test_a_dry_run_without_a_cluster_says_how_to_run_offline(tmp_path):
    """No Slurm to ask (here: no Slurm command on PATH): exit 1 as for any Slurm
    failure, and the line says how to run the dry run offline."""
    r = CliRunner().invoke(main, ["replay", "--workload", WORKLOAD, "--limit", "1",
                                  "--dry-run"], env={"PATH": str(tmp_path), "SLURM_CONF": ""})
    assert r.exit_code == 1, r.output
    assert r.output.strip().endswith("; without a cluster, give --nodes and --gpus-per-node "
                                     "for an offline --dry-run")
