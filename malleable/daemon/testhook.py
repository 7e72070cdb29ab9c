"""TEST HOOK (off by default): kill the daemon at a named point of the actuator.

The crash tests (tests/integration/test_daemon_crash.py) must SIGKILL the
daemon at exact points of an action's state machine, which timing alone
cannot hit. With the environment variable ``MALLEABLE_TEST_CRASH_AT`` set, the
service gives the actuator a `CrashPoints` hook; the actuator calls it at every
point below, and the hook sends SIGKILL to its own process (a real crash: no
``finally``, no atexit, no lease release) when the point is listed.

A point is ``<kind>.<step>:<phase>``, e.g. ``requeue.requeue_hold:after``:

* for a step that makes a Slurm call (signal, requeue_hold, resize, start_now,
  release, shrink, hold): ``before`` fires after the attempt is committed to the
  database and before the call; ``after`` fires after the call returned and
  before the next step is committed;
* for a step that waits (wait_checkpoint, observe): ``before`` fires when the
  step is found waiting; ``after`` fires right after the transition out of it
  is committed.

The variable holds one or more points separated by commas; the first one
reached kills the process (the test restarts the daemon with the rest). When
the variable is unset the service installs no hook, and the actuator's hook is
None (also in the simulator, which never reads the environment).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

log = logging.getLogger(__name__)

ENV = "MALLEABLE_TEST_CRASH_AT"
PHASES = ("before", "after")


class CrashPoints:
    """A step hook that SIGKILLs this process at any of ``points``.

    Args:
        points: ``{"<kind>.<step>:<phase>", ...}``.

    Raises:
        ValueError: a point that is not of the form ``kind.step:before|after``.
    """

    def __init__(self, points: set[str]) -> None:
        for p in points:
            where, _, phase = p.partition(":")
            kind, _, step = where.partition(".")
            if not (kind and step and phase in PHASES):
                raise ValueError(f"{ENV}: {p!r} is not of the form <kind>.<step>:before|after")
        self.points = frozenset(points)

    def __call__(self, kind: str, step: str, phase: str) -> None:
        """Called by the actuator at each point; kills the process when it is listed."""
        point = f"{kind}.{step}:{phase}"
        if point in self.points:
            log.error("test hook %s: SIGKILL at %s", ENV, point)
            for h in logging.getLogger("malleable").handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def crash_points_from_env(env: Mapping[str, str] | None = None) -> CrashPoints | None:
    """The hook configured by ``MALLEABLE_TEST_CRASH_AT``, or None when unset or empty.

    Raises:
        ValueError: a malformed point (the daemon then refuses to start, exit 2).
    """
    raw = (os.environ if env is None else env).get(ENV, "")
    points = {p.strip() for p in raw.split(",") if p.strip()}
    if not points:
        return None
    log.warning("test hook %s is set: this daemon kills itself at %s", ENV,
                ", ".join(sorted(points)))
    return CrashPoints(points)
