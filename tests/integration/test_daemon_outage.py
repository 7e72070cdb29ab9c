"""Issue 8, Slurm outage: slurmctld stopped for 60 s during a run; and pause/resume.

The session's slurmctld is stopped by its pid file (SIGTERM: it saves its state)
and started again after 60 s with the same slurm.conf, without ``-i``, so it
recovers every job; slurmd and the jobs keep running meanwhile. While it is down,
``squeue --json`` answers with an error entry instead of jobs (the port raises
`SlurmUnavailable`). (With ``MALLEABLE_TEST_SLURM_CONF``, a harness this session did
not start, it is that harness's slurmctld that is stopped and started again.)

The daemon starts paused (``settings``: paused), so it observes and plans but
acts on nothing; it is resumed while the controller is down. It must log the
outage, record no decision and start no action on the stale state of its last
poll, stay alive, and act (a checkpoint-requeue the plan wanted all along) only
when the controller is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Lease
from tests.helpers import wait_until
from tests.integration.daemon_support import (
    DaemonProcess,
    cycle_lines,
    environ_for,
    job_view,
    squeue,
    store_of,
    submit_emulated,
    submit_rigid,
    wait_running,
    write_config,
)

pytestmark = pytest.mark.slurm

OUTAGE_S = 60


def ctld_pid(h) -> int:
    """slurmctld's pid from the harness's pid file, checked to be that harness's process."""
    pid = int((h.dir / "slurmctld.pid").read_text().split()[0])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert Path(argv[0].decode()).name == "slurmctld" and str(h.conf).encode() in argv, argv
    return pid


def stop_ctld(h) -> None:
    pid = ctld_pid(h)
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, what="slurmctld stopped")


def start_ctld(h) -> None:
    """Start slurmctld again on the same slurm.conf, keeping its saved state (no -i)."""
    subprocess.run(["/usr/sbin/slurmctld", "-f", str(h.conf)], env=h.env, check=True,
                   capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    wait_until(lambda: "UP" in h.run("scontrol", "ping", check=False).stdout, timeout=60,
               what="slurmctld answering")


def set_paused(url: str, paused: bool) -> None:
    engine = make_engine(url)
    try:
        with session_factory(engine)() as s, s.begin():
            store.set_paused(s, paused)
    finally:
        engine.dispose()


def test_slurm_outage_is_logged_acted_on_only_after_and_survived(slurm, tmp_path):
    rigid = submit_rigid(slurm, tmp_path, nodes=1, gpus_per_node=4)
    wait_running(slurm, [rigid])
    a = submit_emulated(slurm, tmp_path, "gpus=2-4,step=2,grace=30", nodes=1, gpus_per_node=2)
    before = wait_running(slurm, [rigid, a])

    config = write_config(tmp_path, poll=2, decide=4)
    url = f"sqlite:///{tmp_path / 'm.db'}"
    engine = make_engine(url)
    schema.prepare_schema(engine)
    engine.dispose()
    set_paused(url, True)
    db = store_of(tmp_path)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", environ_for(slurm))
    daemon.start()
    ctld_down = False
    try:
        # Paused: plans (the decision wants A on 4 GPUs), acts on nothing.
        daemon.wait_log(rf"job={a} \S+: plan: requeue 2 -> 4 GPUs .*\[paused\]", timeout=30)
        assert db.actions() == []

        stop_ctld(slurm)
        ctld_down = True
        down_at = time.monotonic()
        mark = daemon.size()
        daemon.wait_log(r"poll failed, Slurm unavailable", since=mark, timeout=40)
        set_paused(url, False)   # resumed while Slurm is down: still nothing may happen
        decisions = len(db.decisions())
        while time.monotonic() - down_at < OUTAGE_S:
            assert daemon.proc.poll() is None, daemon.text()[-3000:]
            assert db.actions() == []
            assert len(db.decisions()) == decisions
            time.sleep(2)
        text = daemon.text()
        outage_log = text[text.index("poll failed, Slurm unavailable", mark - daemon.offset):]
        start_ctld(slurm)
        ctld_down = False

        lines = cycle_lines(outage_log)
        assert lines and all(c["unavailable"] and c["actions_rpc"] == 0 for c in lines), lines
        assert ": done (action" not in outage_log
        # Back: the daemon acts on a fresh poll, A is requeued at 4 GPUs.
        wait_until(lambda: (j := squeue(slurm)[a]).state.value == "RUNNING" and j.gpus == 4
                   and j.restart_count == 1, timeout=90, what="A requeued at 4 GPUs")
        wait_until(lambda: [x["state"] for x in db.actions()] == ["done"], timeout=30,
                   what="the requeue action done")
        assert daemon.stop() == 0
    finally:
        if ctld_down:
            start_ctld(slurm)
        daemon.kill()

    acts = db.actions()
    assert len(acts) == 1 and acts[0]["kind"] == "requeue" and acts[0]["job"] == a
    assert len(db.decisions()) > decisions and acts[0]["decision_id"] > decisions
    after = squeue(slurm)
    assert job_view(after[rigid]) == job_view(before[rigid])
    log = daemon.text()
    assert "Slurm unavailable" in log and "Traceback" not in log
    db.close()


def _nowhere_env(tmp_path: Path) -> dict:
    """The environment of a daemon whose slurm.conf names a controller nobody runs (port 1:
    each squeue takes about 9 s to give up)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MALLEABLE_TEST_CRASH_AT", "MALLEABLE_CONFIG", "MALLEABLE_DATABASE_URL")}
    env["SLURM_CONF"] = str(conf)
    return env


def test_once_exits_1_when_slurm_does_not_answer(tmp_path):
    """``daemon --once`` against a controller nobody runs (a slurm.conf naming port 1):
    its poll fails, nothing is decided, and it exits 1, not 0 (a cron job sees it)."""
    daemon = DaemonProcess(write_config(tmp_path), tmp_path / "daemon.log",
                           _nowhere_env(tmp_path))
    daemon.start("--once", ready=False)
    assert daemon.wait_exit(120) == 1, daemon.text()
    assert "--once: Slurm did not answer the poll; nothing was decided" in daemon.text()
    st = store_of(tmp_path)
    try:
        with st.sessions() as s:
            assert store.latest_decision(s) is None
    finally:
        st.close()


def test_sigterm_while_slurm_does_not_answer_at_start_stops_the_daemon(tmp_path):
    """SIGTERM during the start-up reads, while Slurm does not answer (retries with
    back-off): the daemon stops after the Slurm call in progress and gives the lease
    back. It used to go on into its scheduler, which the stop had not reached, and hang
    until SIGKILL, withholding its heartbeat (a stale lease)."""
    daemon = DaemonProcess(write_config(tmp_path, retries=3), tmp_path / "daemon.log",
                           _nowhere_env(tmp_path))
    daemon.start()
    try:
        time.sleep(2)
        t0 = time.monotonic()
        assert daemon.stop(timeout=60) == 0, daemon.text()
        # The call in progress (~9 s) ends it: no more retries, no start-up poll.
        assert time.monotonic() - t0 < 30, daemon.text()
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
    text = daemon.text()
    assert "stop requested" in text and "stopped; lease of" in text, text
    assert "the daemon is stopping: no more retries" in text, text
    st = store_of(tmp_path)
    try:
        with st.sessions() as s:
            assert s.scalar(select(Lease.holder)) is None
    finally:
        st.close()


def _fast_daemon(slurm, tmp_path: Path, database: str = "") -> DaemonProcess:
    """A daemon polling every second on a new database in ``tmp_path`` (``database``: more
    lines for its [database] table), started and past its first decision."""
    config = write_config(tmp_path, poll=1, decide=2)
    config.write_text(config.read_text().replace("[database]\n", "[database]\n" + database, 1))
    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    schema.prepare_schema(engine)
    engine.dispose()
    daemon = DaemonProcess(config, tmp_path / "daemon.log", environ_for(slurm))
    daemon.start()
    try:
        daemon.wait_log(r"decide cycle: ", timeout=30)
    except BaseException:
        daemon.kill()
        raise
    return daemon


def test_a_locked_database_is_one_error_line_per_failure_and_survived(slurm, tmp_path):
    """Another process holds the database's write lock past busy_timeout: every cycle and
    heartbeat failed with a 40-line traceback (44 in 30 s, a tester on the harness); each
    failure is now one line naming the database and the cause, and the daemon goes on
    once the lock is released."""
    import sqlite3

    daemon = _fast_daemon(slurm, tmp_path, "busy_timeout_ms = 200\n")
    try:
        mark = daemon.size()
        lock = sqlite3.connect(tmp_path / "m.db", timeout=5)
        lock.execute("BEGIN IMMEDIATE")
        try:
            daemon.wait_log(r"(poll|decide) failed, database unavailable: \S+m\.db: database is "
                            r"locked",
                            since=mark, timeout=30)
            time.sleep(4)
        finally:
            lock.rollback()
            lock.close()
        after = daemon.size()
        daemon.wait_log(r"decide cycle: ", since=after, timeout=30)
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    outage = daemon.text(whole=True)[mark:after]
    failures = [x for x in outage.splitlines() if "failed, database unavailable" in x]
    assert len(failures) >= 3, outage[-3000:]
    assert "Traceback" not in daemon.text(whole=True)


def test_a_database_file_moved_away_stops_the_daemon_without_a_new_empty_one(slurm, tmp_path):
    """The SQLite file moved away under a running daemon: it went on writing to the moved
    file, then a new connection created an empty one in its place and every cycle failed
    with "no such table" (a tester on the harness). It now stops, exit 3, saying why,
    and leaves no file behind."""
    daemon = _fast_daemon(slurm, tmp_path)
    try:
        (tmp_path / "trash").mkdir()
        for f in tmp_path.glob("m.db*"):
            f.rename(tmp_path / "trash" / f.name)
        daemon.wait_log(rf"the database file {tmp_path / 'm.db'} was removed \(or moved away\) "
                        r"while the daemon ran; stopping \(exit 3\)", timeout=30)
        assert daemon.wait_exit(timeout=60) == 3
    finally:
        daemon.kill()
    assert not (tmp_path / "m.db").exists()
    log = daemon.text()
    assert "stopped without releasing the jobs the daemon held or its lease" in log
    # What it held is saved beside the path, as a database with its log.
    (gone,) = tmp_path.glob("m.db.gone-*[0-9]Z")
    assert f"the database as this daemon last had it is saved as {gone}" in log
    engine = make_engine(f"sqlite:///{gone}", create=False)
    try:
        with session_factory(engine)() as s:
            assert s.scalar(select(Lease.holder)) is not None   # as the daemon left it
    finally:
        engine.dispose()
    assert "Traceback" not in log and "no such table" not in log
