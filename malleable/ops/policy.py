"""``malleable policy show|set|list``: which policy decides, and with which parameters.

The active policy is ``[policy] name`` and ``params`` of the configuration
until an operator sets one with ``malleable policy set NAME [key=value ...]``;
that choice is stored in the state store (``settings.policy.name`` and
``policy.params``) and the running daemon uses it from its next decision, no
restart needed. ``set`` checks the name and every parameter against the
policy registry (`malleable.policies.registry.get_policy`: unknown names,
unknown parameters, wrong types and out-of-range values are refused with exit
2) before storing anything. Values are TOML literals (``p=0.7``,
``continuous=true``, ``thresholds=[3600, 7200]``, ``p_from=samples``); a
word that is not a TOML literal is a string, and ``null`` means None.

``reset`` forgets the operator's choice: the configuration's ``[policy]``
applies again from the next decision. Both ``reset`` and ``set`` replace a
choice whose stored value is not valid JSON (a database edited by hand), which
``show`` and ``status`` refuse to read (exit 2, naming the key).

``set`` and ``reset`` need root or the operator group (`malleable.ops.auth`);
``show`` and ``list`` are read-only (``list`` does not open the database).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import socket
import tomllib
import types
import typing
from datetime import UTC, datetime
from typing import Any

import click
from click.shell_completion import CompletionItem

from malleable.db import store
from malleable.db.errors import CorruptSetting
from malleable.db.models import Setting
from malleable.ops.access import effective_config, open_store
from malleable.ops.auth import actor, caller, require_operator
from malleable.ops.output import (
    BadInput,
    emit,
    fmt_params,
    handle_errors,
    iso,
    json_option,
    safe_text,
    store_options,
    table,
)
from malleable.ops.status import check_settings, policy_doc, policy_problem_effect
from malleable.policies.registry import DEFAULT, available, get_policy, policy_class

SCHEMA_SHOW = "malleable.policy/1"
SCHEMA_LIST = "malleable.policy-list/1"


def parse_assignments(words: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``key=value`` words to a dict; values are TOML literals, else strings; ``null`` is None.

    Raises:
        BadInput: a word without ``=`` or with an empty key, or a key given twice.
    """
    out: dict[str, Any] = {}
    for w in words:
        key, sep, raw = w.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"parameter {w!r}: expected key=value (e.g. p=0.7)")
        if key in out:
            raise BadInput(f"parameter {key}: given twice")
        raw = raw.strip()
        if raw in ("null", "none", "None"):
            out[key] = None
            continue
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw
    return out


def validate_policy(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Check ``name`` and ``params`` through the registry; return every parameter's value
    (defaults filled in) as JSON values.

    Raises:
        BadInput: an unknown policy or parameter, a wrong type or an out-of-range value
            (the registry's message, which names it).
    """
    try:
        policy = get_policy(name, **params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return {f.name: _jsonable(getattr(policy.params, f.name))
            for f in dataclasses.fields(policy.params)}


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


_PARAM_LINE = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+?(?:=[^#]*)?(?:#\s*(.*))?$")


def _param_docs(cls: type) -> dict[str, str]:
    """The trailing comments of a ``Params`` class's fields (their only documentation)."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    docs = {}
    for line in src.splitlines()[1:]:
        m = _PARAM_LINE.match(line)
        if m and m.group(2):
            docs.setdefault(m.group(1), m.group(2).strip())
    return docs


def _type_name(tp: Any) -> str:
    """A parameter's type as `policy set` takes it: ``float``, ``"a" | "b"`` for a
    choice, ``float | null``, ``[float, ...]`` for a list."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (tuple, list):
        return f"[{_type_name(args[0])}, ...]" if args else "list"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def policy_catalog() -> list[dict]:
    """Every registered policy with its summary and parameters (name, type, default, doc)."""
    out = []
    for name in available():
        cls = policy_class(name)
        params_cls = cls.Params
        hints = typing.get_type_hints(params_cls)
        docs = _param_docs(params_cls)
        doc = (inspect.getdoc(cls) or "").strip().splitlines()
        out.append({
            "name": name, "alias_of": DEFAULT if name == "default" else None,
            "class": f"{cls.__module__}:{cls.__name__}",
            "summary": doc[0] if doc else "",
            "params": [{"name": f.name, "type": _type_name(hints.get(f.name, Any)),
                        "default": _jsonable(f.default) if f.default is not dataclasses.MISSING
                        else None, "doc": docs.get(f.name, "")}
                       for f in dataclasses.fields(params_cls)]})
    return out


def show_doc(s, config, where: str) -> dict:
    """The ``malleable.policy/1`` document for the active policy."""
    p = policy_doc(s, config)
    updated = set_by = None
    if p["source"] == "operator":
        check_settings(s, store.POLICY_BY_KEY)
        row = s.get(Setting, store.POLICY_NAME_KEY)
        updated = iso(row.updated_at) if row is not None else None
        who = store.operator_change(s, store.POLICY_BY_KEY, ("policy set",))
        if who is not None:
            set_by = f"{who['by']} on {who['host']}"
    try:
        effective = validate_policy(p["name"], p["params"])
        problem = None
    except BadInput as exc:
        effective, problem = None, str(exc)
    return {"schema": SCHEMA_SHOW, **p, "effective_params": effective, "problem": problem,
            "set_at": updated, "set_by": set_by,
            "config": {"name": config.policy.name, "params": dict(config.policy.params),
                       "source": config.source},
            "hysteresis": {"min_gain": config.policy.min_gain,
                           "cooldown_s": config.policy.cooldown_s,
                           "min_run_restarts": config.policy.min_run_restarts},
            "database": where, "changed": None, "by": None}


def render_show(doc: dict) -> str:
    """The text view of a ``malleable.policy/1`` document."""
    head = safe_text(doc["name"]) + (f" (= {safe_text(doc['resolved'])})"
                                     if doc["resolved"] != doc["name"] else "")
    if doc["changed"] is not None:
        # `set` leaves the operator as the source; only `reset` returns it to the config.
        verb = ("unchanged" if not doc["changed"] else
                "reset to the configuration's" if doc["source"] == "config" else "set")
        first = f"policy {verb}: {head} {fmt_params(doc['params'])}".rstrip() + (
            "; the daemon uses it from its next decision" if doc["changed"]
            else " (already in force: nothing to do)")
    else:
        first = f"policy: {head} {fmt_params(doc['params'])}".rstrip()
    src = ("set by " + safe_text(doc.get("set_by") or "an operator")
           + (f" at {doc['set_at']}" if doc["set_at"] else "")
           if doc["source"] == "operator"
           else f"from the configuration ({safe_text(doc['config']['source'])})")
    lines = [first, f"source: {src}"]
    if doc["effective_params"] is not None:
        lines.append(f"parameters in effect: {fmt_params(doc['effective_params']) or 'none'}")
    if doc["problem"]:
        lines.append(f"PROBLEM: {safe_text(doc['problem'])}; "
                     f"{policy_problem_effect(doc['source'])}")
    h = doc["hysteresis"]
    lines.append(f"hysteresis ([policy] in the configuration): min_gain {h['min_gain']}, "
                 f"cooldown_s {h['cooldown_s']}, min_run_restarts {h['min_run_restarts']}")
    return "\n".join(lines)


def render_list(doc: dict) -> str:
    """The text view of a ``malleable.policy-list/1`` document."""
    out = []
    for p in doc["policies"]:
        mark = " (active)" if p["name"] == doc["active"] else ""
        if p["alias_of"]:
            out.append(f"{p['name']}{mark}: alias of {p['alias_of']}, the recommended policy "
                       f"(docs/policies.md)")
            continue
        out.append(f"{p['name']}{mark}: {p['summary']}")
        if p["params"]:
            out.append(table(["  PARAMETER", "TYPE", "DEFAULT", "MEANING"],
                             [(f"  {x['name']}", x["type"], json.dumps(x["default"]),
                               x["doc"])
                              for x in p["params"]]))
        out.append("")
    return "\n".join(out)


def _complete_policy(ctx: click.Context, param: click.Parameter, incomplete: str):
    return [CompletionItem(n) for n in available() if n.startswith(incomplete)]


@click.group("policy")
def policy() -> None:
    """Show, list, set or reset the allocation policy."""


@policy.command("show")
@store_options
@json_option
@handle_errors
def show(config_path: str | None, database_url: str | None, as_json: bool) -> None:
    """Show the active policy, its parameters and who set it (read-only)."""
    config = effective_config(config_path, database_url)
    with open_store(config) as st, st.sessions() as s:
        doc = show_doc(s, config, st.where)
    emit(doc, as_json, render_show)


@policy.command("list")
@click.option("--config", "config_path", metavar="PATH", default=None,
              type=click.Path(dir_okay=False),
              help="configuration file (marks the configured policy as active).")
@json_option
@handle_errors
def list_(config_path: str | None, as_json: bool) -> None:
    """List the policies and their parameters (does not read the database)."""
    config = effective_config(config_path, None)
    doc = {"schema": SCHEMA_LIST, "default": DEFAULT, "active": config.policy.name,
           "policies": policy_catalog()}
    emit(doc, as_json, render_list)


@policy.command("set", epilog=f"NAME is one of: {', '.join(available())} ('default' is "
                              f"{DEFAULT}). `malleable policy list` shows each one's "
                              f"parameters and their defaults.")
@click.argument("name", shell_complete=_complete_policy)
@click.argument("assignments", nargs=-1, metavar="[KEY=VALUE]...")
@store_options
@json_option
@handle_errors
def set_(name: str, assignments: tuple[str, ...], config_path: str | None,
         database_url: str | None, as_json: bool) -> None:
    """Make NAME the active policy with the given parameters (from the next decision).

    Parameters not given take the policy's defaults. Needs root or the operator group
    ([operator] group); exit 1 otherwise; exit 2 for an unknown policy or a bad parameter.
    """
    config = effective_config(config_path, database_url)
    require_operator(config, "set the policy")
    params = parse_assignments(assignments)
    # Stored as the policy holds them (an integer given for a number is a float).
    params = {k: v for k, v in validate_policy(name, params).items() if k in params}
    with open_store(config, write=True) as st:
        with st.sessions() as s, s.begin():
            now = datetime.now(UTC)
            try:
                before = policy_doc(s, config)
                changed = (before["name"], before["params"], before["source"]) != \
                    (name, params, "operator")
            except CorruptSetting:   # a row edited by hand: overwritten here
                changed = True
            if changed:   # (the same choice again keeps when and by whom it was made)
                store.set_policy(s, name, params, now)
                store.record_operator_change(s, store.POLICY_BY_KEY, "policy set", actor(),
                                             socket.gethostname(), now)
        with st.sessions() as s:
            doc = show_doc(s, config, st.where)
    doc["changed"] = changed
    doc["by"] = caller()
    emit(doc, as_json, render_show)


@policy.command("reset")
@store_options
@json_option
@handle_errors
def reset(config_path: str | None, database_url: str | None, as_json: bool) -> None:
    """Go back to the configuration's policy ([policy] name and params) from the next decision.

    Undoes `malleable policy set`; nothing changes if no operator set a policy. Needs
    root or the operator group ([operator] group); exit 1 otherwise.
    """
    config = effective_config(config_path, database_url)
    require_operator(config, "reset the policy")
    with open_store(config, write=True) as st:
        with st.sessions() as s, s.begin():
            changed = store.clear_policy(s)
            if changed:
                store.record_operator_change(s, store.POLICY_BY_KEY, "policy reset", actor(),
                                             socket.gethostname(), datetime.now(UTC))
        with st.sessions() as s:
            doc = show_doc(s, config, st.where)
    doc["changed"] = changed
    doc["by"] = caller()
    emit(doc, as_json, render_show)
