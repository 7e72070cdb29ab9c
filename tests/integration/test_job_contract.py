"""The job contract end to end on the real Slurm harness, through the Slurm port.

Each example job starts at 2 "GPUs", receives the checkpoint signal through
`SlurmClient.signal` (the batch shell traps it and forwards it), checkpoints
and logs ``checkpointed``; the test then requeues it at 4 GPUs exactly as the
daemon's actuator does (requeue_hold, resize_pending, start_now, release), and
the job resumes from its checkpoint and finishes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from malleable.progress.reporter import read_checkpoint
from malleable.slurm import connect
from malleable.slurm.records import JobState, SignalTarget, SubmitRequest
from malleable.spec import parse_spec
from tests.helpers import wait_until

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SPEEDUP = 30


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def job_env(tmp_path: Path, job_args: str) -> tuple[tuple[str, str], ...]:
    return (("MALLEABLE_EXAMPLES", str(EXAMPLES)), ("MALLEABLE_PYTHON", sys.executable),
            ("MALLEABLE_SPOOL", str(tmp_path / "spool")),
            ("MALLEABLE_CKPT_DIR", str(tmp_path / "ckpt")), ("JOB_ARGS", job_args))


def requeue_at(client, job_id: str, nodes: int, gpus_per_node: int) -> None:
    """What the actuator does after the job's ``checkpointed`` event."""
    client.requeue_hold(job_id)
    wait_until(lambda: (j := client.job(job_id)) is not None and j.state == JobState.PENDING,
               what=f"{job_id} requeued and held")
    client.resize_pending(job_id, nodes, gpus_per_node)
    client.start_now(job_id)
    client.release(job_id)


def run_to_checkpoint(client, job_id: str, progress: Path, min_step: int,
                      timeout: float = 90) -> dict:
    """Wait until the job runs and has logged ``min_step``; signal it; return its
    ``checkpointed`` line."""
    wait_until(lambda: any(x["event"] == "progress" and x["step"] >= min_step
                           for x in lines(progress)),
               timeout=timeout, what=f"{job_id} past step {min_step}")
    client.signal(job_id, "USR1", SignalTarget.BATCH)
    return wait_until(lambda: next((x for x in lines(progress) if x["event"] == "checkpointed"),
                                   None), timeout=60, what=f"{job_id} checkpointed")


def test_torch_job_resumes_at_four_gpus_from_its_checkpoint(slurm, tmp_path):
    client = connect()
    target = 160
    req = SubmitRequest(script=str(EXAMPLES / "torch_job.sbatch"), nodes=1, gpus_per_node=2,
                        comment="malleable:gpus=1-4,grace=60,batch=64,target_steps=160",
                        output=str(tmp_path / "torch-%j.out"), workdir=str(tmp_path),
                        env=job_env(tmp_path, f"--steps {target} --step-sleep 0.03 "
                                              f"--log-every 5"))
    job_id = client.submit(req)
    progress = tmp_path / "spool" / f"{job_id}.jsonl"
    first = client.job(job_id)
    assert first.requeueable and parse_spec(first.comment).max_gpus == 4

    ck = run_to_checkpoint(client, job_id, progress, min_step=30)
    assert ck["gpus"] == 2 and ck["restart"] == 0
    import torch  # the examples extra; only needed to read the checkpoint's loss
    saved = torch.load(io.BytesIO(read_checkpoint(ck["path"])), weights_only=True)
    assert saved["step"] == ck["step"]
    requeue_at(client, job_id, nodes=1, gpus_per_node=4)

    done = wait_until(lambda: next((x for x in lines(progress) if x["event"] == "finished"),
                                   None), timeout=120, what=f"{job_id} finished")
    got = lines(progress)
    before = [x for x in got if x["restart"] == 0 and x["event"] == "progress"]
    after = [x for x in got if x["restart"] == 1]
    assert after[0]["event"] == "started"
    assert (after[0]["step"], after[0]["samples"], after[0]["gpus"]) == \
        (ck["step"], ck["samples"], 4)
    resumed = [x for x in after if x["event"] == "progress"]
    assert resumed[0]["step"] > ck["step"] and all(x["gpus"] == 4 for x in resumed)
    # The loss continues from the checkpoint, not from the initial loss (~ln 10 = 2.3).
    initial = before[0]["metric"]
    assert abs(resumed[0]["metric"] - saved["loss"]) < 0.25 * initial
    assert resumed[0]["metric"] < initial - 0.3
    assert done["step"] == target and done["samples"] == target * 64
    out = (tmp_path / f"torch-{job_id}.out").read_text()
    assert f"start at step {ck['step']} on 4 processes" in out
    assert "restart 0" in out   # --open-mode=append kept the first run's output
    final = wait_until(lambda: (j := client.job(job_id)) and j.state.finished and j,
                       what=f"{job_id} completed")
    assert final.state == JobState.COMPLETED and final.restart_count == 1


def throughput(run: list[dict]) -> float:
    """Samples per emulated second over a run's progress lines."""
    prog = [x for x in run if x["event"] == "progress"]
    assert len(prog) >= 3, prog
    return (prog[-1]["samples"] - prog[0]["samples"]) / (prog[-1]["t"] - prog[0]["t"]) / SPEEDUP


def test_emulated_job_throughput_follows_the_profile_across_a_requeue(slurm, tmp_path):
    from malleable.sim.profiles import load_profile

    profile = load_profile("cifar10")
    client = connect()
    config = tmp_path / "malleable.toml"
    config.write_text(f'[progress]\nspool_dir = "{tmp_path / "spool"}"\n')
    env = {**os.environ, **dict(job_env(tmp_path, "--target-steps 1600 --log-every 15"))}
    # Submitted with `malleable submit`: spec from the options, initial size 2 GPUs.
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "malleable"), "submit", "--config", str(config),
         "--gpus", "2-8", "--step", "2", "--batch", "512", "--model", "cifar10",
         "--grace", "30", "--initial-gpus", "2", "-o", str(tmp_path / "em-%j.out"),
         str(EXAMPLES / "emulated_job.sbatch")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    job = client.job(job_id)
    assert job.requeueable and job.gpus == 2 and job.node_count == 1
    spec = parse_spec(job.comment)
    assert (spec.min_gpus, spec.max_gpus, spec.step, spec.batch_size, spec.model) == \
        (2, 8, 2, 512, "cifar10")
    progress = tmp_path / "spool" / f"{job_id}.jsonl"

    ck = run_to_checkpoint(client, job_id, progress, min_step=250)
    requeue_at(client, job_id, nodes=1, gpus_per_node=4)
    done = wait_until(lambda: next((x for x in lines(progress) if x["event"] == "finished"),
                                   None), timeout=120, what=f"{job_id} finished")
    got = lines(progress)
    run0 = [x for x in got if x["restart"] == 0 and x["step"] <= ck["step"]]
    run1 = [x for x in got if x["restart"] == 1]
    assert run1[0]["event"] == "started" and run1[0]["step"] == ck["step"]
    assert all(x["batch"] == 512 for x in got)   # MALLEABLE_BATCH_SIZE from the spec
    x2, x4 = throughput(run0), throughput(run1)
    p2, p4 = profile.throughput(2, 1, 512), profile.throughput(4, 1, 512)
    assert x2 == pytest.approx(p2, rel=0.15)
    assert x4 == pytest.approx(p4, rel=0.15)
    assert x4 / x2 == pytest.approx(p4 / p2, rel=0.15)
    assert done["step"] == 1600


def test_a_shell_job_reports_with_malleable_report(slurm, tmp_path):
    """A non-Python array task: `malleable report` reads the same Slurm environment."""
    script = tmp_path / "shell.sbatch"
    exe = Path(sys.executable).parent / "malleable"
    script.write_text("#!/bin/bash\n"
                      f"{exe} report started --batch 8\n"
                      f"{exe} report progress --step 5 --samples 40 --metric 0.5\n"
                      f"{exe} report checkpointed ck.bin\n"
                      f"{exe} report finished\n")
    client = connect()
    job_id = client.submit(SubmitRequest(
        script=str(script), nodes=1, gpus_per_node=2, comment="malleable:gpus=2",
        workdir=str(tmp_path), output=str(tmp_path / "shell-%A_%a.out"),
        extra_args=("--array=7",), env=(("MALLEABLE_SPOOL", str(tmp_path / "spool")),)))
    progress = tmp_path / "spool" / f"{job_id}_7.jsonl"
    got = wait_until(lambda: (x := lines(progress)) and x[-1]["event"] == "finished" and x,
                     timeout=60, what="the shell job's finished line")
    assert [x["event"] for x in got] == ["started", "progress", "checkpointed", "finished"]
    assert all(x["job"] == f"{job_id}_7" and x["gpus"] == 2 and x["batch"] == 8
               and x["restart"] == 0 for x in got)
    assert got[2]["path"] == str(tmp_path / "ck.bin") and got[2]["step"] == 5


def test_submit_refused_by_slurm_exits_1_with_slurms_message(slurm, tmp_path):
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "malleable"), "submit", "--gpus", "1-4",
         "-p", "no-such-partition", str(EXAMPLES / "torch_job.sbatch")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines_ = proc.stderr.strip().splitlines()
    assert len(lines_) == 1 and "partition" in lines_[0].lower(), proc.stderr


def test_submit_dry_run_prints_the_sbatch_command_line(slurm, tmp_path):
    """--dry-run printed a Python repr of the request; now the command it would run."""
    import shlex

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "malleable"), "submit", "--dry-run", "--gpus",
         "2-8", "--batch", "256", "--initial-gpus", "2", "--job-name=a b",
         str(EXAMPLES / "emulated_job.sbatch")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    start = argv.index("sbatch")
    assert argv[:1] == ["env"] or start == 0
    assert "--gres=gpu:2" in argv and "--requeue" in argv and "--job-name=a b" in argv
    comment = next(a for a in argv if a.startswith("--comment="))
    assert "malleable:" in comment and "gpus=2-8" in comment
    assert argv[-1] == str(EXAMPLES / "emulated_job.sbatch")
    assert "SubmitRequest(" not in proc.stdout
