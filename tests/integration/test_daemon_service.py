"""Issue 8: the service's life cycle on the harness: SIGHUP, a second daemon, SIGTERM.

A rigid job fills the 16 GPUs, so `equi` (and any policy) admits none of the
pending malleable job M: the daemon holds it. Then:

* SIGHUP with a changed file (policy fifo): reloaded, the next decisions are fifo's;
* SIGHUP with a bad file: refused with the key named, the running config kept, the
  daemon goes on;
* a second daemon on the same database refuses to start, naming the holder (exit 2,
  one line, no traceback);
* SIGTERM: exit 0, M released (the daemon's admission hold), the lease given back.
"""

from __future__ import annotations

import signal
import subprocess

import pytest
from sqlalchemy import select

from malleable.db.models import Lease
from tests.helpers import wait_until
from tests.integration.daemon_support import (
    JOBS,
    MALLEABLE,
    DaemonProcess,
    environ_for,
    sbatch,
    squeue,
    store_of,
    submit_rigid,
    wait_running,
    write_config,
)

pytestmark = pytest.mark.slurm


def test_sighup_reload_second_daemon_and_graceful_sigterm(slurm, tmp_path):
    rigid = submit_rigid(slurm, tmp_path, nodes=4, gpus_per_node=4)
    wait_running(slurm, [rigid])
    m = sbatch(slurm, tmp_path, JOBS / "rigid.sbatch", nodes=1, gpus_per_node=2,
               comment="malleable:gpus=2-4,step=2,grace=20,batch=512,restart_cost=0")
    config = write_config(tmp_path, poll=1, decide=2)
    store = store_of(tmp_path)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", environ_for(slurm))
    daemon.start()
    try:
        daemon.wait_log(rf"job={m} \S+: hold: done", timeout=30)
        assert squeue(slurm)[m].held

        # SIGHUP with a good file: the policy changes from the next decision on.
        good = config.read_text()
        config.write_text(good.replace('name = "equi"', 'name = "fifo"'))
        mark = daemon.size()
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_log(r"configuration reloaded from", since=mark, timeout=30)
        wait_until(lambda: store.decisions()[-1]["policy"] == "fifo", timeout=30,
                   what="a decision by fifo")

        # SIGHUP with a bad file: refused, naming the key; the daemon goes on with fifo.
        config.write_text(good.replace('name = "equi"', 'name = "fifo"')
                          .replace("decide_interval_s = 2", 'decide_interval_s = "soon"'))
        mark = daemon.size()
        daemon.proc.send_signal(signal.SIGHUP)
        refused = daemon.wait_log(r"reload refused, keeping the running configuration: (.*)",
                                  since=mark, timeout=30)
        assert "daemon.decide_interval_s = 'soon'" in refused.group(1)
        n = len(store.decisions())
        wait_until(lambda: len(store.decisions()) >= n + 2, timeout=30, what="two decisions")
        assert store.decisions()[-1]["policy"] == "fifo" and daemon.proc.poll() is None
        config.write_text(good)

        # A second daemon on the same database: exit 2, naming the holder.
        second = subprocess.run([str(MALLEABLE), "daemon", "--config", str(config)],
                                env=environ_for(slurm), capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2
        err = second.stderr.strip().splitlines()
        assert err[-1].startswith("malleable daemon: error: another malleable daemon holds "
                                  "the lease: ")
        assert f":{daemon.proc.pid}, last heartbeat" in err[-1] and "Traceback" not in \
            second.stderr

        # SIGTERM: exit 0, the daemon's hold released, the lease given back.
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert not squeue(slurm)[m].held
    assert "stopping: released 1 job(s) the daemon held" in daemon.text()
    with store.sessions() as s:
        assert s.scalar(select(Lease.holder)) is None
    store.close()
