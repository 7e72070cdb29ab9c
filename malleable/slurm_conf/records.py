"""Records of the Slurm configuration check: locations, findings, GRES, the GPU inventory.

Every record is an immutable dataclass; `to_dict` methods give the JSON shape
documented in docs/conf-check.md (keys and types there are a promise to
scripts: change them only with the schema version).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Severity(enum.StrEnum):
    """How much a finding matters: an ``error`` makes `malleable conf check` exit 1."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for error, 1 for warning, 2 for info (sort order: worst first)."""
        return _RANK[self]


_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, order=True)
class Location:
    """Where something was read: a file and a 1-based line (None: the file as a whole,
    or a setting the file does not contain). ``path`` may also name a non-file source
    such as ``"scontrol show config"``."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"

    def to_dict(self) -> dict:
        """``{"path": str, "line": int | None}``."""
        return {"path": self.path, "line": self.line}


@dataclass(frozen=True)
class Finding:
    """One thing the check found.

    Attributes:
        severity: error (malleable or Slurm cannot work this way), warning
            (works, but worse or only with care), info (worth knowing).
        check: the id of the check that produced it (e.g. ``"job-requeue"``,
            ``"syntax"``); docs/conf-check.md lists them.
        location: the file and line it concerns.
        message: what is wrong and why it matters, in one or two sentences.
        fix: the concrete change: the line to add or change and where, or None
            when there is nothing to change (some infos).
    """

    severity: Severity
    check: str
    location: Location
    message: str
    fix: str | None = None

    def to_dict(self) -> dict:
        """The JSON object of a finding (docs/conf-check.md, ``findings[]``)."""
        return {"severity": str(self.severity), "check": self.check,
                "path": self.location.path, "line": self.location.line,
                "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class GresSpec:
    """One item of a node's ``Gres=`` in slurm.conf, e.g. ``gpu:a100:4``.

    ``count`` is the number of units (suffixes K, M, G, T, P already applied,
    as powers of 1024); ``type`` is None for an untyped GRES.
    """

    name: str
    type: str | None
    count: int
    no_consume: bool = False

    def __str__(self) -> str:
        parts = [self.name] + ([self.type] if self.type else []) + \
            (["no_consume"] if self.no_consume else []) + [str(self.count)]
        return ":".join(parts)


@dataclass(frozen=True)
class NodeInfo:
    """A node of slurm.conf with its GPUs, as the files describe it.

    Attributes:
        name: the node name (``NodeName``, expanded from its hostlist).
        gpus: GPUs the node offers per slurm.conf (sum over its ``gpu`` GRES).
        gpu_types: ``(type, count)`` pairs from slurm.conf; type None = untyped.
        gres: every GRES of the node (GPUs and others), from ``Gres=``.
        location: the NodeName line that defines it.
        partitions: names of the partitions that hold it.
        gres_conf_gpus: GPUs gres.conf gives this node (Count or number of
            File= devices), or None when gres.conf has no GPU line for it or
            the devices are auto-detected.
        device_files: the GPU device files gres.conf names for it.
        autodetect: the gres.conf AutoDetect mechanism in force for it
            (``"nvml"``, ``"rsmi"``, ...), or None.
        state: the ``State=`` of its NodeName line (e.g. ``"UNKNOWN"``), or None.
        gres_error: why its ``Gres=`` could not be read (the ``gpu-nodes`` finding's
            message, e.g. a count that is not a number or is too large), or None; a
            node whose Gres cannot be read counts no GRES. Not in `to_dict` (the
            findings carry it).
    """

    name: str
    gpus: int
    gpu_types: tuple[tuple[str | None, int], ...] = ()
    gres: tuple[GresSpec, ...] = ()
    location: Location = field(default_factory=lambda: Location("<unknown>"))
    partitions: tuple[str, ...] = ()
    gres_conf_gpus: int | None = None
    device_files: tuple[str, ...] = ()
    autodetect: str | None = None
    state: str | None = None
    gres_error: str | None = None

    def to_dict(self) -> dict:
        """The JSON object of a node (docs/conf-check.md, ``inventory.nodes[]``)."""
        return {"name": self.name, "gpus": self.gpus,
                "gpu_types": [{"type": t, "count": c} for t, c in self.gpu_types],
                "gres": [str(g) for g in self.gres], "partitions": list(self.partitions),
                "gres_conf_gpus": self.gres_conf_gpus, "device_files": list(self.device_files),
                "autodetect": self.autodetect, "state": self.state,
                "path": self.location.path, "line": self.location.line}


@dataclass(frozen=True)
class PartitionInfo:
    """A partition of slurm.conf and the nodes it holds.

    ``gpu_nodes`` and ``gpus`` count the nodes with GPUs and their GPUs;
    ``state`` is the partition's ``State=`` (default ``UP``).
    """

    name: str
    nodes: tuple[str, ...]
    default: bool
    state: str
    gpu_nodes: int
    gpus: int
    location: Location

    def to_dict(self) -> dict:
        """The JSON object of a partition (docs/conf-check.md, ``inventory.partitions[]``)."""
        return {"name": self.name, "nodes": list(self.nodes), "default": self.default,
                "state": self.state, "gpu_nodes": self.gpu_nodes, "gpus": self.gpus,
                "path": self.location.path, "line": self.location.line}


@dataclass(frozen=True)
class Inventory:
    """The GPU inventory of the cluster as its configuration files describe it."""

    nodes: tuple[NodeInfo, ...]
    partitions: tuple[PartitionInfo, ...]

    @property
    def gpu_nodes(self) -> tuple[NodeInfo, ...]:
        """The nodes with at least one GPU."""
        return tuple(n for n in self.nodes if n.gpus > 0)

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return sum(n.gpus for n in self.nodes)

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name``, or None."""
        return next((n for n in self.nodes if n.name == name), None)

    def partition(self, name: str) -> PartitionInfo | None:
        """The partition called ``name``, or None."""
        return next((p for p in self.partitions if p.name == name), None)

    def to_dict(self) -> dict:
        """The JSON object of the inventory (docs/conf-check.md, ``inventory``)."""
        return {"total_gpus": self.total_gpus, "gpu_nodes": len(self.gpu_nodes),
                "nodes": [n.to_dict() for n in self.nodes],
                "partitions": [p.to_dict() for p in self.partitions]}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one prerequisite check: ``status`` is ``ok`` or the worst
    severity among its findings; ``summary`` says what was seen, e.g.
    ``"JobRequeue=1 (default)"``."""

    check: str
    title: str
    status: str
    summary: str

    def to_dict(self) -> dict:
        """The JSON object of a check (docs/conf-check.md, ``checks[]``)."""
        return {"check": self.check, "title": self.title, "status": self.status,
                "summary": self.summary}
