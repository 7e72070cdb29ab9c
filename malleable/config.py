"""Typed settings: /etc/malleable/malleable.toml, environment overrides, defaults.

Every setting is a field of a frozen dataclass below, with its type, default
and a one-line description (``metadata["doc"]``); `docs/configuration.md` is
generated from these (``malleable config show --defaults`` prints them).
`load_config` validates every key and value and raises `ConfigError` (one
line) naming the key, the value and what was expected: the type; for numbers
a finite value within the field's bounds (``metadata["gt"|"ge"|"le"]``,
written into the field's doc, so docs/configuration.md states them); for
strings and lists the field's check (``metadata["check"]``: absolute paths, a
supported SQLAlchemy URL, ``HOST:PORT``, a list of names). This module is the
one place a value is checked: every command (``config show``, the daemon at
start and on SIGHUP, the simulator) loads through it, and the environment
override gets the same check as the file. Nothing here imports another
malleable module (SQLAlchemy is imported when a database URL is checked).

Precedence, highest first: environment (``MALLEABLE_DATABASE_URL``), the TOML
file (``--config`` or ``$MALLEABLE_CONFIG`` or /etc/malleable/malleable.toml;
a missing default file is fine, a missing explicit file is an error), defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/malleable/malleable.toml")
ENV_CONFIG = "MALLEABLE_CONFIG"
ENV_DATABASE_URL = "MALLEABLE_DATABASE_URL"


class ConfigError(ValueError):
    """A configuration file or value is unusable; the message names key, value and expectation."""


DAY_S = 86400.0
SUPPORTED_DATABASE_BACKENDS = ("sqlite", "postgresql")
# A host is a name or an IPv4 address (letters, digits, '.', '-', '_'), or IPv6 in [].
_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]*)):(?P<port>\d{1,5})$")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def _bounds_text(md: dict) -> str:
    """The bounds of a numeric field in words, e.g. "> 0 and <= 86400"."""
    parts = []
    if md.get("gt") is not None:
        parts.append(f"> {_num(md['gt'])}")
    if md.get("ge") is not None:
        parts.append(f">= {_num(md['ge'])}")
    if md.get("le") is not None:
        parts.append(f"<= {_num(md['le'])}")
    return " and ".join(parts)


def _f(default: Any, doc: str, *, gt: float | None = None, ge: float | None = None,
       le: float | None = None, note: str = "", **kw: Any) -> Any:
    """A field with its doc; numeric bounds ``gt``/``ge``/``le`` are checked by `load_config`
    and appended to the doc ("; > 0 and <= 86400 (1 day)", ``note`` in parentheses).
    ``**kw`` goes to the metadata: ``choices`` (the allowed values), ``normalise`` (applied
    to a value of the right type before the choices are checked, e.g. ``str.upper``) and
    ``check`` (``(key, value) -> value``, raising `ConfigError`)."""
    md = {k: v for k, v in (("gt", gt), ("ge", ge), ("le", le)) if v is not None}
    if md:
        doc = f"{doc}; {_bounds_text(md)}" + (f" ({note})" if note else "")
    elif note:
        doc = f"{doc}; {note}"
    meta = {"doc": doc, **md, **kw}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------- string and list checks
# Each takes the key (for the message) and the value (type already checked) and returns
# the value, or raises ConfigError "KEY = VALUE: expected ...".


def parse_metrics_address(address: str, key: str = "metrics.address") -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host means every interface) to (host, port).

    Used by the configuration check and by the exporter when it binds.

    Raises:
        ConfigError: (a ValueError) not host:port, or a port outside 1..65535; the
            message names the key and the value.
    """
    m = _ADDRESS.match(address.strip())
    port = int(m.group("port")) if m else -1
    if m is None or not 1 <= port <= 65535:
        raise ConfigError(f"{key} = {address!r}: expected host:port, e.g. "
                          f"\"127.0.0.1:9464\" or \"[::1]:9464\" (\":9464\": every interface)")
    host = m.group("v6") or m.group("host") or "0.0.0.0"
    return host, port


def _check_metrics_address(key: str, value: str) -> str:
    if value:  # empty: no exporter
        parse_metrics_address(value, key)
    return value


def _check_absolute_path(key: str, value: str) -> str:
    if not value or not os.path.isabs(value):
        raise ConfigError(f"{key} = {value!r}: expected an absolute path, "
                          f"e.g. \"/var/spool/malleable/progress\"")
    return value


def _check_names(key: str, value: list) -> list:
    if not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{key} = {value!r}: expected a list of partition names "
                          f"(strings), e.g. [\"gpu\", \"a100\"]")
    return value


def check_database_url(key: str, value: str) -> str:
    """Refuse a database URL malleable cannot use; returns it unchanged.

    Accepted: an SQLAlchemy URL whose backend is one of `SUPPORTED_DATABASE_BACKENDS`;
    for SQLite, the database file as an absolute path (``sqlite:////ABS/PATH``, four
    slashes, no query parameters, no host, user or port: ``sqlite://rel.db`` names host
    ``rel.db`` and a database in memory; not a directory, not an SQLite URI ``file:``
    name), never in memory (``sqlite://``: the store must outlive the process; the
    simulator opens its own); never a NUL byte, and no control character (C0, DEL, C1)
    or U+FFFD in the percent-decoded database name, user, password or host. A password
    never appears in the message.

    Raises:
        ConfigError: ``KEY = URL: expected ...`` (one line).
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    example = "sqlite:////ABS/PATH.db or postgresql+psycopg://USER@HOST/DB"
    if "\x00" in value:   # no file name or connection string can hold one
        hidden = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", value)
        raise ConfigError(f"{key} = {hidden!r}: contains a NUL byte (\\x00), which no file "
                          f"name or database URL can hold")
    try:
        u = make_url(value)
    except (ArgumentError, ValueError):
        hidden = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", value)
        raise ConfigError(f"{key} = {hidden!r}: expected an SQLAlchemy URL, e.g. "
                          f"{example}") from None
    shown = u.render_as_string(hide_password=True)
    backend = u.get_backend_name()
    if backend not in SUPPORTED_DATABASE_BACKENDS:
        raise ConfigError(f"{key} = {shown!r}: database backend {backend!r} is not supported "
                          f"(expected {' or '.join(SUPPORTED_DATABASE_BACKENDS)}: {example})")
    if backend == "sqlite" and u.query:
        # SQLAlchemy passes them to sqlite3.connect: `mode=ro` without `uri=true` is taken
        # as part of the file name, `timeout=abc` is a traceback; malleable sets its own
        # options (WAL, the busy timeout) on every connection.
        given = "&".join(f"{k}={v}" for k, v in u.query.items())
        raise ConfigError(f"{key} = {shown!r}: query parameters (?{given}) are not supported "
                          f"in an SQLite URL (malleable sets the connection's options itself): "
                          f"expected sqlite:////ABS/PATH.db")
    if backend == "sqlite" and (u.host or u.username or u.port is not None):
        # sqlite://relative.db parses as host "relative.db" and no database: in memory.
        part = (f"host {u.host!r}" if u.host else f"user {u.username!r}" if u.username
                else f"port {u.port}")
        memory = " (so no file: a database in memory, lost at exit)" if not u.database else ""
        raise ConfigError(f"{key} = {shown!r}: an SQLite URL has no host, user or port, and "
                          f"this one has {part}{memory}: expected sqlite:////ABS/PATH.db "
                          f"(four slashes)")
    db = u.database or ""
    for part, text in (("database name", db), ("user", u.username), ("password", u.password),
                       ("host", u.host)):
        # The URL percent-decodes its parts: %00, %0A or %C2%85 reach the file name (or
        # the connection: a NUL in the password dropped the port), and bytes that are
        # not UTF-8 (%FF) become U+FFFD.
        bad = next((c for c in text or "" if ord(c) < 32 or 127 <= ord(c) <= 159
                    or c == "\ufffd"), None)
        if bad is not None:
            what = ("U+FFFD, what percent-encoded bytes that are not UTF-8 decode to"
                    if bad == "\ufffd" else f"the control character {bad!r}")
            raise ConfigError(f"{key} = {shown!r}: the {part} holds {what} (percent-decoded), "
                              f"which no file, database or connection should")
    if backend != "sqlite":
        return value
    shown = value   # (no user, so no password; render_as_string writes ':' as %3A)
    if db.startswith("file:"):
        # An SQLite URI file name is taken literally by SQLAlchemy (no uri=true): a
        # file named "file:..." in the working directory.
        raise ConfigError(f"{key} = {shown!r}: SQLite URI file names (file:...) are not "
                          f"supported: expected the SQLite file, sqlite:////ABS/PATH.db")
    if db in ("", ":memory:"):
        # (`config show` took it; every command that opens the store refused it)
        raise ConfigError(f"{key} = {shown!r}: an in-memory SQLite database: the state "
                          f"would vanish at exit and no other command could read it; give "
                          f"a file, sqlite:////ABS/PATH.db")
    if not os.path.isabs(db):
        raise ConfigError(f"{key} = {shown!r}: expected the SQLite file as an absolute path, "
                          f"sqlite:////ABS/PATH.db (four slashes; this one is relative to "
                          f"the working directory)")
    if db.endswith("/") or os.path.isdir(db):
        raise ConfigError(f"{key} = {shown!r}: names a directory ({db}); expected the "
                          f"SQLite file, sqlite:////ABS/PATH.db")
    return value


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the state store lives."""

    url: str = _f("sqlite:////var/lib/malleable/malleable.db",
                  "SQLAlchemy URL; sqlite:////ABS/PATH (default; four slashes) or postgresql+psycopg://...",
                  note="backend sqlite or postgresql; an SQLite file by its absolute path, "
                       "without query parameters",
                  check=check_database_url)
    busy_timeout_ms: int = _f(30000, "SQLite busy_timeout: how long a writer waits for a lock, "
                              "ms", ge=0, le=3_600_000, note="1 hour; 0: no wait")


@dataclass(frozen=True)
class SlurmConfig:
    """How to reach Slurm."""

    backend: str = _f("auto", "auto | cli | pyslurm (auto: pyslurm if it imports and matches)",
                      choices=("auto", "cli", "pyslurm"), normalise=str.lower,
                      note="any case, read as lower case")
    command_timeout_s: float = _f(30.0, "timeout of one Slurm command, seconds",
                                  gt=0, le=3600, note="1 hour")
    partitions: list = _f([], "partitions whose malleable jobs are managed; empty = all",
                          note="a list of names, e.g. [\"gpu\"]", check=_check_names)
    max_retries: int = _f(3, "retries of an unanswered Slurm call, with exponential back-off",
                          ge=0, le=10, note="0: no retry")


@dataclass(frozen=True)
class ProgressConfig:
    """Where jobs write progress and how it is read."""

    spool_dir: str = _f("/var/spool/malleable/progress", "directory of per-job progress files",
                        note="an absolute path", check=_check_absolute_path)
    max_bytes_per_job: int = _f(1 << 20, "bytes read per job per ingest cycle",
                                ge=1, le=1 << 30, note="1 GiB")
    max_future_s: float = _f(300.0, "a line timestamped further in the future is rejected, s",
                             ge=0, le=DAY_S, note="1 day")


@dataclass(frozen=True)
class DaemonConfig:
    """The service's schedule and limits."""

    poll_interval_s: float = _f(30.0, "how often Slurm is polled (one squeue per poll), s",
                                ge=1, le=DAY_S, note="1 day; a faster poll would load slurmctld")
    ingest_interval_s: float = _f(30.0, "how often progress files are read, s",
                                  ge=1, le=DAY_S, note="1 day")
    decide_interval_s: float = _f(60.0, "how often the policy runs and actions are applied, s",
                                  ge=1, le=DAY_S, note="1 day")
    housekeeping_interval_s: float = _f(3600.0, "how often retention runs, s",
                                        gt=0, le=7 * DAY_S, note="7 days")
    max_concurrent_requeues: int = _f(4, "checkpoint-requeues in flight at once",
                                      ge=1, le=1000)
    lease_timeout_s: float = _f(300.0, "a daemon lease older than this may be taken over, s",
                                ge=3, le=DAY_S,
                                note="1 day; the heartbeat runs every third of it")
    requeue_backoff_s: float = _f(600.0, "first back-off after a job fails to checkpoint, s "
                                  "(doubles each time)", gt=0, le=DAY_S, note="1 day")
    dry_run: bool = _f(False, "plan and log actions but change nothing in Slurm")
    log_level: str = _f("INFO", "DEBUG | INFO | WARNING | ERROR",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"), normalise=str.upper,
                        note="any case, read as upper case")


@dataclass(frozen=True)
class PolicyConfig:
    """Which policy decides, and how eagerly it changes running jobs."""

    name: str = _f("default", "policy name (see `malleable policy list`)")
    params: dict = _f({}, "policy parameters, e.g. {p = 0.7}")
    min_gain: float = _f(0.05, "a running job is changed only if the estimated relative gain "
                         "exceeds the restart cost by this fraction", ge=0, le=1,
                         note="0: any gain; 1: no grow can qualify")
    cooldown_s: float = _f(300.0, "no change to a job sooner than this after its last change, s",
                           ge=0, le=DAY_S, note="1 day; 0: no cool-down")
    min_run_restarts: float = _f(10.0, "a running job is preempted (to 0 GPUs) only after it has "
                                 "run this many times its restart cost since its last change, "
                                 "so preemptions take at most about 1/x of its time", ge=0,
                                 le=1000, note="0: no such lease, the cool-down alone")
    default_restart_cost_s: float = _f(60.0, "restart cost assumed before one is measured, s",
                                       ge=0, le=DAY_S, note="1 day")
    queue_depth: int = _f(100, "pending malleable jobs (started before or not) the policy "
                          "considers each cycle, oldest first; later ones stay held until "
                          "they move up (as Slurm's default_queue_depth)", ge=0, le=1_000_000,
                          note="0: every pending job")


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus exporter."""

    address: str = _f("", "host:port to serve /metrics on; empty = off",
                      note="port 1..65535; \"[::1]:9464\" for IPv6, \":9464\" every interface",
                      check=_check_metrics_address)


@dataclass(frozen=True)
class OperatorConfig:
    """Who may change what the daemon does."""

    group: str = _f("", "Unix group whose members may pause/resume/set policy (root always may)")


@dataclass(frozen=True)
class RetentionConfig:
    """How long history is kept."""

    finished_job_days: float = _f(30.0, "finished jobs older than this are pruned, days",
                                  gt=0, le=36500, note="100 years")
    progress_full_s: float = _f(3600.0, "progress samples younger than this are kept at full "
                                "resolution, s", gt=0, le=365 * DAY_S, note="365 days")
    progress_max_per_job: int = _f(2000, "progress samples kept per job after downsampling",
                                   ge=1, le=10_000_000)


@dataclass(frozen=True)
class Config:
    """All settings; each section is one table in the TOML file."""

    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    source: str = field(default="<defaults>", metadata={"doc": "where this config was read from"})


def _type_name(tp: Any) -> str:
    return {int: "integer", float: "number", str: "string", bool: "boolean",
            list: "array", dict: "table"}.get(tp, getattr(tp, "__name__", str(tp)))


def _check_value(key: str, value: Any, f: dataclasses.Field, tp: Any) -> Any:
    """One value of the file (or the environment), converted (int -> float) and checked.

    Raises:
        ConfigError: ``KEY = VALUE: expected ...``: the wrong type, not one of the
            choices, a number that is not finite or outside the field's bounds, or a
            string or list the field's check refuses.
    """
    # bool is an int in Python; TOML keeps them apart, and so do we.
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        shown, value = value, float(value)
    else:
        shown = value
    ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{key} = {value!r}: expected {_type_name(tp)}, "
                          f"got {_type_name(type(value))}")
    md = f.metadata
    normalise: Callable[[Any], Any] | None = md.get("normalise")
    if normalise is not None:   # e.g. a log level in any case: compared in upper case
        value = normalise(value)
    choices = md.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{key} = {shown!r}: expected one of {', '.join(choices)}")
    if tp in (int, float):
        what = "an integer" if tp is int else "a number"
        if tp is float and not math.isfinite(value):
            raise ConfigError(f"{key} = {shown!r}: expected a finite number"
                              + (f" {_bounds_text(md)}" if _bounds_text(md) else ""))
        bounds = md if any(k in md for k in ("gt", "ge", "le")) else {"ge": 0}
        if (("gt" in bounds and not value > bounds["gt"])
                or ("ge" in bounds and not value >= bounds["ge"])
                or ("le" in bounds and not value <= bounds["le"])):
            raise ConfigError(f"{key} = {shown!r}: expected {what} {_bounds_text(bounds)}")
    check: Callable[[str, Any], Any] | None = md.get("check")
    if check is not None:
        value = check(key, value)
    return value


def _build_section(name: str, cls: type, table: Any) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}]: expected a table, got {_type_name(type(table))}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key (known: {', '.join(fields)})")
    values = {k: _check_value(f"{name}.{k}", v, fields[k], _origin(hints[k]))
              for k, v in table.items()}
    return cls(**values)


def _origin(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is types.UnionType or origin is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return origin or tp


def sections() -> dict[str, type]:
    """Section name -> dataclass, in file order. Used by docs and `config show`."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name != "source"}


def parse_config(data: dict, source: str = "<dict>", env: dict | None = None) -> Config:
    """Build a validated `Config` from a parsed TOML document.

    Args:
        data: the TOML document as a dict of section tables.
        source: a label for error messages and `Config.source`.
        env: environment for overrides (default ``os.environ``).

    Raises:
        ConfigError: an unknown section or key, or a value of the wrong type, not finite,
            out of its field's range or refused by its check (also ``$MALLEABLE_DATABASE_URL``);
            one line naming the key and the value.
    """
    env = os.environ if env is None else env
    known = sections()
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{source}: [{unknown[0]}]: unknown section "
                          f"(known: {', '.join(known)})")
    built = {name: _build_section(name, cls, data.get(name, {})) for name, cls in known.items()}
    url = env.get(ENV_DATABASE_URL)
    if url:
        check_database_url(f"database.url (${ENV_DATABASE_URL})", url)
        built["database"] = dataclasses.replace(built["database"], url=url)
    return Config(**built, source=source)


def check_policy(config: Config) -> None:
    """Refuse a configuration whose ``[policy]`` cannot be built (unknown name, unknown or
    bad parameter).

    Raises:
        ConfigError: names ``policy.name`` or ``policy.params`` and the value.
    """
    from malleable.policies.registry import get_policy

    try:
        get_policy(config.policy.name, **dict(config.policy.params))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{config.source}: policy.name={config.policy.name!r}, "
                          f"policy.params={dict(config.policy.params)!r}: {exc}") from None


def load_config(path: str | os.PathLike | None = None, env: dict | None = None) -> Config:
    """Read, validate and return the configuration.

    Args:
        path: the TOML file; None means ``$MALLEABLE_CONFIG`` or the default path,
            and a missing default file means all defaults.
        env: environment for overrides (default ``os.environ``).

    Raises:
        ConfigError: ``path`` is empty, the file is unreadable or not TOML (message
            names the path and the line), or a value is invalid (message names the key
            and the value).
    """
    env = os.environ if env is None else env
    if path is not None and not str(path).strip():
        raise ConfigError(f"--config {str(path)!r}: empty path; give a TOML file, or leave "
                          f"--config out to read ${ENV_CONFIG} or {DEFAULT_CONFIG_PATH}")
    explicit = path is not None or bool(env.get(ENV_CONFIG))
    p = Path(path if path is not None else (env.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH))
    if not p.exists():
        if path is None and explicit:    # named by the environment, not by --config
            raise ConfigError(f"${ENV_CONFIG}={p}: configuration file not found")
        if explicit:
            raise ConfigError(f"{p}: configuration file not found")
        return parse_config({}, source="<defaults>", env=env)
    return parse_config(read_config_file(p), source=str(p), env=env)


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The TOML document of a configuration file, not yet checked.

    Raises:
        ConfigError: the file cannot be read (missing, permission, I/O), is not UTF-8,
            not valid TOML or nested too deeply to read; the message names the path.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found") from None
    except PermissionError:
        raise ConfigError(f"{p}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"{p}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:   # (tomllib recurses once per level of nesting)
        # (how deep depends on the nesting: at Python's default recursion limit, about
        # 500 nested arrays or 330 inline tables)
        raise ConfigError(f"{p}: TOML nested too deeply to read") from None
