"""The single-daemon lease: at most one daemon works on a database at a time.

The lease is the one row of table ``lease`` (created by the first migration):
``holder`` ("host:pid" of the daemon, None when free), ``acquired_at``,
``heartbeat_at`` and ``timeout_s`` (the holder's own ``[daemon]
lease_timeout_s``). A daemon acquires it at start, renews it (heartbeat) well
within its timeout, and releases it when it stops. A lease whose heartbeat is
older than the larger of the holder's and the newcomer's timeouts belongs to a
daemon that died (or hangs) and may be taken over: a newcomer started with a
smaller timeout cannot declare a healthy holder dead. So does a lease whose
holder names this host and a process that no longer exists (killed without
releasing it). `lease_health` is that one rule; the daemon (`acquire_lease`),
``malleable status`` and ``malleable db downgrade`` all judge the lease by it.

Atomicity: acquiring reads the row, then makes ONE conditional ``UPDATE ...
WHERE holder IS NULL OR holder = me OR (holder = the holder read AND
heartbeat_at = the heartbeat read, which is older than the cutoff)``: a
compare-and-swap on the heartbeat seen, so a holder that renews in between, or
a second daemon racing for the same stale lease, makes the UPDATE change
nothing. On SQLite the statement runs under the database's single write lock
(``BEGIN IMMEDIATE``); on PostgreSQL the row lock makes the second UPDATE
re-check its condition against the first one's committed row (READ
COMMITTED), see that the holder changed, and change nothing. Heartbeat and release update the row only ``WHERE holder = me``, so
a daemon whose lease was taken over learns it (`LeaseLost`) instead of
silently stealing it back.

Times come from the caller's clock (``now``; default the wall clock in UTC).
Daemons on different hosts sharing a PostgreSQL database must keep their
clocks in sync (NTP) well within the timeout.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from malleable.db.engine import readonly_engine
from malleable.db.errors import LeaseHeld, LeaseLost
from malleable.db.models import Lease

LEASE_ID = 1


def default_holder() -> str:
    """This process's lease identity: "host:pid"."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class LeaseInfo:
    """The lease row as read: holder ("host:pid" or None), acquired_at, heartbeat_at (UTC),
    timeout_s (the holder's own lease timeout in seconds; None: free, or taken before
    revision 0003)."""

    holder: str | None
    acquired_at: datetime | None
    heartbeat_at: datetime | None
    timeout_s: float | None = None

    @classmethod
    def of(cls, row: Any) -> LeaseInfo:
        """From anything with the lease's columns as attributes (a `Lease`, a result row);
        None (no row) is a free lease."""
        if row is None:
            return cls(None, None, None)
        return cls(row.holder, row.acquired_at, row.heartbeat_at, row.timeout_s)

    def is_stale(self, now: datetime, timeout_s: float) -> bool:
        """True when the lease is not live at ``now`` by `lease_health` (free, or its holder
        is stale) for a caller whose own timeout is ``timeout_s`` seconds."""
        return not lease_health(self, now, timeout_s).live


HealthState = Literal["healthy", "stale", "absent"]


@dataclass(frozen=True)
class LeaseHealth:
    """The lease judged at one time by `lease_health`.

    Attributes:
        state: "healthy" (a holder that is live), "stale" (a holder that is not: it
            died or hangs, and the lease may be taken over) or "absent" (no holder).
        holder: "host:pid", None when absent.
        acquired_at: when the holder took the lease (aware UTC), or None.
        heartbeat_at: the holder's last heartbeat (aware UTC), or None.
        heartbeat_age_s: seconds from ``heartbeat_at`` to the time judged at (None without
            a heartbeat; negative when the holder's clock is ahead).
        timeout_s: the timeout applied, seconds: the larger of the caller's and the
            holder's stored one.
        holder_gone: the holder names this host and a pid that no longer exists
            (`dead_local_holder`); the lease is then stale whatever its heartbeat.
    """

    state: HealthState
    holder: str | None
    acquired_at: datetime | None
    heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    timeout_s: float
    holder_gone: bool

    @property
    def live(self) -> bool:
        """Whether a daemon holds the lease and must be left alone (state "healthy")."""
        return self.state == "healthy"


def lease_health(lease: LeaseInfo, now: datetime, timeout_s: float) -> LeaseHealth:
    """Judge ``lease`` at ``now``: the one liveness rule of the lease.

    A holder is live when its heartbeat is at most ``max(timeout_s, lease.timeout_s)``
    seconds old at ``now`` and it is not a process of this host that no longer exists
    (`dead_local_holder`). The larger timeout: a caller configured with a smaller
    timeout than the holder's cannot declare a holder that heartbeats on its own
    schedule dead.

    Args:
        lease: the lease as read (`read_lease`, or `LeaseInfo.of` a row).
        now: the time to judge at (aware UTC datetime).
        timeout_s: the caller's ``[daemon] lease_timeout_s``, seconds.

    Returns:
        The state ("healthy", "stale" or "absent") with the facts it was judged on.
    """
    limit = max(float(timeout_s), float(lease.timeout_s or 0.0))
    beat = lease.heartbeat_at
    age = None if beat is None else (now - beat).total_seconds()
    gone = lease.holder is not None and dead_local_holder(lease.holder)
    state: HealthState
    if lease.holder is None:
        state = "absent"
    elif gone or age is None or age > limit:
        state = "stale"
    else:
        state = "healthy"
    return LeaseHealth(state, lease.holder, lease.acquired_at, beat, age, limit, gone)


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def _ensure_row(conn: Connection) -> None:
    """Insert the lease row if missing (the first migration does; someone may have deleted it)."""
    dialect = conn.dialect.name
    if dialect in ("sqlite", "postgresql"):
        ins = sqlite_insert if dialect == "sqlite" else pg_insert
        conn.execute(ins(Lease).values(id=LEASE_ID, holder=None)
                     .on_conflict_do_nothing(index_elements=["id"]))
    elif conn.execute(select(Lease.id).where(Lease.id == LEASE_ID)).first() is None:
        conn.execute(Lease.__table__.insert().values(id=LEASE_ID, holder=None))


def dead_local_holder(holder: str) -> bool:
    """Whether a lease holder "host:pid" names this host and a pid that does not exist
    (a daemon killed without releasing its lease; its heartbeat is not stale yet)."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False


_COLUMNS = (Lease.holder, Lease.acquired_at, Lease.heartbeat_at, Lease.timeout_s)


def read_lease(engine: Engine) -> LeaseInfo:
    """The lease as it is now (holder None: free).

    Raises:
        DatabaseUnavailable: the database cannot be read.
    """
    with readonly_engine(engine).connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(Lease.id == LEASE_ID)).first()
        conn.rollback()
    return LeaseInfo.of(row)


def acquire_lease(engine: Engine, holder: str, *, timeout_s: float,
                  now: datetime | None = None, dead_holder: str | None = None) -> LeaseInfo:
    """Take the lease for ``holder``, if it is free, already ours, or not live
    (`lease_health`: its heartbeat is older than the larger of ``timeout_s`` and the
    holder's stored timeout, or the holder is a process of this host that is gone).

    Args:
        engine: the state store.
        holder: this daemon's identity, "host:pid" (`default_holder`).
        timeout_s: ``[daemon] lease_timeout_s``, seconds: stored with the lease as this
            holder's timeout, and the caller's timeout for `lease_health`.
        now: the caller's clock (aware UTC datetime); default the wall clock.
        dead_holder: a holder the caller knows is dead: if it still holds the lease, the
            lease is taken over at once, whatever its heartbeat (still as a
            compare-and-swap on what was read).

    Returns:
        The lease as now held by ``holder``.

    Raises:
        LeaseHeld: another holder's heartbeat is fresh; the message names the
            holder, its last heartbeat (and how long ago that was) and the timeout
            after which it may be taken over.
        DatabaseUnavailable: the database cannot be written.
    """
    now = _now(now)
    with engine.begin() as conn:
        _ensure_row(conn)
        seen = LeaseInfo.of(conn.execute(select(*_COLUMNS).where(Lease.id == LEASE_ID)).one())
        free = or_(Lease.holder.is_(None), Lease.holder == holder, Lease.heartbeat_at.is_(None))
        stale = (seen.holder is not None and seen.heartbeat_at is not None
                 and (not lease_health(seen, now, timeout_s).live
                      or (dead_holder is not None and seen.holder == dead_holder)))
        if stale:   # compare-and-swap on what was read
            free = or_(free, (Lease.holder == seen.holder)
                       & (Lease.heartbeat_at == seen.heartbeat_at))
        won = conn.execute(
            update(Lease).where(Lease.id == LEASE_ID, free)
            .values(holder=holder, acquired_at=now, heartbeat_at=now, timeout_s=timeout_s)
        ).rowcount
        row = LeaseInfo.of(conn.execute(select(*_COLUMNS).where(Lease.id == LEASE_ID)).one())
    if won == 1:
        return row
    h = lease_health(row, now, timeout_s)
    raise LeaseHeld(
        f"another malleable daemon holds the lease: {row.holder}, last heartbeat "
        f"{row.heartbeat_at.isoformat(timespec='seconds')} ({h.heartbeat_age_s:.0f} s ago; "
        f"it may be taken over after {h.timeout_s:.0f} s without one)",
        holder=row.holder, heartbeat_at=row.heartbeat_at, acquired_at=row.acquired_at)


def heartbeat_lease(engine: Engine, holder: str, *, now: datetime | None = None) -> None:
    """Renew ``holder``'s lease (set its heartbeat to ``now``).

    Raises:
        LeaseLost: ``holder`` no longer holds the lease (taken over or released);
            the daemon must stop acting.
        DatabaseUnavailable: the database cannot be written.
    """
    now = _now(now)
    with engine.begin() as conn:
        n = conn.execute(update(Lease).where(Lease.id == LEASE_ID, Lease.holder == holder)
                         .values(heartbeat_at=now)).rowcount
        if n != 1:
            row = conn.execute(select(Lease.holder).where(Lease.id == LEASE_ID)).first()
    if n != 1:
        other = row.holder if row is not None and row.holder else "nobody"
        raise LeaseLost(f"lease of {holder} lost: it is now held by {other}")


def release_lease(engine: Engine, holder: str) -> bool:
    """Give up ``holder``'s lease. Returns False if ``holder`` did not hold it (nothing changed).

    Raises:
        DatabaseUnavailable: the database cannot be written.
    """
    with engine.begin() as conn:
        n = conn.execute(update(Lease).where(Lease.id == LEASE_ID, Lease.holder == holder)
                         .values(holder=None, heartbeat_at=None, acquired_at=None)).rowcount
    return n == 1
