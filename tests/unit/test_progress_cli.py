"""`malleable report ...`: the shell-friendly reporter writes what the Python one writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from malleable.cli import main
from malleable.progress.lines import LineValidator, ProgressRecord


def run(args, env):
    return CliRunner().invoke(main, ["report", *args], env=env)


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_shell_jobs_lifecycle(tmp_path):
    env = {"SLURM_JOB_ID": "31", "SLURM_ARRAY_JOB_ID": "30", "SLURM_ARRAY_TASK_ID": "4",
           "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2",
           "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}
    assert run(["started", "--step", "100", "--samples", "6400", "--batch", "64"],
               env).exit_code == 0
    assert run(["progress", "--step", "110", "--samples", "7040", "--metric", "0.5",
                "--grad-sqr", "1", "--grad-var", "2"], env).exit_code == 0
    assert run(["checkpointed", str(tmp_path / "ck")], env).exit_code == 0
    assert run(["finished"], env).exit_code == 0
    got = read(tmp_path / "30_4.jsonl")
    assert [g["event"] for g in got] == ["started", "progress", "checkpointed", "finished"]
    assert all(g["batch"] == 64 and g["gpus"] == 2 and g["restart"] == 1 for g in got)
    assert got[1]["metric"] == 0.5 and got[1]["grad_var"] == 2.0
    assert got[2]["step"] == 110 and got[2]["samples"] == 7040  # from the last line
    assert got[2]["path"] == str(tmp_path / "ck")
    assert got[3]["step"] == 110
    v = LineValidator("30_4")
    assert all(isinstance(v.feed(line, 2e9), ProgressRecord)
               for line in (tmp_path / "30_4.jsonl").read_bytes().splitlines())


def test_bad_input_exits_2_with_one_line(tmp_path):
    env = {"SLURM_JOB_ID": "5", "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}
    no_batch = run(["progress", "--step", "1", "--samples", "2"], env)
    assert no_batch.exit_code == 2
    assert no_batch.output.strip().splitlines() == [
        "malleable report: error: --batch: the global batch size is not known yet "
        "(give --batch or set MALLEABLE_BATCH_SIZE)"]
    outside = run(["started", "--batch", "4"], {"SLURM_JOB_ID": "", "SLURM_JOBID": "",
                                                "SLURM_ARRAY_JOB_ID": ""})
    assert outside.exit_code == 2 and "SLURM_JOB_ID is not set" in outside.output
    nan = run(["progress", "--step", "1", "--samples", "2", "--batch", "4", "--metric", "nan"],
              env)
    assert nan.exit_code == 2 and "not a finite number" in nan.output
    neg = run(["progress", "--step", "-1", "--samples", "2", "--batch", "4"], env)
    assert neg.exit_code == 2
    assert not (tmp_path / "5.jsonl").exists()


def test_unwritable_progress_file_exits_1(tmp_path):
    (tmp_path / "6.jsonl").symlink_to(tmp_path / "other")
    res = run(["started", "--batch", "4"], {"SLURM_JOB_ID": "6", "MALLEABLE_SPOOL": str(tmp_path)})
    assert res.exit_code == 1
    assert not (tmp_path / "other").exists()


def test_console_script(tmp_path):
    exe = Path(sys.executable).parent / "malleable"
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "8", "MALLEABLE_SPOOL": str(tmp_path)}
    proc = subprocess.run([str(exe), "report", "started", "--batch", "16"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert read(tmp_path / "8.jsonl")[0]["batch"] == 16


def line(step: int, *, event: str = "progress", restart: int = 0, job: str = "40",
         samples: int | None = None) -> bytes:
    doc = {"v": 1, "t": 1.7e9, "job": job, "event": event, "step": step,
           "samples": step * 8 if samples is None else samples, "gpus": 1, "nodes": 1,
           "batch": 8, "restart": restart}
    if event == "checkpointed":
        doc["path"] = "/scratch/40.ckpt"
    return (json.dumps(doc) + "\n").encode()


def step_env(tmp_path, restart: int = 0) -> dict:
    return {"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "", "SLURM_RESTART_COUNT": str(restart),
            "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}


def progress_at(step: int, env: dict, *extra: str):
    return run(["progress", "--step", str(step), "--samples", str(step * 8), *extra], env)


def ingested_steps(path: Path) -> list[int | str]:
    """What ingestion makes of the file: each line's step, or its rejection reason."""
    v = LineValidator("40")
    return [r.step if isinstance(r, ProgressRecord) else r.reason.value
            for r in (v.feed(x, 2e9) for x in path.read_bytes().splitlines())]


def test_progress_below_the_runs_last_step_is_refused_and_nothing_written(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    assert run(["started", "--batch", "8"], env).exit_code == 0
    assert progress_at(120, env).exit_code == 0
    before = path.read_bytes()
    res = progress_at(90, env)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        f"malleable report: error: --step=90: below step 120 of this run's last line in "
        f"{path} (the daemon would reject it as decreasing_step)"]
    assert path.read_bytes() == before
    # A checkpointed line counts too; and the step is that of the last line ingestion
    # accepts: a line it rejects (90 after 120, written by hand) does not lower it.
    path.write_bytes(before + line(130, event="checkpointed") + line(90))
    assert ingested_steps(path) == [0, 120, 130, "decreasing_step"]
    res = progress_at(100, env)
    assert res.exit_code == 2 and "below step 130 of this run's last line" in res.stderr
    # A large file: only its tail is read, and still decides.
    path.write_bytes(b"".join(line(s) for s in range(2000)))
    assert path.stat().st_size > 4 * 64 * 1024
    before = path.read_bytes()
    res = progress_at(1500, env)
    assert res.exit_code == 2 and "below step 1999 " in res.stderr
    assert path.read_bytes() == before


def test_progress_at_an_equal_or_higher_step_is_written(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    assert run(["started", "--step", "100", "--samples", "800", "--batch", "8"],
               env).exit_code == 0
    assert progress_at(100, env).exit_code == 0     # equal: ingestion accepts it
    assert progress_at(120, env).exit_code == 0
    assert progress_at(120, env).exit_code == 0
    assert ingested_steps(path) == [100, 100, 120, 120]


def test_a_new_restart_or_a_started_line_resets_the_step(tmp_path):
    path = tmp_path / "40.jsonl"
    run0, run1 = step_env(tmp_path, 0), step_env(tmp_path, 1)
    assert run(["started", "--batch", "8"], run0).exit_code == 0
    assert progress_at(120, run0).exit_code == 0
    assert progress_at(90, run1).exit_code == 0     # requeued: resumed from an older checkpoint
    res = progress_at(80, run1)                     # ... but within run 1 the step rises
    assert res.exit_code == 2 and "below step 90 " in res.stderr
    assert run(["started", "--step", "50", "--samples", "400"], run1).exit_code == 0
    assert progress_at(60, run1).exit_code == 0     # reloaded a checkpoint without a requeue
    assert ingested_steps(path) == [0, 120, 90, 50, 60]


def test_a_torn_last_line_or_an_empty_file_is_tolerated(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    path.write_bytes(b"")
    assert progress_at(5, env, "--batch", "8").exit_code == 0
    torn = line(120)[:40]                           # a writer died mid-line
    path.write_bytes(torn)
    assert progress_at(5, env, "--batch", "8").exit_code == 0
    path.write_bytes(line(120) + torn)
    res = progress_at(90, env)                      # the torn line is skipped, not fatal
    assert res.exit_code == 2 and "below step 120 " in res.stderr
    assert path.read_bytes() == line(120) + torn
    assert progress_at(130, env).exit_code == 0
