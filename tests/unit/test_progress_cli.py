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
