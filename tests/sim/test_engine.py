"""The discrete-event engine: ordering, cancellation, run(until), clock views."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from malleable.sim.engine import DEFAULT_EPOCH, PRIORITY_LATE, PRIORITY_URGENT, Engine


def test_events_run_in_time_then_priority_then_schedule_order():
    eng = Engine()
    seen: list[str] = []
    eng.schedule(5.0, seen.append, "t5-normal-first")
    eng.schedule(5.0, seen.append, "t5-late", priority=PRIORITY_LATE)
    eng.schedule(5.0, seen.append, "t5-urgent", priority=PRIORITY_URGENT)
    eng.schedule(5.0, seen.append, "t5-normal-second")
    eng.schedule(1.0, seen.append, "t1")
    eng.run()
    assert seen == ["t1", "t5-urgent", "t5-normal-first", "t5-normal-second", "t5-late"]
    assert eng.now == 5.0
    assert eng.events_processed == 5


def test_callbacks_can_schedule_at_the_same_instant_and_later():
    eng = Engine()
    seen: list[tuple[float, str]] = []

    def first() -> None:
        seen.append((eng.now, "first"))
        eng.schedule_in(0.0, lambda: seen.append((eng.now, "same instant")))
        eng.schedule_in(2.5, lambda: seen.append((eng.now, "later")))

    eng.schedule(1.0, first)
    eng.run()
    assert seen == [(1.0, "first"), (1.0, "same instant"), (3.5, "later")]


def test_cancelled_events_are_skipped_and_not_counted():
    eng = Engine()
    seen: list[int] = []
    ev = eng.schedule(2.0, seen.append, 2)
    eng.schedule(3.0, seen.append, 3)
    ev.cancel()
    ev.cancel()  # idempotent
    assert eng.peek() == 3.0
    eng.run()
    assert seen == [3]
    assert eng.events_processed == 1


def test_run_until_stops_at_the_horizon_and_keeps_later_events():
    eng = Engine()
    seen: list[float] = []
    for t in (1.0, 2.0, 2.0, 7.0):
        eng.schedule(t, lambda: seen.append(eng.now))
    eng.run(until=2.0)
    assert seen == [1.0, 2.0, 2.0]
    assert eng.now == 2.0
    eng.run(until=5.0)
    assert eng.now == 5.0 and seen == [1.0, 2.0, 2.0]
    assert eng.peek() == 7.0
    eng.run()
    assert seen[-1] == 7.0
    assert eng.step() is False
    assert eng.peek() == math.inf


def test_scheduling_in_the_past_or_at_infinity_is_refused():
    eng = Engine()
    eng.schedule(10.0, lambda: None)
    eng.run()
    with pytest.raises(ValueError, match="clock is at 10.0"):
        eng.schedule(9.0, lambda: None)
    with pytest.raises(ValueError):
        eng.schedule(math.inf, lambda: None)
    with pytest.raises(ValueError):
        eng.schedule(math.nan, lambda: None)
    with pytest.raises(ValueError, match="delay must be >= 0"):
        eng.schedule_in(-1.0, lambda: None)
    with pytest.raises(ValueError, match="before the clock"):
        eng.run(until=3.0)


def test_clock_views_are_unix_time_and_utc_datetimes():
    eng = Engine()
    assert eng.time() == DEFAULT_EPOCH
    eng.run(until=90.0)
    assert eng.time() == DEFAULT_EPOCH + 90.0
    assert eng.datetime_at() == datetime(2021, 1, 1, 0, 1, 30, tzinfo=UTC)
    assert eng.datetime_at(0.0) == datetime(2021, 1, 1, tzinfo=UTC)
    other = Engine(epoch=1_000_000.0)
    assert other.time() == 1_000_000.0
    with pytest.raises(ValueError, match="finite Unix time"):
        Engine(epoch=math.nan)
