"""The daemon's systemd notifier and log format (no systemd needed: a datagram socket stands in
for NOTIFY_SOCKET, which is exactly what systemd listens on)."""

from __future__ import annotations

import io
import logging
import os
import socket
import warnings

import numpy as np
import pytest

from malleable.daemon.logs import job_logger, set_cycle, setup_logging
from malleable.daemon.systemd import Notifier


def test_notifier_sends_sd_notify_datagrams(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    n = Notifier()
    assert n.enabled and n.watchdog_interval_s == 10.0
    n.ready("polling")
    assert srv.recv(1024) == b"READY=1\nSTATUS=polling"
    n.watchdog()
    assert srv.recv(1024) == b"WATCHDOG=1"
    n.stopping()
    assert srv.recv(1024) == b"STOPPING=1"
    srv.close()


def test_notifier_is_noop_outside_systemd(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    n = Notifier()
    assert not n.enabled and n.watchdog_interval_s is None
    n.ready()  # nothing to send to, nothing raised


def test_log_lines_carry_job_and_cycle_and_journald_priority():
    buf = io.StringIO()
    setup_logging("INFO", stream=buf, journald=True)
    log = logging.getLogger("malleable.daemon.test")
    set_cycle(7)
    job_logger(log, "123_4").warning("requeue refused")
    log.info("cycle done")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "<4>WARNING cycle=7 job=123_4 malleable.daemon.test: requeue refused"
    assert lines[1] == "<6>INFO cycle=7 job=- malleable.daemon.test: cycle done"


def test_a_users_text_in_a_log_message_cannot_fake_or_hide_lines():
    """The daemon logs an invalid spec with the job's comment quoted, which any user
    writes: an escape sequence, a line break or a bidirectional override in it shows
    as an escape on the one line; a traceback keeps its own lines."""
    buf = io.StringIO()
    setup_logging("INFO", stream=buf, journald=True)
    log = logging.getLogger("malleable.daemon.test")
    set_cycle(3)
    comment = "malleable:gpus=\x1b[2J\n<3>ERROR cycle=3 job=- fake\u202e"
    job_logger(log, "9").warning("invalid malleable spec, left to Slurm as a rigid job: %s",
                                 comment)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("refused: %s", "a\rb")
    lines = buf.getvalue().splitlines()
    assert lines[0] == ("<4>WARNING cycle=3 job=9 malleable.daemon.test: invalid malleable "
                        "spec, left to Slurm as a rigid job: malleable:gpus=\\x1b[2J\\n"
                        "<3>ERROR cycle=3 job=- fake\\u202e")
    assert lines[1] == "<3>ERROR cycle=3 job=- malleable.daemon.test: refused: a\\rb"
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"
    assert not any(c in buf.getvalue() for c in "\x1b\r\u202e")


def test_python_warnings_become_log_lines_in_the_daemons_format():
    """numpy's RuntimeWarnings (e.g. under an extreme policy parameter) went to stderr
    raw, outside the log format."""
    buf = io.StringIO()
    logging.captureWarnings(False)   # (an earlier setup_logging's capture, under pytest's)
    setup_logging("INFO", stream=buf, journald=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            np.exp(np.array([1e308]))
        lines = buf.getvalue().splitlines()
        assert len(lines) == 1, lines             # the source line joined to it
        assert lines[0].startswith("<4>WARNING cycle=") and " py.warnings: " in lines[0]
        assert "RuntimeWarning: overflow encountered in exp -- np.exp(" in lines[0]
    finally:
        logging.captureWarnings(False)


def _service_config(tmp_path, policy: str, poll_s: float):
    (tmp_path / "spool").mkdir(exist_ok=True)
    p = tmp_path / "m.toml"
    p.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/m.db"\n'
                 f'[progress]\nspool_dir = "{tmp_path}/spool"\n'
                 f'[daemon]\npoll_interval_s = {poll_s}\n[policy]\nname = "{policy}"\n')
    return p


@pytest.fixture
def service(tmp_path, monkeypatch):
    """A `Service` on a scratch SQLite store (policy equi, poll every 30 s), not started."""
    from malleable.config import load_config
    from malleable.daemon.service import Service, ServiceOptions

    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    path = _service_config(tmp_path, "equi", 30)
    svc = Service(load_config(str(path)), ServiceOptions(config_path=str(path)))
    yield svc
    svc.engine.dispose()


def test_sighup_reschedules_only_timers_whose_interval_changed(service, tmp_path, monkeypatch):
    """Rescheduling restarts an interval from now: a reload that rescheduled every timer
    put off the next decision by a whole interval even when no interval changed."""
    service._schedule()
    calls = []
    monkeypatch.setattr(service.scheduler, "reschedule_job",
                        lambda job_id, **kw: calls.append((job_id, kw["seconds"])))
    _service_config(tmp_path, "fifo", 30)          # the policy changes, no interval does
    service.reload()
    assert service.config.policy.name == "fifo" and calls == []
    _service_config(tmp_path, "fifo", 10)          # now the poll interval changes
    service.reload()
    assert calls == [("poll", 10.0)]


def test_a_stop_while_the_scheduler_updates_its_jobs_is_a_clean_stop(service):
    """A SIGTERM that landed while APScheduler's loop was between running the one-shot
    stop-check job and removing it from the job store: the stop's shutdown emptied the
    store, the loop raised JobLookupError and the daemon exited 1 with a traceback (seen
    once in CI, tests/integration/test_daemon_crash.py). Reproduced here by stopping at
    that very point."""
    import time

    from apscheduler.jobstores.base import JobLookupError

    def scheduled_stop_check_only():
        service._schedule()
        for job_id in ("poll", "ingest", "decide", "housekeeping", "heartbeat"):
            service.scheduler.remove_job(job_id)   # (no Slurm here: only stop-check runs)
        return service.scheduler

    sched = scheduled_stop_check_only()
    original = sched.remove_job

    def stop_landing_here(job_id, jobstore=None):
        if job_id == "stop-check":
            service.stop()                # the signal handler, on the loop's thread
            deadline = time.monotonic() + 10
            while sched.get_jobs() and time.monotonic() < deadline:
                time.sleep(0.01)          # the shutdown thread empties the store
        return original(job_id, jobstore)

    sched.remove_job = stop_landing_here
    service._run_scheduler()              # returns: the stop ended the loop
    assert service._stopping.is_set() and not sched.get_jobs()
    # Without a stop, the same error is not swallowed.
    service._stopping.clear()
    sched = scheduled_stop_check_only()

    def lost(job_id, jobstore=None):
        raise JobLookupError(job_id)

    sched.remove_job = lost
    with pytest.raises(JobLookupError):
        service._run_scheduler()
    sched.shutdown(wait=False)


def test_heartbeat_runs_beside_a_slow_cycle_but_not_beside_a_hung_one(service):
    """A poll that retried a slow Slurm for 80 s blocked the heartbeat (one worker thread),
    so `status` called a live daemon stale and another daemon could take over. The heartbeat
    has its own thread now; a cycle running past lease_timeout_s counts as hung."""
    import time

    from malleable.db.lease import read_lease

    service._take_lease()
    service._schedule()
    assert service.scheduler.get_job("heartbeat").executor == "heartbeat"
    assert service.scheduler.get_job("poll").executor == "default"
    limit = service.config.daemon.lease_timeout_s
    first = read_lease(service.engine).heartbeat_at
    service._cycle_since = time.monotonic() - 80          # a slow cycle: still alive
    time.sleep(0.01)
    service._heartbeat()
    renewed = read_lease(service.engine).heartbeat_at
    assert renewed > first
    service._cycle_since = time.monotonic() - limit - 1   # hung: withheld
    service._heartbeat()
    assert read_lease(service.engine).heartbeat_at == renewed


def test_a_cycle_after_a_database_write_outage_gets_new_connections(service, tmp_path):
    """A connection SQLite opened while the WAL could not be written stays read-only after
    the disk recovers: a daemon that kept its pool failed every cycle for good (while its
    heartbeat, on an older connection, said healthy). A store error now makes the next
    cycle open new connections. The outage is real: the WAL file made immutable."""
    import shutil
    import subprocess
    from datetime import UTC, datetime

    from malleable.db import store

    wal = tmp_path / "m.db-wal"
    tick = iter(range(100))

    def cycle():
        with service.sessions() as s, s.begin():
            store.set_setting(s, "test.tick", str(next(tick)), datetime.now(UTC))

    service._run(cycle, "poll")                    # the WAL exists, the pool has a connection
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(wal)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system with "
                    "the immutable flag)")
    try:
        service.engine.dispose()                   # e.g. the pool replaced its connection
        service._run(cycle, "poll")                # fails: logged, not raised
        service._run(cycle, "poll")
    finally:
        subprocess.run(["chattr", "-i", str(wal)], check=True)
    service._run(cycle, "poll")                    # the disk is back: this cycle writes
    with service.sessions() as s:
        assert store.get_setting(s, "test.tick") == "3"


def test_a_spool_dir_that_is_a_file_is_refused_naming_the_setting(tmp_path, monkeypatch):
    from malleable.config import load_config
    from malleable.daemon.service import Service, ServiceOptions

    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    path = _service_config(tmp_path, "equi", 30)
    (tmp_path / "spool").rmdir()
    (tmp_path / "spool").write_text("not a directory")
    with pytest.raises(ValueError, match=r"progress.spool_dir = '.*spool': exists and is not "
                                         r"a directory"):
        Service(load_config(str(path)), ServiceOptions(config_path=str(path)))
    assert not (tmp_path / "m.db").exists()     # refused before the database was created


def test_managed_partitions_without_a_node_are_warned_about(tmp_path, caplog):
    """`[slurm] partitions = ["nosuch"]` started a daemon that silently managed nothing."""
    import logging
    from datetime import UTC, datetime

    from malleable.config import parse_config
    from malleable.daemon.cycle import Daemon
    from malleable.sim.engine import Engine
    from malleable.sim.loop import open_state_store
    from malleable.sim.slurm import SimSlurm

    engine, sessions = open_state_store()
    slurm = SimSlurm(Engine(), 2, 4)
    for parts, warned in ((["nosuch"], True), ([slurm.partition], False), ([], False)):
        config = parse_config({"slurm": {"partitions": parts}}, source="test")
        d = Daemon(slurm=slurm, sessions=sessions, clock=lambda: datetime.now(UTC),
                   spool_dir=str(tmp_path), config=config)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="malleable.daemon.cycle"):
            assert d.refresh_nodes(datetime.now(UTC), force=True)
        hit = [r.getMessage() for r in caplog.records if "managed partitions" in r.getMessage()]
        assert bool(hit) == warned, (parts, hit)
        if warned:
            assert f"Slurm's: {slurm.partition}" in hit[0]
    engine.dispose()
