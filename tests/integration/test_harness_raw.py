"""The resize path on the real Slurm 22.05 harness, through the Slurm port (DESIGN.md section 6).

The foundation's proof that the harness behaves like a real cluster for
everything malleable does, now driven by `CliSlurmClient` instead of raw
commands, and extended with 22.05's own behaviour:

* a running 2-node, 8-GPU job shrinks in place to 1 node; a second shrink of the
  same job is refused by 22.05 ("Job update not available right now, the DB
  index is being set", fixed upstream in 23.11.5) and surfaces as `SlurmRejected`;
* requeue-hold, resize the pending job to 3 nodes x 2 GPUs, clear the begin-time
  delay, release: it restarts on 3 nodes with 6 GPUs, restart count 1, and
  ``--open-mode=append`` kept the first run's output;
* a signal to the batch shell reaches only the shell, to the steps only the
  steps, ``full`` both (each traps USR1 and appends to a marker file);
* requeue of a job submitted with ``--no-requeue`` is refused with Slurm's
  "Requested operation is presently disabled".

Counting GPUs: without slurmdbd, 22.05 leaves gres/gpu out of a job's
allocated TRES, so the port reads the per-node allocated GRES (``gres_detail``);
these tests check the counts the port reports against what the allocation is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malleable.config import SlurmConfig
from malleable.slurm import JobState, SignalTarget, SlurmRejected, SubmitRequest
from malleable.slurm.backend_cli import CliSlurmClient
from tests.helpers import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def client(slurm):
    return CliSlurmClient(SlurmConfig(command_timeout_s=30, max_retries=2), env=slurm.env)


def wait_job(client, job_id: str, what: str, pred, timeout: float = 30):
    def check():
        j = client.job(job_id)
        return j if j is not None and pred(j) else None
    return wait_until(check, timeout=timeout, interval=0.2, what=f"job {job_id} {what}")


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return str(path)


def test_shrink_second_shrink_refused_requeue_resize_release(client, tmp_path):
    job_sh = script(tmp_path, "job.sh",
                    "echo start restart=${SLURM_RESTART_COUNT:-0}\n"
                    "for i in $(seq 600); do sleep 1; done\n")
    job_id = client.submit(SubmitRequest(script=job_sh, nodes=2, gpus_per_node=4,
                                         requeue=True, output=str(tmp_path / "job-%j.out"),
                                         workdir=str(tmp_path)))
    j = wait_job(client, job_id, "RUNNING", lambda j: j.running)
    assert (j.node_count, j.gpus, j.gpus_per_node, j.restart_count) == (2, 8, 4, 0)

    # Shrink in place: the running job releases a node and its 4 GPUs.
    client.shrink_running(job_id, 1)
    j = wait_job(client, job_id, "shrunk to 1 node", lambda j: j.node_count == 1)
    assert j.running and (j.gpus, j.gpus_per_node) == (4, 4)

    # 22.05 refuses any further update of a shrunk job (without slurmdbd).
    with pytest.raises(SlurmRejected) as refused:
        client.shrink_running(job_id, 1)
    assert "DB index is being set" in refused.value.slurm_message
    assert refused.value.job_id == job_id

    # Requeue-hold: back to PENDING, held; then resize the pending job.
    client.requeue_hold(job_id)
    j = wait_job(client, job_id, "requeued and held", lambda j: j.pending and j.held)
    assert j.restart_count == 1
    client.resize_pending(job_id, 3, 2)
    j = client.job(job_id)
    assert (j.node_count, j.gpus, j.gpus_per_node) == (3, 6, 2)
    client.start_now(job_id)
    client.release(job_id)

    j = wait_job(client, job_id, "running on 3 nodes", lambda j: j.running, timeout=60)
    assert (j.node_count, j.gpus, j.gpus_per_node, j.restart_count) == (3, 6, 2, 1)
    assert sorted(n.gpus_allocated for n in client.nodes()) == [0, 2, 2, 2]
    out = tmp_path / f"job-{job_id}.out"
    log = wait_until(lambda: "restart=1" in out.read_text() and out.read_text(),
                     what="second start logged")
    assert "restart=0" in log  # --open-mode=append kept the first run's output


def test_signal_reaches_batch_shell_or_steps(client, tmp_path):
    # The batch shell and an srun step each trap USR1 and append a line to a marker.
    sig_sh = script(tmp_path, "sig.sh", f"""
trap 'echo usr1 >> {tmp_path}/batch.sig' USR1
srun -N1 -n1 bash -c 'trap "echo usr1 >> {tmp_path}/step.sig" USR1
touch {tmp_path}/step.ready; while true; do sleep 0.1; done' &
while true; do sleep 0.1; done
""")
    job_id = client.submit(SubmitRequest(script=sig_sh, nodes=1, gpus_per_node=1,
                                         output=str(tmp_path / "sig.out"),
                                         workdir=str(tmp_path)))
    wait_until(lambda: (tmp_path / "step.ready").exists(), what="srun step started")

    def lines(name: str) -> int:
        path = tmp_path / name
        return len(path.read_text().splitlines()) if path.exists() else 0

    client.signal(job_id, "USR1", SignalTarget.STEPS)
    wait_until(lambda: lines("step.sig") == 1, what="the step got USR1")
    client.signal(job_id, "USR1", SignalTarget.BATCH)
    wait_until(lambda: lines("batch.sig") == 1, what="the batch shell got USR1")
    assert lines("step.sig") == 1  # the batch signal did not reach the step
    client.signal(job_id, "USR1", SignalTarget.FULL)
    wait_until(lambda: lines("batch.sig") == 2 and lines("step.sig") == 2,
               what="both got USR1 from --full")
    # The steps signal did not reach the shell either: one line each before --full.
    assert (lines("batch.sig"), lines("step.sig")) == (2, 2)
    assert client.job(job_id).state == JobState.RUNNING


def test_requeue_of_non_requeueable_job_is_refused(client, tmp_path):
    job_sh = script(tmp_path, "rigid.sh", "for i in $(seq 600); do sleep 1; done\n")
    job_id = client.submit(SubmitRequest(script=job_sh, nodes=1, gpus_per_node=1,
                                         requeue=False, output=str(tmp_path / "r.out"),
                                         workdir=str(tmp_path)))
    j = wait_job(client, job_id, "RUNNING", lambda j: j.running)
    assert not j.requeueable
    with pytest.raises(SlurmRejected) as refused:
        client.requeue_hold(job_id)
    assert "Requested operation is presently disabled" in refused.value.slurm_message
    assert client.job(job_id).running
