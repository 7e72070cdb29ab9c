"""`malleable replay` on the real harness: jobs arrive at compressed trace times with
their recipe (spec, initial size, emulator arguments) and run as emulated jobs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from malleable.replay import load_replay_log, recipe, replay, select
from malleable.sim.traces import load_pollux_workload
from malleable.slurm import connect
from malleable.slurm.records import JobState
from malleable.spec import parse_spec
from tests.helpers import wait_until

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "malleable/sim/data/pollux/workloads/workload-1.csv"


def test_replay_submits_at_compressed_arrivals_and_jobs_report(slurm, tmp_path):
    client = connect()
    jobs = select(load_pollux_workload(WORKLOAD), models=["ncf"], limit=2)
    recipes = [recipe(t, gpus_per_node=4, max_gpus=16, grace_s=20) for t in jobs]
    speedup = 2000.0  # the two ncf arrivals are ~1,000 trace seconds apart: ~0.5 s here
    spool = tmp_path / "spool"
    spool.mkdir()
    log = tmp_path / "replay.jsonl"
    env = (("MALLEABLE_EXAMPLES", str(ROOT / "examples")), ("MALLEABLE_PYTHON", sys.executable),
           ("MALLEABLE_CKPT_DIR", str(tmp_path / "ckpt")))
    recs = replay(client, recipes, script=str(ROOT / "examples/emulated_job.sbatch"),
                  speedup=speedup, spool_dir=str(spool), gpus_per_node=4, log_path=str(log),
                  extra_env=env, workdir=str(tmp_path))
    assert load_replay_log(log) == recs and len(recs) == 2
    gap = recs[1]["submitted_at"] - recs[0]["submitted_at"]
    expected = (jobs[1].arrival_s - jobs[0].arrival_s) / speedup
    assert expected - 0.05 <= gap <= expected + 2.0
    for rec, rj in zip(recs, recipes, strict=True):
        sj = client.job(rec["job_id"])
        assert sj is not None and sj.requeueable
        assert parse_spec(sj.comment) == rj.spec
        assert sj.gpus == rj.initial_gpus
        # The emulated job runs and reports through the spool, at its recipe's batch.
        path = spool / f"{rec['job_id']}.jsonl"
        first = wait_until(lambda p=path: p.exists() and [
            json.loads(x) for x in p.read_text().splitlines() if '"progress"' in x],
            timeout=60, what=f"progress of {rec['job_id']}")
        assert first[0]["batch"] == rj.batch and first[0]["gpus"] == rj.initial_gpus
    client.cancel(recs[0]["job_id"])
    wait_until(lambda: client.job(recs[0]["job_id"]).state != JobState.RUNNING, timeout=30,
               what="cancelled")
