"""Issue 8: an uncooperative job is never killed by the daemon, and it is backed off.

The job (tests/integration/daemon_jobs/stubborn.sbatch) declares a malleable spec
with a 2 s grace and logs progress, but ignores the checkpoint signal: it logs that it got it and
keeps running, never writing ``checkpointed``. `equi` wants it on 4 GPUs, so the
daemon tries a checkpoint-requeue: it signals the job, waits out the grace,
abandons the action (the job keeps running, untouched) and records a
``no_checkpoint`` event; the next attempt waits ``requeue_backoff_s`` (3 s here),
the one after twice that (exponential back-off).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.helpers import wait_until
from tests.integration.daemon_support import (
    JOBS,
    DaemonProcess,
    environ_for,
    job_view,
    sbatch,
    squeue,
    store_of,
    wait_running,
    write_config,
)

pytestmark = pytest.mark.slurm

BACKOFF_S = 3.0


def test_a_job_that_ignores_the_signal_keeps_running_and_is_backed_off(slurm, tmp_path):
    marks = tmp_path / "stubborn.log"
    (tmp_path / "spool").mkdir(exist_ok=True)
    u = sbatch(slurm, tmp_path, JOBS / "stubborn.sbatch", nodes=1, gpus_per_node=2,
               comment="malleable:gpus=2-4,step=2,grace=2,batch=512,restart_cost=0",
               env=(("STUBBORN_LOG", str(marks)), ("MALLEABLE_SPOOL", str(tmp_path / "spool"))),
               name="stubborn")
    start = wait_running(slurm, [u])[u]
    config = write_config(tmp_path, poll=1, decide=2, backoff=BACKOFF_S)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", environ_for(slurm))
    store = store_of(tmp_path)
    daemon.start()
    try:
        def untouched():
            j = squeue(slurm)[u]
            assert job_view(j) == job_view(start), (job_view(j), job_view(start))
            return True

        def abandoned(n):
            acts = [a for a in store.actions(u) if a["state"] == "abandoned"]
            untouched()
            return acts if len(acts) >= n else None
        wait_until(lambda: abandoned(3), timeout=60, interval=0.5,
                   what="three requeue attempts abandoned")
        assert daemon.stop() == 0
    finally:
        daemon.kill()

    end = squeue(slurm)[u]
    assert job_view(end) == job_view(start)       # running, same nodes, no restart, not held
    acts = store.actions(u)
    assert [a["kind"] for a in acts][:3] == ["requeue"] * 3
    first, second, third = acts[:3]
    for a in (first, second, third):
        assert a["state"] == "abandoned" and "no checkpoint within 2 s grace" in a["note"]
        # Abandoned after its grace, counted from the signal.
        assert a["finished_at"] - a["signalled_at"] >= timedelta(seconds=2)
    # Back-off: no new attempt for BACKOFF_S after the first failure, 2 x BACKOFF_S after
    # the second (the failure's time is its no_checkpoint event).
    fails = [e["time"] for e in store.events(u, "no_checkpoint")]
    assert len(fails) >= 3
    assert second["created_at"] - fails[0] >= timedelta(seconds=BACKOFF_S)
    assert third["created_at"] - fails[1] >= timedelta(seconds=2 * BACKOFF_S)
    assert not any(a["kind"] == "requeue" and fails[0] < a["created_at"] < second["created_at"]
                   for a in acts)
    # The job got each signal and ignored it; it was never killed.
    lines = marks.read_text().splitlines()
    assert sum("got USR1" in ln for ln in lines) == len(acts)
    assert sum(" start " in f" {ln} " for ln in lines) == 1
    assert lines[-1].endswith("alive")
    log = daemon.text()
    assert "requeue_hold" not in log
    store.close()
