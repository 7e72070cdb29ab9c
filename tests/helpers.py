"""Small helpers shared by tests (no fixtures here; those live in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout: float = 30.0, interval: float = 0.3,
               what: str = "condition") -> T:
    """Poll ``pred`` until it returns a truthy value; return it, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
