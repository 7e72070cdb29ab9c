"""Only a complete checkpoint is ever loaded: the emulated job killed during a save.

The emulator runs as a plain local process here (no Slurm needed to deliver a
SIGKILL); tests/integration/test_job_contract.py runs the same job under Slurm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from malleable.progress.reporter import read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "examples" / "emulated_job.py"


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_killed_mid_save_resumes_from_the_previous_checkpoint(tmp_path):
    spool, ckpt = tmp_path / "spool", tmp_path / "em.ckpt"
    env = {**os.environ, "SLURM_JOB_ID": "71", "SLURM_GPUS_ON_NODE": "2",
           "SLURM_JOB_NUM_NODES": "1", "MALLEABLE_SPOOL": str(spool)}
    env.pop("SLURM_RESTART_COUNT", None)
    argv = [sys.executable, str(EMULATOR), "--model", "cifar10", "--checkpoint", str(ckpt),
            "--speedup", "1000", "--batch", "512", "--save-s", "0"]
    proc = subprocess.Popen(argv + ["--target-steps", "100000", "--checkpoint-every-steps",
                                    "200", "--slow-save", "0.5"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        # The first periodic save completes; kill the process inside the second one.
        seen = []
        for line in proc.stdout:
            seen.append(line.strip())
            if line.startswith("saving") and any("checkpointed at step 200" in s for s in seen):
                break
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert any(s.startswith("checkpointed at step 200") for s in seen), seen
    assert json.loads(read_checkpoint(ckpt))["step"] == 200      # the torn save is not seen
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # it was under way
    progress = spool / "71.jsonl"
    assert max(e["step"] for e in events(progress)) >= 400        # trained past the checkpoint

    env["SLURM_RESTART_COUNT"] = "1"
    out = subprocess.run(argv + ["--target-steps", "300"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    after = [e for e in events(progress) if e["restart"] == 1]
    assert after[0]["event"] == "started"
    assert (after[0]["step"], after[0]["samples"]) == (200, 200 * 512)
    assert after[-1]["event"] == "finished" and after[-1]["step"] == 300
    assert json.loads(read_checkpoint(ckpt))["step"] == 300


def test_adaptive_batch_follows_the_profiles_goodput_optimal_batch(tmp_path):
    # --adaptive-batch: the emulator tunes its batch as AdaptDL does (the profile's
    # goodput-optimal batch for its placement), whatever --batch and the plan say.
    from malleable.sim.profiles import load_profile

    spool = tmp_path / "spool"
    env = {**os.environ, "SLURM_JOB_ID": "72", "SLURM_GPUS_ON_NODE": "2",
           "SLURM_JOB_NUM_NODES": "1", "MALLEABLE_SPOOL": str(spool)}
    env.pop("SLURM_RESTART_COUNT", None)
    out = subprocess.run([sys.executable, str(EMULATOR), "--model", "cifar10", "--checkpoint",
                          str(tmp_path / "em.ckpt"), "--speedup", "1000", "--batch", "1024",
                          "--adaptive-batch", "--target-steps", "400"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = events(spool / "72.jsonl")
    want = load_profile("cifar10").best_batch((2,), 0.0)
    assert want != 1024
    assert lines[0]["event"] == "started" and lines[0]["batch"] == want
    assert all(e["batch"] == want for e in lines if e["event"] == "progress")
