"""Effective slurm.conf settings: the file's values, overridden by the running controller's.

When a controller answered, its value of a setting is what Slurm actually
does, so it wins; where it differs from the file, `compare` reports the
difference (a warning for the settings malleable checks, an info otherwise),
and the checks also judge the file's value (it runs after the next
reconfigure or restart).
A setting neither source gives is unset and Slurm's default applies.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from malleable.slurm_conf.controller import ControllerConfig, ControllerQuery
from malleable.slurm_conf.parser import Entry, ParsedConf
from malleable.slurm_conf.records import Finding, Location, Severity

CONTROLLER_SOURCE = "scontrol show config"

CHECKED_KEYS = ("JobRequeue", "SelectType", "SelectTypeParameters", "GresTypes",
                "SchedulerParameters", "MinJobAge", "ProctrackType", "PrologFlags")
"""The settings malleable's checks read; a file/controller difference in one is a warning."""

_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:sec|usec|min|percent|nodes/min|MB)$", re.IGNORECASE)
_OWNER = re.compile(r"^(.*\S)\(\d+\)$")
_NULL = {"(null)", "(null type)"}
_RESTART_KEYS = {"selecttype", "selecttypeparameters", "grestypes", "proctracktype"}
"""Settings that slurm.conf(5) says need a daemon restart, not `scontrol reconfigure`."""
_BOOL = {"yes": "1", "true": "1", "no": "0", "false": "0"}


def normalize_value(value: str | None) -> str | None:
    """A comparable form of a setting's value, from either source.

    ``(null)`` -> None; units dropped (``"300 sec"`` -> ``"300"``); user ids
    dropped (``"slurm(64030)"`` -> ``"slurm"``); yes/no -> 1/0; lower case;
    comma lists sorted. Two values are the same setting iff their normal
    forms are equal.
    """
    if value is None:
        return None
    v = value.strip()
    if v in _NULL or v == "":
        return None
    m = _UNIT.match(v)
    if m:
        v = m.group(1)
    m = _OWNER.match(v)
    if m:
        v = m.group(1)
    v = v.lower()
    v = _BOOL.get(v, v)
    if "," in v:
        v = ",".join(sorted(p.strip() for p in v.split(",") if p.strip()))
    return v


def file_form(value: str) -> str:
    """A value as ``scontrol show config`` prints it, written as slurm.conf takes it:
    ``"300 sec"`` -> ``"300"``, ``"slurm(64030)"`` -> ``"slurm"``, ``"(null)"`` -> ``""``."""
    v = value.strip()
    if v in _NULL:
        return ""
    m = _UNIT.match(v)
    if m:
        return m.group(1)
    m = _OWNER.match(v)
    return m.group(1) if m else v


@dataclass(frozen=True)
class Setting:
    """One effective setting.

    Attributes:
        key: the setting's name as asked for.
        value: its value (raw text; None when unset, i.e. Slurm's default).
        location: where to change it: the file line that sets it, or the
            slurm.conf file (line None) when the file does not set it.
        source: ``"file"``, ``"controller"`` or ``"default"``.
    """

    key: str
    value: str | None
    location: Location
    source: str

    @property
    def where(self) -> str:
        """Human text for the source: ``slurm.conf:12``, ``slurm.conf:12, running slurmctld``,
        ``running slurmctld`` or ``default``."""
        short = f"{os.path.basename(self.location.path)}:{self.location.line}"
        if self.source == "file":
            return short
        if self.source == "controller":
            return (f"{short}, running slurmctld" if self.location.line is not None
                    else "running slurmctld")
        return "not set, default"


class Settings:
    """The effective settings of one slurm.conf (and the controller's answer, if any)."""

    def __init__(self, conf: ParsedConf, controller: ControllerConfig | None = None):
        self.conf = conf
        self.controller = controller

    def get(self, key: str) -> Setting:
        """The effective value of ``key`` with where it came from (never raises)."""
        entry = self.conf.entry(key)
        loc = entry.location if entry is not None else Location(self.conf.path)
        if self.controller is not None:
            raw = self.controller.get(key)
            if raw is not None:
                value = None if normalize_value(raw) is None else raw
                return Setting(key, value, loc, "controller")
        if entry is not None:
            return Setting(key, entry.value, loc, "file")
        return Setting(key, None, loc, "default")


def compare(conf: ParsedConf, query: ControllerQuery, checked_path: str) -> list[Finding]:
    """Findings where the running controller differs from the file (check id ``controller``).

    Reported: each setting the file sets whose value the controller prints
    differently; a ``HASH_VAL`` other than ``Match`` (the slurm.conf scontrol
    read is not the one slurmctld runs); a controller reading another file
    than ``checked_path``; and a controller that did not answer (info).
    """
    if not query.queried:
        return []
    if query.config is None:
        return [Finding(Severity.INFO, "controller", Location(CONTROLLER_SOURCE),
                        f"no controller answered ({query.error}); the checks use the files and "
                        f"Slurm's documented defaults",
                        None)]
    cfg = query.config
    out: list[Finding] = []
    checked = {k.lower() for k in CHECKED_KEYS}
    last: dict[str, Entry] = {}
    for e in conf.entries:
        last[e.key.lower()] = e
    for key_l, e in last.items():
        raw = cfg.get(e.key)
        if raw is None:
            continue
        if normalize_value(raw) != normalize_value(e.value):
            restart = key_l in _RESTART_KEYS
            apply = ("restart slurmctld and the slurmd daemons" if restart
                     else "run `scontrol reconfigure`")
            out.append(Finding(
                Severity.WARNING if key_l in checked else Severity.INFO, "controller",
                e.location,
                f"{e.key}: the file says {e.value!r} but the running slurmctld uses {raw!r} "
                f"(the checks judge both: what runs now, and the file, which runs after the "
                f"next reconfigure or restart)",
                f"{apply} to apply the file, or set {e.key}={file_form(raw)} in the file to "
                f"match what runs"))
    hv = cfg.hash_val
    if hv is not None and hv.strip().lower() != "match":
        out.append(Finding(
            Severity.WARNING, "controller", Location(checked_path),
            f"the running slurmctld read a different slurm.conf than {checked_path} "
            f"(HASH_VAL = {hv}); its settings win where they differ",
            "run `scontrol reconfigure` once the file is right (or restart slurmctld)"))
    if cfg.slurm_conf and _norm_path(cfg.slurm_conf) != _norm_path(checked_path):
        out.append(Finding(
            Severity.INFO, "controller", Location(checked_path),
            f"the controller reports SLURM_CONF = {cfg.slurm_conf}, not {checked_path}",
            None))
    return out


def _norm_path(p: str) -> str:
    return os.path.realpath(p)
