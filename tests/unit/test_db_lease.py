"""The single-daemon lease on SQLite, with the caller's clock."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete

from malleable.config import Config
from malleable.db import schema
from malleable.db.cli import _live_holder
from malleable.db.engine import make_engine, session_factory
from malleable.db.errors import LeaseHeld, LeaseLost
from malleable.db.lease import (
    LeaseInfo,
    acquire_lease,
    default_holder,
    heartbeat_lease,
    lease_health,
    read_lease,
    release_lease,
)
from malleable.db.models import Lease
from malleable.ops.status import daemon_health

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMEOUT = 300.0


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/l.db")
    schema.upgrade(eng)
    yield eng
    eng.dispose()


def test_default_holder_is_host_pid():
    assert default_holder() == f"{socket.gethostname()}:{os.getpid()}"


def test_acquire_free_then_second_daemon_refused(engine):
    info = acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    assert (info.holder, info.acquired_at, info.heartbeat_at) == ("a:1", T0, T0)
    with pytest.raises(LeaseHeld) as ei:
        acquire_lease(engine, "b:2", timeout_s=TIMEOUT, now=T0 + timedelta(seconds=42))
    assert ei.value.holder == "a:1" and ei.value.heartbeat_at == T0
    assert str(ei.value).startswith("another malleable daemon holds the lease: a:1, "
                                    "last heartbeat 2026-01-01T00:00:00+00:00 (42 s ago")
    assert read_lease(engine).holder == "a:1"


def test_reacquire_by_same_holder_and_heartbeat_keeps_it_fresh(engine):
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0 + timedelta(seconds=10))
    heartbeat_lease(engine, "a:1", now=T0 + timedelta(seconds=290))
    with pytest.raises(LeaseHeld):   # 590 s after acquiring, but only 300 s after heartbeat
        acquire_lease(engine, "b:2", timeout_s=TIMEOUT, now=T0 + timedelta(seconds=590))
    assert read_lease(engine).heartbeat_at == T0 + timedelta(seconds=290)


def test_stale_lease_is_taken_over_and_old_holder_learns_it(engine):
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    late = T0 + timedelta(seconds=TIMEOUT + 1)
    assert read_lease(engine).is_stale(late, TIMEOUT)
    info = acquire_lease(engine, "b:2", timeout_s=TIMEOUT, now=late)
    assert info.holder == "b:2" and info.acquired_at == late
    with pytest.raises(LeaseLost, match="lease of a:1 lost: it is now held by b:2"):
        heartbeat_lease(engine, "a:1", now=late)
    assert not release_lease(engine, "a:1")        # cannot release what it lost
    assert read_lease(engine).holder == "b:2"


def test_a_newcomer_with_a_smaller_timeout_cannot_take_a_healthy_lease(engine):
    """A second daemon with lease_timeout_s = 0.5 once took the lease from a healthy
    daemon (heartbeat every 100 s of its 300 s), which then stopped: staleness is now
    judged by the larger of the two timeouts."""
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    heartbeat_lease(engine, "a:1", now=T0 + timedelta(seconds=100))
    with pytest.raises(LeaseHeld, match=r"\(50 s ago; it may be taken over after 300 s"):
        acquire_lease(engine, "b:2", timeout_s=0.5, now=T0 + timedelta(seconds=150))
    assert read_lease(engine).holder == "a:1"
    heartbeat_lease(engine, "a:1", now=T0 + timedelta(seconds=200))   # still its lease
    # Once the holder's own timeout has passed without a heartbeat, the newcomer may take it.
    late = T0 + timedelta(seconds=200 + TIMEOUT + 1)
    assert acquire_lease(engine, "b:2", timeout_s=0.5, now=late).holder == "b:2"
    # and the new holder's timeout (0.5 s) is what a third daemon is held to, with its own
    with pytest.raises(LeaseHeld):
        acquire_lease(engine, "c:3", timeout_s=0.1, now=late + timedelta(seconds=0.3))
    assert acquire_lease(engine, "c:3", timeout_s=0.1,
                         now=late + timedelta(seconds=0.6)).holder == "c:3"


def test_a_dead_holder_is_taken_over_at_once_with_the_real_timeout_stored(engine):
    """The daemon takes over at once from a holder it knows is dead (a process of this
    host that no longer exists), however long that holder's timeout; it used to pass a
    timeout of 0, which the stored holder timeout now overrides."""
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    soon = T0 + timedelta(seconds=2)
    with pytest.raises(LeaseHeld):
        acquire_lease(engine, "b:2", timeout_s=30, now=soon)
    with pytest.raises(LeaseHeld):      # naming some other holder as dead changes nothing
        acquire_lease(engine, "b:2", timeout_s=30, now=soon, dead_holder="x:9")
    assert acquire_lease(engine, "b:2", timeout_s=30, now=soon, dead_holder="a:1").holder == "b:2"
    with pytest.raises(LeaseHeld):      # the new holder's own 30 s, not 0, protects it
        acquire_lease(engine, "c:3", timeout_s=0.5, now=soon + timedelta(seconds=10))


def test_release_frees_the_lease(engine):
    acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0)
    assert release_lease(engine, "a:1")
    assert read_lease(engine).holder is None
    assert acquire_lease(engine, "b:2", timeout_s=TIMEOUT, now=T0).holder == "b:2"


def test_missing_row_is_recreated(engine):
    with engine.begin() as conn:
        conn.execute(delete(Lease))
    assert read_lease(engine).holder is None
    assert acquire_lease(engine, "a:1", timeout_s=TIMEOUT, now=T0).holder == "a:1"


def test_lease_health_applies_the_larger_timeout_and_a_gone_local_holder():
    """One rule: live = heartbeat age <= max(caller's timeout, holder's stored timeout)
    and the holder is not a process of this host that no longer exists."""
    lease = LeaseInfo("a:1", T0, T0, 300.0)
    h = lease_health(lease, T0 + timedelta(seconds=61), 60.0)
    assert (h.state, h.holder, h.heartbeat_age_s, h.timeout_s, h.holder_gone) == \
        ("healthy", "a:1", 61.0, 300.0, False)
    assert lease_health(lease, T0 + timedelta(seconds=300), 60.0).live      # <= is live
    assert lease_health(lease, T0 + timedelta(seconds=301), 60.0).state == "stale"
    assert lease_health(lease, T0 + timedelta(seconds=301), 600.0).timeout_s == 600.0
    assert lease_health(lease, T0 + timedelta(seconds=301), 600.0).live
    # Taken before revision 0003 (no stored timeout): the caller's alone.
    assert lease_health(LeaseInfo("a:1", T0, T0), T0 + timedelta(seconds=61), 60.0).state \
        == "stale"
    assert lease_health(LeaseInfo("a:1", T0, None, 300.0), T0, 60.0).state == "stale"
    free = lease_health(LeaseInfo(None, None, None), T0, 60.0)
    assert (free.state, free.holder, free.heartbeat_age_s, free.live) == \
        ("absent", None, None, False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    h = lease_health(LeaseInfo(f"{socket.gethostname()}:{gone.pid}", T0, T0, 300.0), T0, 60.0)
    assert (h.state, h.holder_gone) == ("stale", True)


@pytest.mark.parametrize("stored, caller, age, live", [
    (300.0, 60.0, 120.0, True),     # the holder's own timeout protects it
    (60.0, 300.0, 120.0, True),     # so does the caller's, if larger
    (60.0, 60.0, 120.0, False),
    (300.0, 300.0, 400.0, False),
])
def test_acquire_status_and_downgrade_judge_the_lease_alike(engine, stored, caller, age, live):
    """The three copies of the rule disagreed: `malleable status` used the configured
    timeout only, so it called a lease stale that no daemon could take over, and
    `db downgrade` the configured one without the gone-holder check."""
    now = datetime.now(UTC)
    acquire_lease(engine, "a:1", timeout_s=stored, now=now - timedelta(seconds=age))
    config = replace(Config(), daemon=replace(Config().daemon, lease_timeout_s=caller))
    with session_factory(engine)() as s:
        health = daemon_health(s, config, now)
    assert health["health"] == ("healthy" if live else "stale")
    assert health["lease_timeout_s"] == max(stored, caller)
    assert (_live_holder(engine, caller) is not None) == live
    if live:
        with pytest.raises(LeaseHeld):
            acquire_lease(engine, "b:2", timeout_s=caller, now=now)
    else:
        assert acquire_lease(engine, "b:2", timeout_s=caller, now=now).holder == "b:2"


def test_a_gone_local_holder_is_stale_for_acquire_status_and_downgrade(engine):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{socket.gethostname()}:{gone.pid}"
    now = datetime.now(UTC)
    acquire_lease(engine, dead, timeout_s=TIMEOUT, now=now)
    with session_factory(engine)() as s:
        health = daemon_health(s, Config(), now)
    assert (health["health"], health["holder_gone"]) == ("stale", True)
    assert _live_holder(engine, TIMEOUT) is None
    assert acquire_lease(engine, "b:2", timeout_s=TIMEOUT, now=now).holder == "b:2"
