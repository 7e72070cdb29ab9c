"""What the running slurmctld uses: ``scontrol show config``, queried and parsed.

The controller may run with a different configuration than the file on disk
(the file was edited after slurmctld read it, or slurmctld reads another
file). `parse_show_config` reads the command's text (it needs no controller,
so it is tested on stored outputs); `query_controller` runs ``scontrol show
config`` as an argv list with a timeout, with ``SLURM_CONF`` set to the file
being checked, so that scontrol asks the controller that file names.

The text looks like (Slurm 22.05)::

    Configuration data as of 2024-05-01T10:00:00
    AccountingStorageBackupHost = (null)
    ...
    MinJobAge               = 300 sec
    SLURM_VERSION           = 22.05.8
    ...
    Cgroup Support Configuration:
    CgroupMountpoint        = /sys/fs/cgroup
    ...
    Slurmctld(primary) at ctl1 is UP

Keys before the first section header (a line ending in ``:``) are the
slurm.conf settings; each later section (cgroup.conf, mpi, ...) is kept apart.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from malleable.slurm.runner import run_group

_KV = re.compile(r"^([A-Za-z_][\w\[\]().]*)\s*=\s?(.*)$")
_STATUS = re.compile(r"^Slurmctld\((\w+)\) at (\S+) is (\S+)")
_HEADER = re.compile(r"^Configuration data as of")


class ShowConfigError(ValueError):
    """The text is not ``scontrol show config`` output (it has no ``Key = Value`` line)."""


@dataclass(frozen=True)
class ControllerConfig:
    """The parsed output of ``scontrol show config``.

    Attributes:
        values: slurm.conf settings as printed, key -> raw value (e.g.
            ``"MinJobAge": "300 sec"``, ``"SchedulerParameters": "(null)"``).
        sections: later sections, title (without the colon) -> key -> value.
        status: the controller status lines, e.g. ``["Slurmctld(primary) at ctl1 is UP"]``.
    """

    values: dict[str, str]
    sections: dict[str, dict[str, str]] = field(default_factory=dict)
    status: tuple[str, ...] = ()

    def get(self, key: str) -> str | None:
        """The raw value of ``key`` (case-insensitive), or None when it is not printed."""
        k = key.lower()
        for name, value in self.values.items():
            if name.lower() == k:
                return value
        return None

    @property
    def version(self) -> str | None:
        """``SLURM_VERSION``, e.g. ``"22.05.8"``."""
        return self.get("SLURM_VERSION")

    @property
    def slurm_conf(self) -> str | None:
        """``SLURM_CONF``: the file the controller (and scontrol) read."""
        return self.get("SLURM_CONF")

    @property
    def hash_val(self) -> str | None:
        """``HASH_VAL``: ``Match`` when scontrol's slurm.conf hashes like slurmctld's."""
        return self.get("HASH_VAL")


def parse_show_config(text: str) -> ControllerConfig:
    """Parse ``scontrol show config`` output.

    Args:
        text: the command's standard output.

    Returns:
        A `ControllerConfig`.

    Raises:
        ShowConfigError: no ``Key = Value`` line at all (not this command's output).
    """
    values: dict[str, str] = {}
    sections: dict[str, dict[str, str]] = {}
    status: list[str] = []
    current: dict[str, str] = values
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or _HEADER.match(line):
            continue
        if _STATUS.match(line.strip()):
            status.append(line.strip())
            continue
        m = _KV.match(line)
        if m:
            current[m.group(1)] = m.group(2).strip()
            continue
        if line.endswith(":"):
            current = sections.setdefault(line[:-1].strip(), {})
    if not values and not sections:
        raise ShowConfigError("no 'Key = Value' line: not the output of scontrol show config")
    return ControllerConfig(values=values, sections=sections, status=tuple(status))


@dataclass(frozen=True)
class ControllerQuery:
    """The outcome of asking the controller.

    Attributes:
        queried: False when the caller chose not to ask (``--no-controller``).
        config: the parsed answer, or None when there was none.
        error: why there is no answer (scontrol's own message, a timeout, a
            missing scontrol), or None.
        argv: the command that was run.
    """

    queried: bool
    config: ControllerConfig | None = None
    error: str | None = None
    argv: tuple[str, ...] = ()

    @property
    def answered(self) -> bool:
        """True when the controller answered and its answer was parsed."""
        return self.config is not None

    def to_dict(self) -> dict:
        """The JSON object ``controller`` of docs/conf-check.md (without ``differences``)."""
        c = self.config
        return {"queried": self.queried, "answered": self.answered, "error": self.error,
                "version": c.version if c else None,
                "status": list(c.status) if c else [],
                "slurm_conf": c.slurm_conf if c else None,
                "hash": c.hash_val if c else None}


def _stderr_reason(returncode: int, stdout: str, stderr: str) -> str:
    lines = [ln.strip() for ln in (stderr or stdout or "").splitlines() if ln.strip()]
    # scontrol prints "error: ..." lines then "fatal: ..."; the first error says most.
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else f"exit status {returncode}"


def query_controller(slurm_conf: str | os.PathLike, timeout_s: float,
                     scontrol: str = "scontrol", env: dict | None = None) -> ControllerQuery:
    """Run ``scontrol show config`` against the controller that ``slurm_conf`` names.

    Args:
        slurm_conf: the slurm.conf being checked; passed as ``SLURM_CONF``.
        timeout_s: seconds to wait for the command (scontrol itself retries an
            unreachable controller for about 10 s).
        scontrol: the scontrol program (name on PATH or a path).
        env: the environment to start from (default ``os.environ``).

    Returns:
        A `ControllerQuery`; it never raises for a missing, failing or slow
        controller or scontrol: ``error`` says what happened.
    """
    argv = (scontrol, "show", "config")
    run_env = dict(os.environ if env is None else env)
    run_env["SLURM_CONF"] = os.fspath(slurm_conf)
    try:
        # (its own process group, killed whole on a timeout: `malleable.slurm.runner`)
        returncode, stdout, stderr = run_group(argv, run_env, timeout_s)
    except FileNotFoundError:
        return ControllerQuery(True, error=f"{scontrol} not found (is slurm-client installed?)",
                               argv=argv)
    except subprocess.TimeoutExpired:
        return ControllerQuery(True, error=f"scontrol show config gave no answer within "
                               f"{timeout_s:g} s", argv=argv)
    except OSError as exc:
        return ControllerQuery(True, error=f"cannot run {scontrol}: {exc.strerror or exc}",
                               argv=argv)
    if returncode != 0:
        return ControllerQuery(True, error=_stderr_reason(returncode, stdout, stderr), argv=argv)
    try:
        return ControllerQuery(True, config=parse_show_config(stdout), argv=argv)
    except ShowConfigError as exc:
        return ControllerQuery(True, error=f"scontrol show config: {exc}", argv=argv)
