"""The Slurm port: the only code that talks to Slurm.

Owns the typed, immutable records (`SlurmJob`, `SlurmNode`, `ClusterInfo`), the
`SlurmClient` protocol the daemon and the simulator program against, its error
hierarchy, and the backends behind it: ``cli`` (squeue/scontrol/scancel as argv
lists with timeouts, JSON parsing tolerant of Slurm 22.05 to 25.11) and
``pyslurm`` (when pyslurm imports and matches the controller). Nothing outside
this package runs a Slurm command.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Callable

from malleable.config import SlurmConfig
from malleable.slurm.backend_cli import CliSlurmClient
from malleable.slurm.client import (
    InvalidArgument,
    InvalidJobId,
    SlurmClient,
    SlurmError,
    SlurmParseError,
    SlurmRejected,
    SlurmUnavailable,
)
from malleable.slurm.records import (
    ClusterInfo,
    JobState,
    SignalTarget,
    SlurmJob,
    SlurmNode,
    SubmitRequest,
)
from malleable.slurm.versions import parse_version, version_string

__all__ = [
    "ClusterInfo", "CliSlurmClient", "InvalidArgument", "InvalidJobId", "JobState",
    "SignalTarget", "SlurmClient", "SlurmError", "SlurmJob", "SlurmNode", "SlurmParseError",
    "SlurmRejected", "SlurmUnavailable", "SubmitRequest", "connect", "connect_once",
]

log = logging.getLogger(__name__)


def connect_once(config: SlurmConfig | None = None, *, env: dict | None = None
                 ) -> SlurmClient:
    """`connect` for a command at a prompt (`plan`, `submit`): each Slurm call
    is tried once, within ``command_timeout_s`` ([slurm] max_retries, the daemon's
    retries with back-off, would keep a user waiting for minutes when Slurm is down).

    Raises:
        as `connect`.
    """
    return connect(dataclasses.replace(config or SlurmConfig(), max_retries=0), env=env)


def connect(config: SlurmConfig | None = None, *, env: dict | None = None,
            sleep: Callable[[float], None] = time.sleep) -> SlurmClient:
    """The `SlurmClient` for this machine, chosen by ``config.backend``.

    * ``cli``: the command-line backend.
    * ``auto`` (default): the pyslurm backend when ``import pyslurm`` works, pyslurm is
      25.11 or newer and its Slurm release (major.minor of ``pyslurm.__version__``)
      equals slurmctld's (``scontrol show config``); otherwise ``cli``, with a log
      line saying why.
    * ``pyslurm``: the pyslurm backend, or `SlurmError` saying why it cannot be used.

    ``env`` is the environment for Slurm commands (default: this process's); ``sleep``
    the back-off wait between retries (seconds; the daemon's ends early on a stop by
    raising `SlurmUnavailable`).
    Raises `SlurmUnavailable` if the controller version cannot be read (auto/pyslurm).
    """
    config = config or SlurmConfig()
    cli = CliSlurmClient(config, env=env, sleep=sleep)
    if config.backend == "cli":
        log.info("Slurm backend: cli (configured)")
        return cli
    try:
        pyslurm = importlib.import_module("pyslurm")
    except (ImportError, OSError) as exc:
        why = f"pyslurm does not import ({exc})"
    else:
        from malleable.slurm.backend_pyslurm import MIN_PYSLURM, PyslurmSlurmClient
        theirs = parse_version(str(getattr(pyslurm, "__version__", "")))
        ctld = cli.controller_version()
        if theirs < MIN_PYSLURM:
            why = f"pyslurm {version_string(theirs)} is older than 25.11"
        elif theirs[:2] != ctld[:2]:
            why = (f"pyslurm {version_string(theirs)} is built for Slurm "
                   f"{theirs[0]}.{theirs[1]:02d}, slurmctld is {version_string(ctld)}")
        else:
            log.info("Slurm backend: pyslurm %s (slurmctld %s)", version_string(theirs),
                     version_string(ctld))
            return PyslurmSlurmClient(config, module=pyslurm,
                                      controller_version=version_string(ctld), sleep=sleep)
    if config.backend == "pyslurm":
        raise SlurmError(f"backend pyslurm configured but unusable: {why}")
    log.info("Slurm backend: cli, because %s", why)
    return cli
