"""``malleable config show [--defaults]``: the effective configuration, and the documented defaults.

Everything comes from the field metadata of `malleable.config` (type,
default, ``doc``, ``choices``), so this command, docs/configuration.md (its
``--defaults --markdown`` output, checked by a test) and the code cannot
disagree. The text views are TOML: ``config show --defaults`` is a commented
starting point for /etc/malleable/malleable.toml, ``config show`` the file
the daemon effectively runs with (keys that differ from the default say so).
A database URL's password is never printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from malleable.config import ENV_CONFIG, ENV_DATABASE_URL, Config, check_policy, sections
from malleable.ops.access import effective_config
from malleable.ops.output import BadInput, emit, handle_errors, json_option

SCHEMA = "malleable.config/1"
SCHEMA_DEFAULTS = "malleable.config-defaults/1"


def _hide_password(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is not None and type(None) in typing.get_args(tp):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return {int: "integer", float: "number", str: "string", bool: "boolean",
            list: "array", dict: "table"}.get(typing.get_origin(tp) or tp, str(tp))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _value(section: str, key: str, value: Any) -> Any:
    if section == "database" and key == "url":
        return _hide_password(value)
    return list(value) if isinstance(value, tuple) else value


def effective_doc(config: Config, env: dict | None = None) -> dict:
    """The ``malleable.config/1`` document: every key's effective value (password hidden)."""
    env = os.environ if env is None else env
    out: dict[str, dict] = {}
    for name in sections():
        sec = getattr(config, name)
        out[name] = {f.name: _value(name, f.name, getattr(sec, f.name))
                     for f in dataclasses.fields(sec)}
    return {"schema": SCHEMA, "source": config.source,
            "env": {ENV_CONFIG: env.get(ENV_CONFIG) or None,
                    ENV_DATABASE_URL: _hide_password(env[ENV_DATABASE_URL])
                    if env.get(ENV_DATABASE_URL) else None},
            "sections": out}


def defaults_doc() -> dict:
    """The ``malleable.config-defaults/1`` document: every key's type, default and meaning."""
    out: dict[str, dict] = {}
    for name, cls in sections().items():
        hints = typing.get_type_hints(cls)
        out[name] = {"doc": (cls.__doc__ or "").strip(), "keys": {
            f.name: {"type": _type_name(hints[f.name]), "default": _value(name, f.name,
                                                                          _default(f)),
                     "doc": f.metadata.get("doc", ""),
                     "choices": list(f.metadata["choices"]) if "choices" in f.metadata else None}
            for f in dataclasses.fields(cls)}}
    return {"schema": SCHEMA_DEFAULTS, "sections": out}


def toml_value(v: Any) -> str:
    """A value as a TOML literal (strings JSON-quoted, which TOML accepts)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {v!r}")


def render_effective(doc: dict) -> str:
    """The effective configuration as TOML, each changed key followed by its default."""
    defaults = defaults_doc()["sections"]
    lines = [f"# effective malleable configuration, read from {doc['source']}"]
    if doc["env"][ENV_DATABASE_URL]:
        lines.append(f"# [database] url comes from ${ENV_DATABASE_URL}")
    for name, keys in doc["sections"].items():
        lines += ["", f"[{name}]"]
        for k, v in keys.items():
            d = defaults[name]["keys"][k]["default"]
            note = "" if v == d else f"  # default {toml_value(d)}"
            lines.append(f"{k} = {toml_value(v)}{note}")
    return "\n".join(lines)


def render_defaults(doc: dict) -> str:
    """The defaults as a commented TOML file (a starting point for malleable.toml)."""
    lines = ["# malleable configuration: every key with its default (docs/configuration.md).",
             "# Uncomment and change what your site needs; /etc/malleable/malleable.toml."]
    for name, sec in doc["sections"].items():
        lines += ["", f"# {sec['doc']}", f"[{name}]"]
        for k, meta in sec["keys"].items():
            lines.append(f"# {meta['doc']} ({meta['type']})")
            lines.append(f"#{k} = {toml_value(meta['default'])}")
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(doc: dict) -> str:
    """docs/configuration.md: the reference, generated from `malleable.config`."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `malleable config show --defaults --markdown` from the field",
        "     metadata of malleable/config.py; do not edit by hand (a test checks it). -->",
        "",
        "malleable reads one TOML file: `--config PATH` where a command has it, else",
        f"`${ENV_CONFIG}`, else `/etc/malleable/malleable.toml` (a missing default file means",
        "all defaults; a missing file that was named is an error; `simulate` reads only",
        "its `--config`, so a simulation does not depend on the machine's daemon settings).",
        "Every key is optional.",
        f"`${ENV_DATABASE_URL}` overrides `[database] url`, and `--database-url URL` of an",
        "admin command overrides both. An unknown section or key, or a value of the wrong",
        "type, is refused with a message naming the key and the value (exit 2), and so is",
        "a number outside the bounds in its row (nan and inf never pass), a relative path,",
        "a database URL of another backend than SQLite or PostgreSQL, or a metrics address",
        "that is not HOST:PORT: by every command that reads the file, by the daemon at start",
        "and on reload, and for the environment and `--database-url` overrides too.",
        "",
        "`malleable config show` prints the configuration in effect (as TOML, keys that differ",
        "from their default marked); `malleable config show --defaults` prints this reference",
        "as a commented TOML file to start from. The running daemon re-reads the file on",
        "`systemctl reload malleable` (SIGHUP; a bad file is refused and the old settings",
        "kept): intervals, `[policy]`, `[retention]` and the ingestion limits apply from the",
        "next cycle; `[database]`, `[slurm]`, `[progress] spool_dir`, `[daemon] dry_run` and",
        "`[metrics]` take effect at the next restart.",
        "",
        "Example (`/etc/malleable/malleable.toml`):",
        "",
        "```toml",
        "[policy]",
        'name = "pollux"',
        "",
        "[operator]",
        'group = "hpc-ops"',
        "",
        "[metrics]",
        'address = "127.0.0.1:9464"',
        "```",
    ]
    for name, sec in doc["sections"].items():
        lines += ["", f"## `[{name}]`", "", sec["doc"], "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        for k, meta in sec["keys"].items():
            doc_ = meta["doc"] + (f" (one of {', '.join(meta['choices'])})"
                                  if meta["choices"] else "")
            lines.append(f"| `{k}` | {meta['type']} | `{toml_value(meta['default'])}` | "
                         f"{_md_cell(doc_)} |")
    return "\n".join(lines) + "\n"


@click.group("config")
def config() -> None:
    """Show malleable's configuration."""


@config.command("show")
@click.option("--config", "config_path", metavar="PATH", default=None,
              type=click.Path(dir_okay=False),
              help="configuration file (default $MALLEABLE_CONFIG or "
                   "/etc/malleable/malleable.toml).")
@click.option("--database-url", "database_url", metavar="URL", default=None,
              help="SQLAlchemy URL of the database (overrides [database] url).")
@click.option("--defaults", is_flag=True,
              help="Print every key's default, type and meaning instead.")
@click.option("--markdown", is_flag=True,
              help="With --defaults: print docs/configuration.md.")
@json_option
@handle_errors
def show(config_path: str | None, database_url: str | None, defaults: bool, markdown: bool,
         as_json: bool) -> None:
    """Print the effective configuration (TOML), or with --defaults the documented defaults.

    A configuration the daemon would refuse (a bad value, or a [policy] that cannot be
    built) is refused the same way: one line naming the key and the value, exit 2."""
    if markdown and (not defaults or as_json):
        raise BadInput("--markdown: only with --defaults and without --json")
    if defaults:
        doc = defaults_doc()
        emit(doc, as_json, render_markdown if markdown else render_defaults)
        return
    config = effective_config(config_path, database_url)
    # Refused as the daemon refuses it at start: a configuration that names an unusable
    # policy is not one a daemon runs with (status and policy show report it as a PROBLEM).
    check_policy(config)
    emit(effective_doc(config), as_json, render_effective)
