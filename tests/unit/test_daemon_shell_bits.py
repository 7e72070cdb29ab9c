"""The daemon's systemd notifier and log format (no systemd needed: a datagram socket stands in
for NOTIFY_SOCKET, which is exactly what systemd listens on)."""

from __future__ import annotations

import io
import logging
import os
import socket

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
