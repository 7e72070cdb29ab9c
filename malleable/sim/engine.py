"""A small discrete-event engine: a virtual clock and a heap of scheduled callbacks.

The contract (after SimPy's core, without its processes): `Engine.schedule`
puts a callback on the heap at a virtual time; `Engine.step` pops the earliest
event, moves the clock to its time and calls it; `Engine.run` steps until the
heap is empty or a time is reached. Events are ordered by
``(time, priority, sequence)``: earlier time first, then lower priority value,
then the order in which they were scheduled, so a run is deterministic.

The clock counts seconds from the start of the simulation (``now``, a float);
``epoch`` is the Unix time of ``now == 0`` so that records and progress lines
can carry wall-clock-like timestamps (`Engine.time`). Nothing here reads the
real clock.

Why not SimPy itself: `benchmarks/bench_sim_engine.py` measures both on the
simulator's pattern (1,000 jobs with one timed event each, one in ten events
cancelling and rescheduling another): SimPy 4.1.2 with callbacks is as fast as
this engine (time ratio 1.02), and in its process idiom 14 % slower
(``benchmarks/results/bench_sim_engine.txt``). Speed does not decide it; this
module is kept because it is under 200 lines with no dependency, cancels an
event in O(1) (SimPy has no cancel for a Timeout), and exposes the priority
tie-break and the Unix-time view the daemon's clock needs.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

#: Default Unix time of virtual time 0: 2021-01-01T00:00:00Z (fixed, so runs are reproducible).
DEFAULT_EPOCH = 1609459200.0

#: Priorities for events at the same instant (lower runs first).
PRIORITY_URGENT = -10   # state changes that others must see at the same instant
PRIORITY_NORMAL = 0
PRIORITY_LATE = 10      # passes that should see every change of the instant (scheduler)


class Event:
    """One scheduled callback; returned by `Engine.schedule` so it can be cancelled.

    Attributes:
        time: virtual time (s) at which it runs.
        priority: tie-breaker at equal time (lower first).
        cancelled: True after `cancel`; a cancelled event is skipped.
    """

    __slots__ = ("time", "priority", "callback", "args", "cancelled")

    def __init__(self, time: float, priority: int, callback: Callable[..., Any],
                 args: tuple[Any, ...]):
        self.time = time
        self.priority = priority
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Skip this event when its time comes (idempotent; O(1), lazily removed)."""
        self.cancelled = True

    def __repr__(self) -> str:
        name = getattr(self.callback, "__qualname__", repr(self.callback))
        state = " cancelled" if self.cancelled else ""
        return f"<Event t={self.time:.3f} p={self.priority} {name}{state}>"


class Engine:
    """Virtual clock plus event heap.

    Args:
        epoch: Unix time (s) of virtual time 0; default `DEFAULT_EPOCH`.

    Attributes:
        now: current virtual time, seconds since the start (float, never decreases).
        events_processed: callbacks run so far (cancelled events not counted).
    """

    def __init__(self, epoch: float = DEFAULT_EPOCH):
        if not math.isfinite(epoch):
            raise ValueError(f"Engine epoch must be a finite Unix time, got {epoch!r}")
        self.epoch = float(epoch)
        self.now = 0.0
        self.events_processed = 0
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()

    # ------------------------------------------------------------------ clock views

    def time(self) -> float:
        """The virtual clock as Unix seconds (``epoch + now``): a drop-in for `time.time`."""
        return self.epoch + self.now

    def datetime_at(self, t: float | None = None) -> datetime:
        """Virtual time ``t`` (default: now) as a timezone-aware UTC datetime."""
        return datetime.fromtimestamp(self.epoch + (self.now if t is None else t), tz=UTC)

    # ------------------------------------------------------------------ scheduling

    def schedule(self, at: float, callback: Callable[..., Any], *args: Any,
                 priority: int = PRIORITY_NORMAL) -> Event:
        """Run ``callback(*args)`` at virtual time ``at`` (seconds since the start).

        Raises:
            ValueError: ``at`` is before ``now`` or not finite.
        """
        if not (at >= self.now) or not math.isfinite(at):
            raise ValueError(f"cannot schedule at t={at!r}: the clock is at {self.now!r}")
        ev = Event(float(at), priority, callback, args)
        heapq.heappush(self._heap, (ev.time, priority, next(self._seq), ev))
        return ev

    def schedule_in(self, delay: float, callback: Callable[..., Any], *args: Any,
                    priority: int = PRIORITY_NORMAL) -> Event:
        """Run ``callback(*args)`` ``delay`` seconds from now (``delay >= 0``)."""
        if not (delay >= 0):
            raise ValueError(f"delay must be >= 0 s, got {delay!r}")
        return self.schedule(self.now + delay, callback, *args, priority=priority)

    def peek(self) -> float:
        """Time of the next pending (not cancelled) event, or ``inf`` if none."""
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def __len__(self) -> int:
        """Number of entries on the heap (cancelled ones included until popped)."""
        return len(self._heap)

    # ------------------------------------------------------------------ running

    def step(self) -> bool:
        """Advance the clock to the next event and run it; False if none is left."""
        heap = self._heap
        while heap:
            t, _, _, ev = heapq.heappop(heap)
            if ev.cancelled:
                continue
            self.now = t
            self.events_processed += 1
            ev.callback(*ev.args)
            return True
        return False

    def run(self, until: float | None = None) -> None:
        """Run events in order until none is left, or until virtual time ``until``.

        With ``until``, every event at ``t <= until`` runs and the clock ends at
        ``until`` (events scheduled for later stay on the heap).

        Raises:
            ValueError: ``until`` is before ``now``.
        """
        if until is None:
            while self.step():
                pass
            return
        if until < self.now:
            raise ValueError(f"run(until={until!r}) is before the clock ({self.now!r})")
        heap = self._heap
        while heap:
            t, _, _, ev = heap[0]
            if ev.cancelled:
                heapq.heappop(heap)
                continue
            if t > until:
                break
            heapq.heappop(heap)
            self.now = t
            self.events_processed += 1
            ev.callback(*ev.args)
        self.now = float(until)
