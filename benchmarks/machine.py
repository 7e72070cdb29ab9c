"""How fast this machine is right now: a fixed CPU reference for benchmark headers.

The VM's speed varies between sessions (the same simulator run, with the same
decisions, took 13.4 s at 07:50Z and 33.1 s at 12:40Z on 2026-12-02, nothing
else running either time), so a wall time is only comparable with another one taken at a
similar reference. `reference()` times two fixed workloads, best of three:

* ``python_ms``: a pure-Python loop of 2,000,000 integer additions (the
  interpreter-bound part of the daemon's cycle: SQLAlchemy, the reconciler);
* ``numpy_ms``: 500 steps of four small-array operations on a (64, 16)
  array (the estimators' and policies' per-call overhead).
"""

from __future__ import annotations

import time

import numpy as np


def _python_loop() -> int:
    s = 0
    for i in range(2_000_000):
        s += i
    return s


def _numpy_small() -> float:
    a = np.linspace(0.0, 1.0, 64 * 16).reshape(64, 16)
    acc = 0.0
    for _ in range(500):
        b = np.exp(-a) * a
        acc += float(np.where(b > 0.1, b, 0.0).sum(axis=1).max())
    return acc


def _best_ms(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def reference() -> dict[str, float]:
    """Milliseconds (best of 3) of the two fixed workloads: ``python_ms``, ``numpy_ms``."""
    return {"python_ms": _best_ms(_python_loop), "numpy_ms": _best_ms(_numpy_small)}


def reference_line() -> str:
    """One header line: the reference times (lower is a faster machine)."""
    r = reference()
    return (f"# machine reference (best of 3; lower is faster): 2e6-addition Python loop "
            f"{r['python_ms']:.0f} ms, 500 small numpy steps {r['numpy_ms']:.1f} ms")


if __name__ == "__main__":
    print(reference_line())
