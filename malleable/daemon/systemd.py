"""systemd integration: readiness, watchdog and status notifications.

Uses the `sdnotify` library (no hand-written socket code). Outside systemd
(``NOTIFY_SOCKET`` unset) every call is a no-op, so the daemon runs the same in
a terminal, in tests and under ``Type=notify``.
"""

from __future__ import annotations

import os

import sdnotify


class Notifier:
    """Sends sd_notify(3) messages when running under systemd.

    Attributes:
        enabled: True when ``NOTIFY_SOCKET`` is set.
        watchdog_interval_s: how often to ping the watchdog (half of
            ``WATCHDOG_USEC``), or None when the unit has no ``WatchdogSec``.
    """

    def __init__(self) -> None:
        env = os.environ  # sdnotify itself reads NOTIFY_SOCKET from the process environment
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._sd = sdnotify.SystemdNotifier() if self.enabled else None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        ours = pid is None or pid == str(os.getpid())
        self.watchdog_interval_s = (int(usec) / 2e6) if (usec and usec.isdigit() and ours) else None

    def _send(self, msg: str) -> None:
        if self._sd is not None:
            self._sd.notify(msg)

    def ready(self, status: str = "") -> None:
        """READY=1: start-up finished (schema checked, lease taken, first poll done)."""
        self._send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> None:
        """WATCHDOG=1: the daemon's loop is alive."""
        self._send("WATCHDOG=1")

    def status(self, status: str) -> None:
        """STATUS=...: one line shown by `systemctl status`."""
        self._send(f"STATUS={status}")

    def reloading(self) -> None:
        """RELOADING=1: SIGHUP received, configuration being reloaded."""
        self._send("RELOADING=1")

    def stopping(self) -> None:
        """STOPPING=1: SIGTERM received, finishing or parking the step in progress."""
        self._send("STOPPING=1")
