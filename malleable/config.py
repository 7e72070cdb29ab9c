"""Typed settings: /etc/malleable/malleable.toml, environment overrides, defaults.

Every setting is a field of a frozen dataclass below, with its type, default
and a one-line description (``metadata["doc"]``); `docs/configuration.md` is
generated from these (``malleable config show --defaults`` prints them).
`load_config` validates every key and value and raises `ConfigError` naming
the key, the value and the expected type. Nothing here imports another
malleable module.

Precedence, highest first: environment (``MALLEABLE_DATABASE_URL``), the TOML
file (``--config`` or ``$MALLEABLE_CONFIG`` or /etc/malleable/malleable.toml;
a missing default file is fine, a missing explicit file is an error), defaults.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/malleable/malleable.toml")
ENV_CONFIG = "MALLEABLE_CONFIG"
ENV_DATABASE_URL = "MALLEABLE_DATABASE_URL"


class ConfigError(ValueError):
    """A configuration file or value is unusable; the message names key, value and expectation."""


def _f(default: Any, doc: str, **kw: Any) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the state store lives."""

    url: str = _f("sqlite:////var/lib/malleable/malleable.db",
                  "SQLAlchemy URL; sqlite:///ABS/PATH (default) or postgresql+psycopg://...")
    busy_timeout_ms: int = _f(30000, "SQLite busy_timeout: how long a writer waits for a lock, ms")


@dataclass(frozen=True)
class SlurmConfig:
    """How to reach Slurm."""

    backend: str = _f("auto", "auto | cli | pyslurm (auto: pyslurm if it imports and matches)",
                      choices=("auto", "cli", "pyslurm"))
    command_timeout_s: float = _f(30.0, "timeout of one Slurm command, seconds")
    partitions: list = _f([], "partitions whose malleable jobs are managed; empty = all")
    max_retries: int = _f(3, "retries of an unanswered Slurm call, with exponential back-off")


@dataclass(frozen=True)
class ProgressConfig:
    """Where jobs write progress and how it is read."""

    spool_dir: str = _f("/var/spool/malleable/progress", "directory of per-job progress files")
    max_bytes_per_job: int = _f(1 << 20, "bytes read per job per ingest cycle")
    max_future_s: float = _f(300.0, "a line timestamped further in the future is rejected, s")


@dataclass(frozen=True)
class DaemonConfig:
    """The service's schedule and limits."""

    poll_interval_s: float = _f(30.0, "how often Slurm is polled (one squeue per poll), s")
    ingest_interval_s: float = _f(30.0, "how often progress files are read, s")
    decide_interval_s: float = _f(60.0, "how often the policy runs and actions are applied, s")
    housekeeping_interval_s: float = _f(3600.0, "how often retention runs, s")
    max_concurrent_requeues: int = _f(4, "checkpoint-requeues in flight at once")
    lease_timeout_s: float = _f(300.0, "a daemon lease older than this may be taken over, s")
    requeue_backoff_s: float = _f(600.0, "first back-off after a job fails to checkpoint, s "
                                  "(doubles each time)")
    dry_run: bool = _f(False, "plan and log actions but change nothing in Slurm")
    log_level: str = _f("INFO", "DEBUG | INFO | WARNING | ERROR",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"))


@dataclass(frozen=True)
class PolicyConfig:
    """Which policy decides, and how eagerly it changes running jobs."""

    name: str = _f("default", "policy name (see `malleable policy list`)")
    params: dict = _f({}, "policy parameters, e.g. {p = 0.7}")
    min_gain: float = _f(0.05, "a running job is changed only if the estimated relative gain "
                         "exceeds the restart cost by this fraction")
    cooldown_s: float = _f(300.0, "no change to a job sooner than this after its last change, s")
    default_restart_cost_s: float = _f(60.0, "restart cost assumed before one is measured, s")


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus exporter."""

    address: str = _f("", "host:port to serve /metrics on; empty = off")


@dataclass(frozen=True)
class OperatorConfig:
    """Who may change what the daemon does."""

    group: str = _f("", "Unix group whose members may pause/resume/set policy (root always may)")


@dataclass(frozen=True)
class RetentionConfig:
    """How long history is kept."""

    finished_job_days: float = _f(30.0, "finished jobs older than this are pruned, days")
    progress_full_s: float = _f(3600.0, "progress samples younger than this are kept at full "
                                "resolution, s")
    progress_max_per_job: int = _f(2000, "progress samples kept per job after downsampling")


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
    # bool is an int in Python; TOML keeps them apart, and so do we.
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{key} = {value!r}: expected {_type_name(tp)}, "
                          f"got {_type_name(type(value))}")
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{key} = {value!r}: expected one of {', '.join(choices)}")
    if tp in (int, float) and key.rsplit(".", 1)[-1] != "params" and value < 0:
        raise ConfigError(f"{key} = {value!r}: expected a value >= 0")
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
        ConfigError: an unknown section or key, or a value of the wrong type or range.
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
        built["database"] = dataclasses.replace(built["database"], url=url)
    return Config(**built, source=source)


def load_config(path: str | os.PathLike | None = None, env: dict | None = None) -> Config:
    """Read, validate and return the configuration.

    Args:
        path: the TOML file; None means ``$MALLEABLE_CONFIG`` or the default path,
            and a missing default file means all defaults.
        env: environment for overrides (default ``os.environ``).

    Raises:
        ConfigError: the file is unreadable or not TOML (message names the path and
            the line), or a value is invalid (message names the key and the value).
    """
    env = os.environ if env is None else env
    explicit = path is not None or bool(env.get(ENV_CONFIG))
    p = Path(path if path is not None else (env.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH))
    if not p.exists():
        if explicit:
            raise ConfigError(f"{p}: configuration file not found")
        return parse_config({}, source="<defaults>", env=env)
    return parse_config(read_config_file(p), source=str(p), env=env)


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The TOML document of a configuration file, not yet checked.

    Raises:
        ConfigError: the file cannot be read (missing, permission, I/O), is not UTF-8
            or not valid TOML; the message names the path.
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
