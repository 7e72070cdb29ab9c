"""The resize path on a real Slurm, with raw Slurm commands (DESIGN.md section 6).

This is the foundation's proof that the harness behaves like a real cluster for
everything malleable does: allocate GPUs across nodes, shrink a running job in
place, requeue-hold, resize the pending job, clear the begin-time delay,
release, and see it restart at the new size. The Slurm port wraps these same
commands (tests/integration/test_slurm_port.py).

Note on counting GPUs: without slurmdbd, Slurm 22.05 leaves gres/gpu out of a
job's allocated TRES string (and refuses AccountingStorageTRES=gres/gpu), so
the allocated GPUs are read from the per-node allocated GRES (`gres_detail`
in squeue --json, `GRES=` in scontrol show job -d).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.slurm


def job_json(slurm, job_id: str) -> dict | None:
    doc = json.loads(slurm.run("squeue", "--json").stdout)
    return next((j for j in doc["jobs"] if str(j["job_id"]) == job_id), None)


def allocated_gpus(job: dict) -> int:
    """Sum of allocated GPUs over nodes, e.g. ['gpu:4(IDX:0-3)', 'gpu:4(IDX:0-3)'] -> 8."""
    return sum(int(m.group(1)) for d in job["gres_detail"]
               for m in [re.match(r"gpu(?::[^:(]+)?:(\d+)", d)] if m)


def state_is(slurm, job_id: str, state: str, **fields):
    def check():
        j = job_json(slurm, job_id)
        if j and j["job_state"] == state and all(j.get(k) == v for k, v in fields.items()):
            return j
        return None
    return check


def test_submit_shrink_requeue_resize_release(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho start restart=${SLURM_RESTART_COUNT:-0}\nsleep 600\n")
    out = slurm.run("sbatch", "--parsable", "-N", "2", "--gres=gpu:4", "--requeue",
                    "--open-mode=append", "-o", str(tmp_path / "job-%j.out"),
                    "-D", str(tmp_path), str(script)).stdout
    job_id = out.strip().split(";")[0]

    j = wait_until(state_is(slurm, job_id, "RUNNING"), what="job RUNNING")
    assert j["node_count"] == 2
    assert allocated_gpus(j) == 8
    assert j["restart_cnt"] == 0

    # Shrink in place: a running job can release nodes.
    slurm.run("scontrol", "update", f"JobId={job_id}", "NumNodes=1")
    j = wait_until(state_is(slurm, job_id, "RUNNING", node_count=1), what="shrunk to 1 node")
    assert allocated_gpus(j) == 4

    # Requeue-hold: the job goes back to PENDING, held.
    slurm.run("scontrol", "requeuehold", job_id)
    j = wait_until(state_is(slurm, job_id, "PENDING"), what="requeued and held")
    assert j["priority"] == 0 or "held" in j["state_reason"].lower()

    # Resize the pending job: a bare node count is refused on 22.05, a range is accepted.
    refused = slurm.run("scontrol", "update", f"JobId={job_id}", "NumNodes=3", check=False)
    assert refused.returncode != 0
    slurm.run("scontrol", "update", f"JobId={job_id}", "NumNodes=3-3", "TresPerNode=gres:gpu:2")
    slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
    slurm.run("scontrol", "release", job_id)

    j = wait_until(state_is(slurm, job_id, "RUNNING", node_count=3), timeout=60,
                   what="running again on 3 nodes")
    assert allocated_gpus(j) == 6
    assert j["restart_cnt"] == 1
    log = wait_until(lambda: "restart=1" in (tmp_path / f"job-{job_id}.out").read_text()
                     and (tmp_path / f"job-{job_id}.out").read_text(), what="second start logged")
    assert "restart=0" in log  # --open-mode=append kept the first run's output
