"""One contract for every `SlurmClient` backend.

* ``cli`` runs against the real Slurm 22.05 harness (fixture ``slurm``: 4 nodes x
  4 GPUs, partition gpu): real squeue/sinfo/scontrol/scancel/sbatch, real jobs.
* ``pyslurm`` runs against a FAKE of the pyslurm 25.11 API (tests/fakes/pyslurm_fake.py):
  pyslurm 25.11 links libslurm 25.11 and cannot be built against this machine's
  Slurm 22.05 (DESIGN.md section 6), so the real pyslurm cannot be exercised
  here. The fake reproduces pyslurm's documented surface over an in-memory
  controller that follows the Slurm behaviour seen on the harness.

The tests live in `ContractTests`; `TestCliBackend` and `TestPyslurmBackend` run
them with their backend. Each test states behaviour the daemon relies on; release-specific behaviour of
22.05 (a second shrink refused, signal delivery to processes) is tested on the
harness in test_harness_raw.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from malleable.config import SlurmConfig
from malleable.slurm import (
    InvalidArgument,
    InvalidJobId,
    JobState,
    SignalTarget,
    SlurmClient,
    SlurmRejected,
    SlurmUnavailable,
    SubmitRequest,
)
from malleable.slurm.backend_cli import CliSlurmClient
from malleable.slurm.backend_pyslurm import PyslurmSlurmClient
from tests.fakes.pyslurm_fake import make_pyslurm
from tests.helpers import wait_until


@dataclass
class Backend:
    """A client under test plus what a test needs to drive it."""

    name: str
    client: SlurmClient
    tmp: Path
    make_unreachable: object  # () -> SlurmClient whose controller does not answer

    def submit(self, nodes: int = 1, gpus: int = 1, **kw) -> str:
        script = self.tmp / "job.sh"
        if not script.exists():
            # Like a malleable job: the batch shell survives its checkpoint signal.
            script.write_text("#!/bin/bash\ntrap 'echo checkpoint' USR1\necho ready\n"
                              "for i in $(seq 600); do sleep 1; done\n")
            script.chmod(0o755)
        kw.setdefault("output", str(self.tmp / "job-%j.out"))
        kw.setdefault("workdir", str(self.tmp))
        return self.client.submit(SubmitRequest(script=str(script), nodes=nodes,
                                                gpus_per_node=gpus, **kw))

    def wait(self, job_id: str, what: str, pred, timeout: float = 30):
        def check():
            j = self.client.job(job_id)
            return j if j is not None and pred(j) else None
        return wait_until(check, timeout=timeout, interval=0.2, what=f"job {job_id} {what}")

    def running(self, job_id: str, **kw):
        return self.wait(job_id, "RUNNING", lambda j: j.state == JobState.RUNNING, **kw)

    def trapping(self, job_id: str) -> None:
        """Wait until the batch shell has set its trap (Slurm reports RUNNING before the
        shell has started; a signal then would kill it). Only the real cluster runs the
        script: the fake pyslurm has no output."""
        if self.name != "cli":
            return
        out = self.tmp / f"job-{job_id}.out"
        wait_until(lambda: out.exists() and "ready" in out.read_text(), timeout=30,
                   interval=0.1, what=f"job {job_id}'s shell ready")


def _unreachable_cli(slurm, tmp: Path):
    """A cli client whose slurm.conf points at a closed port (MessageTimeout=1)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = [ln for ln in slurm.conf.read_text().splitlines()
             if not ln.startswith(("SlurmctldPort", "MessageTimeout"))]
    conf = tmp / "unreachable.conf"
    conf.write_text("\n".join(lines + [f"SlurmctldPort={port}", "MessageTimeout=1"]) + "\n")
    client = CliSlurmClient(SlurmConfig(command_timeout_s=20, max_retries=2),
                            env={**slurm.env, "SLURM_CONF": str(conf)}, version="22.05.8")
    client.runner.backoff_s = 0.01
    return client


class ContractTests:
    """The contract every backend meets; subclasses provide the ``backend`` fixture."""

    def test_jobs_is_one_rpc_whatever_the_number_of_jobs(self, backend):
        ids = [backend.submit(hold=True) for _ in range(3)]
        backend.client.jobs()  # first call may read the release once
        before = backend.client.rpc_count
        jobs = {j.job_id: j for j in backend.client.jobs()}
        assert backend.client.rpc_count == before + 1
        assert set(ids) <= set(jobs)
        assert all(jobs[i].pending and jobs[i].held for i in ids)

    def test_running_job_record_and_job_by_id_agree(self, backend):
        job_id = backend.submit(nodes=2, gpus=4, comment="malleable: min=4 max=16",
                                name="resnet", requeue=True)
        j = backend.running(job_id)
        assert (j.node_count, j.gpus, j.gpus_per_node) == (2, 8, 4)
        assert j.nodes and j.name == "resnet" and j.comment == "malleable: min=4 max=16"
        assert j.requeueable and j.batch and not j.held and j.restart_count == 0
        assert j.start_time is not None and j.submit_time is not None and j.partition == "gpu"
        assert j.job_id == job_id and j.job_id_num == int(job_id)
        listed = {x.job_id: x for x in backend.client.jobs()}
        assert listed[job_id] == backend.client.job(job_id)
        assert sum(n.gpus_allocated for n in backend.client.nodes()) >= 8

    def test_held_job_requests_then_resize_pending_takes_effect(self, backend):
        job_id = backend.submit(nodes=2, gpus=4, hold=True)
        j = backend.client.job(job_id)
        assert j.pending and j.held and (j.node_count, j.gpus, j.gpus_per_node) == (2, 8, 4)
        backend.client.resize_pending(job_id, 3, 2)
        j = backend.client.job(job_id)
        assert (j.node_count, j.gpus, j.gpus_per_node) == (3, 6, 2)
        backend.client.release(job_id)
        j = backend.running(job_id)
        assert (j.node_count, j.gpus, j.gpus_per_node) == (3, 6, 2)  # allocated, not requested
        per_node = {n.name: n.gpus_allocated for n in backend.client.nodes()}
        assert sorted(per_node.values()) == [0, 2, 2, 2]

    def test_hold_and_release_a_pending_job(self, backend):
        first = backend.submit(nodes=4, gpus=4)
        backend.running(first)
        second = backend.submit(nodes=4, gpus=4)
        j = backend.wait(second, "pending for resources", lambda j: j.pending)
        assert not j.held and j.gpus == 16
        backend.client.hold(second)
        assert backend.client.job(second).held
        backend.client.release(second)
        j = backend.client.job(second)
        assert j.pending and not j.held

    def test_shrink_running_releases_nodes(self, backend):
        job_id = backend.submit(nodes=2, gpus=4)
        backend.running(job_id)
        backend.client.shrink_running(job_id, 1)
        j = backend.wait(job_id, "on 1 node", lambda j: j.node_count == 1)
        assert j.running and (j.gpus, j.gpus_per_node) == (4, 4)

    def test_requeue_hold_start_now_release_restarts_the_job(self, backend):
        job_id = backend.submit(nodes=1, gpus=2)
        backend.running(job_id)
        backend.client.requeue_hold(job_id)
        j = backend.wait(job_id, "requeued and held", lambda j: j.pending and j.held)
        assert j.restart_count == 1
        backend.client.start_now(job_id)
        backend.client.release(job_id)
        j = backend.running(job_id)
        assert j.restart_count == 1 and j.gpus == 2

    def test_requeue_of_a_job_that_is_not_requeueable_is_refused(self, backend):
        job_id = backend.submit(nodes=1, gpus=1, requeue=False)
        backend.running(job_id)
        with pytest.raises(SlurmRejected) as exc:
            backend.client.requeue_hold(job_id)
        assert "disabled" in exc.value.slurm_message and exc.value.job_id == job_id
        assert backend.client.job(job_id).running

    def test_changes_slurm_refuses_carry_slurms_message(self, backend):
        job_id = backend.submit(nodes=1, gpus=1)
        backend.running(job_id)
        with pytest.raises(SlurmRejected) as exc:
            backend.client.resize_pending(job_id, 2, 2)
        assert exc.value.slurm_message
        with pytest.raises(SlurmRejected, match="(?i)invalid job id"):
            backend.client.hold("99999")
        assert backend.client.job("99999") is None

    def test_signal_each_target_and_cancel(self, backend):
        job_id = backend.submit(nodes=1, gpus=1)
        backend.running(job_id)
        backend.trapping(job_id)
        for target in SignalTarget:
            backend.client.signal(job_id, "USR1", target)
        backend.client.cancel(job_id)
        backend.wait(job_id, "cancelled", lambda j: j.state == JobState.CANCELLED
                     or j.state == JobState.COMPLETING)

    def test_bad_ids_and_arguments_are_refused_before_any_rpc(self, backend):
        client = backend.client
        client.jobs()
        before = client.rpc_count
        calls = [
            ("job", ()), ("hold", ()), ("release", ()), ("requeue_hold", ()), ("start_now", ()),
            ("cancel", ()), ("shrink_running", (1,)), ("resize_pending", (1, 1)),
            ("signal", ("USR1",)),
        ]
        for bad in ["", "abc", "1;rm -rf /", "$(x)", "`id`", "12 13", "-1", "0", "12_", "+1",
                    "1_2_3", "007", "12\n13", 12.5, None, True]:
            for method, args in calls:
                with pytest.raises(InvalidJobId, match="invalid job id"):
                    getattr(client, method)(bad, *args)
        for call in (lambda: client.signal("12", "-9"), lambda: client.signal("12", "USR1;x"),
                     lambda: client.shrink_running("12", 0),
                     lambda: client.resize_pending("12", 2, -1),
                     lambda: client.signal("12", "USR1", "everything")):
            with pytest.raises(InvalidArgument):
                call()
        assert client.rpc_count == before

    def test_nodes_and_cluster(self, backend):
        nodes = backend.client.nodes()
        assert len(nodes) == 4 and all(n.gpus == 4 and "gpu" in n.partitions for n in nodes)
        assert all(n.usable for n in nodes)
        info = backend.client.cluster()
        assert (info.gpus_per_node, info.nodes, info.default_partition) == (4, 4, "gpu")
        assert info.partitions == ("gpu",) and info.version_tuple >= (22, 5, 0)

    def test_unreachable_controller_is_slurm_unavailable_after_retries(self, backend):
        client = backend.make_unreachable()
        with pytest.raises(SlurmUnavailable):
            client.jobs()
        before = client.rpc_count
        with pytest.raises(SlurmUnavailable, match="after 3 attempt"):
            client.jobs()
        assert client.rpc_count == before + 3  # 1 + max_retries=2
        with pytest.raises(SlurmUnavailable):
            client.requeue_hold("12")


@pytest.mark.slurm
class TestCliBackend(ContractTests):
    """``cli`` against the real Slurm 22.05 harness."""

    @pytest.fixture
    def backend(self, slurm, tmp_path):
        client = CliSlurmClient(SlurmConfig(command_timeout_s=30, max_retries=2), env=slurm.env)
        return Backend("cli", client, tmp_path, lambda: _unreachable_cli(slurm, tmp_path))


class TestPyslurmBackend(ContractTests):
    """``pyslurm`` against the fake of the pyslurm 25.11 API (no pyslurm 25.11 can be
    built against this machine's Slurm 22.05; see the module docstring)."""

    @pytest.fixture
    def backend(self, tmp_path):
        def fake_client(down=False):
            mod = make_pyslurm()
            mod.ctld.down = down
            return PyslurmSlurmClient(SlurmConfig(max_retries=2), module=mod,
                                      controller_version="25.11.0", sleep=lambda s: None)
        return Backend("pyslurm", fake_client(), tmp_path, lambda: fake_client(down=True))
