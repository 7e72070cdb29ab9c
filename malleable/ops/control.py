"""``malleable pause`` and ``malleable resume``: stop the daemon from acting, and let it act again.

Paused, the daemon keeps polling, ingesting progress and deciding (decisions
are recorded, so ``malleable status`` and ``malleable plan`` still show what
it would do), but starts no new action; actions that have not touched their
job yet are abandoned, jobs it held for admission are released, and
checkpoint-requeues past the point of no return are completed, so a paused
cluster runs as plain Slurm (`malleable.daemon.cycle`). The setting lives in
the state store (``settings.paused``); the running daemon reads it every
cycle, so no restart or signal is needed.

Only root or the operator group may pause or resume (`malleable.ops.auth`).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

import click

from malleable.db import store
from malleable.ops.access import effective_config, open_store
from malleable.ops.auth import actor, caller, require_operator
from malleable.ops.output import emit, handle_errors, iso, json_option, store_options
from malleable.ops.status import daemon_health

SCHEMA = "malleable.pause/1"


def set_paused(config_path: str | None, database_url: str | None, paused: bool) -> dict:
    """Check the caller, set the pause state, return the ``malleable.pause/1`` document.

    Raises:
        Refused: the caller is neither root nor in the operator group.
        StoreError: the database cannot be opened or written.
    """
    config = effective_config(config_path, database_url)
    require_operator(config, "pause the daemon" if paused else "resume the daemon")
    now = datetime.now(UTC)
    with open_store(config, write=True) as st, st.sessions() as s, s.begin():
        # A pause state that is not valid JSON (edited by hand) is overwritten, as a change.
        was = None if store.corrupt_setting(s, [store.PAUSED_KEY]) else store.is_paused(s)
        store.set_paused(s, paused, now)
        if was != paused:
            store.record_operator_change(s, store.PAUSED_BY_KEY,
                                         "pause" if paused else "resume", actor(),
                                         socket.gethostname(), now)
        health = daemon_health(s, config, now)["health"]
    return {"schema": SCHEMA, "paused": paused, "changed": was != paused, "time": iso(now),
            "by": caller(), "uid": os.geteuid(), "database": st.where,
            "daemon_health": health}


def render_pause(doc: dict) -> str:
    """The text view of a ``malleable.pause/1`` document."""
    if doc["paused"]:
        head = "paused" if doc["changed"] else "already paused"
        return (f"{head}: from its next cycle the daemon observes and plans but starts no "
                f"action; it releases the jobs it held and completes requeues already past "
                f"their checkpoint. Undo with `malleable resume`." + _no_daemon(doc))
    head = "resumed" if doc["changed"] else "not paused"
    return f"{head}: the daemon applies its decisions from its next cycle." + _no_daemon(doc)


def _no_daemon(doc: dict) -> str:
    health = doc.get("daemon_health")
    if health in (None, "healthy"):
        return ""
    return (f" No healthy daemon holds the lease now (daemon {health}, see `malleable "
            f"status`): it takes effect when one runs.")


@click.command("pause")
@store_options
@json_option
@handle_errors
def pause(config_path: str | None, database_url: str | None, as_json: bool) -> None:
    """Stop the daemon from changing Slurm (it keeps observing and planning).

    Needs root or the operator group ([operator] group); exit 1 otherwise.
    """
    emit(set_paused(config_path, database_url, True), as_json, render_pause)


@click.command("resume")
@store_options
@json_option
@handle_errors
def resume(config_path: str | None, database_url: str | None, as_json: bool) -> None:
    """Let a paused daemon apply its decisions again.

    Needs root or the operator group ([operator] group); exit 1 otherwise.
    """
    emit(set_paused(config_path, database_url, False), as_json, render_pause)
