"""The cli backend on the real Slurm 22.05 harness, beyond the shared contract:

* on 22.05 ``job(id)`` reads ``scontrol show job -d -o`` (text; no ``scontrol --json``
  before 23.02) while ``jobs()`` reads ``squeue --json``: both give equal records,
  for array tasks, het components, held jobs and ``--gpus`` (per-job) requests;
* a controller that accepts connections but never answers makes the command time
  out: `SlurmUnavailable` after the retries, within the configured timeout;
* values with shell metacharacters reach Slurm literally (no shell anywhere);
* `connect` with a pyslurm 25.11 (the fake; the real one cannot be built here)
  and this 22.05 controller falls back to cli and logs why.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time

import pytest

from malleable.config import SlurmConfig
from malleable.slurm import SlurmUnavailable, SubmitRequest, connect
from malleable.slurm.backend_cli import CliSlurmClient
from tests.fakes.pyslurm_fake import make_pyslurm
from tests.helpers import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def client(slurm):
    return CliSlurmClient(SlurmConfig(command_timeout_s=30, max_retries=2), env=slurm.env)


def job_script(tmp_path, body="for i in $(seq 600); do sleep 1; done\n"):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return str(path)


def test_release_is_read_once_and_pins_nothing_on_22_05(client):
    assert client.client_version() == (22, 5, 8) == client.controller_version()
    before = client.rpc_count
    client.client_version()
    client.controller_version()
    assert client.rpc_count == before


def test_job_by_id_from_text_equals_squeue_json_for_every_kind_of_job(client, tmp_path):
    script = job_script(tmp_path)
    out = str(tmp_path / "%j.out")
    array = client.submit(SubmitRequest(script=script, nodes=1, gpus_per_node=1, output=out,
                                        extra_args=("--array=1-2", "--time=30")))
    het = client.submit(SubmitRequest(script=script, nodes=1, gpus_per_node=1, output=out,
                                      hold=True, extra_args=(":", "-N1", "--gres=gpu:2")))
    per_job = client.submit(SubmitRequest(script=script, nodes=2, gpus_per_node=0, output=out,
                                          hold=True, extra_args=("--gpus=6",)))
    held = client.submit(SubmitRequest(script=script, nodes=2, gpus_per_node=2, output=out,
                                       hold=True, comment="malleable: min=2 max=8"))
    wanted = {f"{array}_1", f"{array}_2", f"{het}+0", f"{het}+1", per_job, held}
    listed = wait_until(lambda: (js := {j.job_id: j for j in client.jobs()})
                        and wanted <= set(js) and all(js[f"{array}_{t}"].running for t in (1, 2))
                        and js, what="array tasks running")
    for job_id in wanted:
        assert client.job(job_id) == listed[job_id], job_id
    assert (listed[f"{het}+1"].gpus, listed[f"{het}+1"].het_job_offset) == (2, 1)
    assert (listed[per_job].gpus, listed[per_job].gpus_per_node) == (6, 3)
    assert listed[held].held and listed[held].comment == "malleable: min=2 max=8"
    task = listed[f"{array}_1"]
    assert client.job(str(task.job_id_num)) == task  # Slurm's own number finds it too


def test_controller_that_never_answers_times_out_as_unavailable(slurm, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept_and_ignore():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue
    threading.Thread(target=accept_and_ignore, daemon=True).start()
    lines = [ln for ln in slurm.conf.read_text().splitlines()
             if not ln.startswith(("SlurmctldPort", "MessageTimeout"))]
    conf = tmp_path / "silent.conf"
    conf.write_text("\n".join(lines + [f"SlurmctldPort={server.getsockname()[1]}",
                                       "MessageTimeout=30"]) + "\n")
    client = CliSlurmClient(SlurmConfig(command_timeout_s=0.5, max_retries=1),
                            env={**slurm.env, "SLURM_CONF": str(conf)}, version="22.05.8")
    client.runner.backoff_s = 0.05
    try:
        start = time.monotonic()
        with pytest.raises(SlurmUnavailable, match=r"timed out after 0.5 s.*after 2 attempt"):
            client.jobs()
        assert time.monotonic() - start < 5
        assert client.rpc_count == 2
    finally:
        stop.set()
        for conn in held:
            conn.close()
        server.close()


def test_shell_metacharacters_reach_slurm_literally(client, tmp_path):
    marker = tmp_path / "pwned"
    comment = f"malleable: $(touch {marker}); `touch {marker}`; x | y && z > /dev/null"
    name = "a;b$(c)"
    job_id = client.submit(SubmitRequest(script=job_script(tmp_path), nodes=1, gpus_per_node=1,
                                         hold=True, comment=comment, name=name,
                                         output=str(tmp_path / "%j.out"),
                                         env=(("WEIRD", "$(touch x)"),)))
    listed = {j.job_id: j for j in client.jobs()}[job_id]
    assert (listed.comment, listed.name) == (comment, name)
    assert client.job(job_id).comment == comment
    assert not marker.exists()


def test_connect_with_pyslurm_for_another_release_falls_back_to_cli(slurm, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyslurm", make_pyslurm())  # claims 25.11
    with caplog.at_level(logging.INFO, logger="malleable.slurm"):
        client = connect(SlurmConfig(), env=slurm.env)
    assert isinstance(client, CliSlurmClient)
    assert "slurmctld is 22.05.8" in caplog.text and "built for Slurm 25.11" in caplog.text
