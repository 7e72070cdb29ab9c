"""The GPU inventory derived from slurm.conf and gres.conf, and their cross-check.

From slurm.conf: nodes (``NodeName`` lines, with ``NodeName=DEFAULT`` values
applied to the lines after them), the GPUs of each node (``Gres=gpu:...``),
node sets and partitions (``Nodes=`` hostlists, node set names or ``ALL``,
with ``PartitionName=DEFAULT``). From gres.conf: the GPU device files
(``File=``, ``MultipleFiles=``) or counts of each node, and ``AutoDetect``.

The cross-check follows gres.conf(5): File= is required for GPUs (without
device files Slurm cannot bind a job to its GPUs), Count must equal the number
of files when both are given, and the GPUs gres.conf gives a node must match
the node's Gres count in slurm.conf (a node registering fewer GPUs than
configured is drained). Problems shared by many nodes are reported once, with
the nodes as a hostlist.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from malleable.slurm.hostlist import HostlistError, compress_hostlist, expand_hostlist
from malleable.slurm_conf.gres import MAX_COUNT, GresSpecError, parse_count, parse_gres
from malleable.slurm_conf.parser import ParsedConf, Record
from malleable.slurm_conf.records import (
    Finding,
    GresSpec,
    Inventory,
    Location,
    NodeInfo,
    PartitionInfo,
    Severity,
)

GPU = "gpu"
AUTODETECT_OFF = "off"


def device_example(count: int) -> str:
    """A typical NVIDIA device list for ``count`` GPUs: ``/dev/nvidia[0-3]``."""
    return "/dev/nvidia0" if count <= 1 else f"/dev/nvidia[0-{count - 1}]"


@dataclass
class _Node:
    name: str
    record: Record
    params: dict[str, str]
    gres: list[GresSpec] = field(default_factory=list)
    gres_error: str | None = None   # why its Gres= could not be read (then gres is [])

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.gres if g.name.lower() == GPU)


@dataclass
class _GresLine:
    record: Record
    nodes: set[str] | None      # None: no NodeName, applies to every node
    name: str | None
    type: str | None
    files: list[str]
    count: int | None           # units this line gives (None if it could not be read)
    has_files: bool
    autodetect: str | None


def _with_defaults(records: list[Record]) -> list[tuple[Record, dict[str, str]]]:
    """Apply ``X=DEFAULT`` lines to the lines after them (slurm.conf(5))."""
    defaults: dict[str, str] = {}
    out = []
    for r in records:
        if r.name.upper() == "DEFAULT":
            defaults.update(r.params)
            continue
        out.append((r, {**defaults, **r.params}))
    return out


def _nodes(slurm: ParsedConf, findings: list[Finding]) -> list[_Node]:
    nodes: dict[str, _Node] = {}
    for rec, params in _with_defaults(slurm.records_of("NodeName")):
        try:
            names = expand_hostlist(rec.name)
        except HostlistError as exc:
            findings.append(Finding(Severity.ERROR, "gpu-nodes", rec.location,
                                    f"NodeName={rec.name}: {exc}",
                                    "write the node names as a hostlist such as node[1-4,7]"))
            continue
        gres: list[GresSpec] = []
        gres_error = None
        if params.get("gres"):
            try:
                gres = parse_gres(params["gres"])
                total = sum(g.count for g in gres if g.name.lower() == GPU)
                if total > MAX_COUNT:
                    raise GresSpecError(f"Gres={params['gres']}: {total} GPUs in all, more "
                                        f"than {MAX_COUNT} (2**63 - 1)")
            except GresSpecError as exc:
                gres, gres_error = [], str(exc)
                findings.append(Finding(Severity.ERROR, "gpu-nodes", rec.location, str(exc),
                                        "write Gres=gpu:COUNT or Gres=gpu:TYPE:COUNT, "
                                        "e.g. Gres=gpu:a100:4"))
        gpu_specs = [g for g in gres if g.name.lower() == GPU]
        if any(g.type for g in gpu_specs) and any(not g.type for g in gpu_specs):
            findings.append(Finding(
                Severity.ERROR, "gpu-nodes", rec.location,
                f"Gres={params['gres']} mixes typed and untyped gpu entries, which slurm.conf(5) "
                f"forbids", "give every gpu entry a type (gpu:TYPE:COUNT) or none"))
        for name in names:
            if name in nodes:
                findings.append(Finding(
                    Severity.ERROR, "gpu-nodes", rec.location,
                    f"node {name} is defined again (first at {nodes[name].record.location}); "
                    f"Slurm ignores the repeated definition",
                    f"define {name} on one NodeName line only"))
                continue
            nodes[name] = _Node(name, rec, params, gres, gres_error)
    return list(nodes.values())


def _nodesets(slurm: ParsedConf, nodes: list[_Node], findings: list[Finding]) -> dict[str, list[str]]:
    sets: dict[str, list[str]] = {}
    for rec in slurm.records_of("NodeSet"):
        members: dict[str, None] = {}          # an ordered set
        feature = rec.get("feature")
        if feature:
            members.update((n.name, None) for n in nodes
                           if feature.lower() in {f.strip().lower() for f in
                                                  (n.params.get("features")
                                                   or n.params.get("feature") or "").split(",")})
        if rec.get("nodes"):
            try:
                members.update((m, None) for m in expand_hostlist(rec.get("nodes") or ""))
            except HostlistError as exc:
                findings.append(Finding(Severity.ERROR, "partitions", rec.location,
                                        f"NodeSet={rec.name} Nodes=: {exc}",
                                        "write Nodes= as a hostlist such as node[1-4]"))
        sets[rec.name] = list(members)
    return sets


def _partitions(slurm: ParsedConf, nodes: list[_Node], sets: dict[str, list[str]],
                findings: list[Finding]) -> list[tuple[Record, dict[str, str], list[str]]]:
    known = {n.name for n in nodes}
    out = []
    seen: dict[str, Location] = {}
    for rec, params in _with_defaults(slurm.records_of("PartitionName")):
        if rec.name in seen:
            findings.append(Finding(
                Severity.ERROR, "partitions", rec.location,
                f"partition {rec.name} is defined again (first at {seen[rec.name]}); Slurm "
                f"ignores the repeated definition", f"define {rec.name} on one line only"))
            continue
        seen[rec.name] = rec.location
        members: dict[str, None] = {}          # an ordered set
        unknown: list[str] = []
        for item in _split_nodes(params.get("nodes", "")):
            if item.upper() == "ALL":
                names = [n.name for n in nodes]
            elif item in sets:
                names = sets[item]
            else:
                try:
                    names = expand_hostlist(item)
                except HostlistError as exc:
                    findings.append(Finding(Severity.ERROR, "partitions", rec.location,
                                            f"PartitionName={rec.name} Nodes=: {exc}",
                                            "write Nodes= as a hostlist such as node[1-4]"))
                    continue
                unknown += [n for n in names if n not in known]
                names = [n for n in names if n in known]
            members.update((n, None) for n in names)
        if unknown:
            findings.append(Finding(
                Severity.ERROR, "partitions", rec.location,
                f"partition {rec.name} names nodes that no NodeName line defines: "
                f"{compress_hostlist(unknown)} (slurmctld refuses to start)",
                f"define them with NodeName=... or remove them from Nodes= of {rec.name}"))
        out.append((rec, params, list(members)))
    return out


def _split_nodes(value: str) -> list[str]:
    """Split a Nodes= value on commas outside brackets (``a[1-2,4],b`` -> 2 items)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return [i.strip() for i in items if i.strip()]


def _gres_lines(gres: ParsedConf, known: set[str], findings: list[Finding]) -> list[_GresLine]:
    lines = []
    unknown_nodes: dict[Location, list[str]] = defaultdict(list)
    for rec in gres.records:
        nodes: set[str] | None = None
        if rec.kind == "NodeName":
            try:
                names = expand_hostlist(rec.name)
            except HostlistError as exc:
                findings.append(Finding(Severity.ERROR, "gpu-devices", rec.location,
                                        f"NodeName={rec.name}: {exc}",
                                        "write NodeName= as a hostlist such as node[1-4]"))
                continue
            nodes = set(names)
            unknown_nodes[rec.location] += [n for n in names if n not in known]
            name = rec.get("name")
        else:
            name = rec.name
        files: list[str] = []
        spec = rec.get("file") or rec.get("multiplefiles")
        multiple = rec.get("file") is None and rec.get("multiplefiles") is not None
        if spec:
            try:
                files = expand_hostlist(spec)
            except HostlistError as exc:
                findings.append(Finding(Severity.ERROR, "gpu-devices", rec.location,
                                        f"File={spec}: {exc}",
                                        "write File= as a path with a range, e.g. "
                                        "File=/dev/nvidia[0-3]"))
        count: int | None = None
        if rec.get("count") is not None:
            try:
                count = parse_count(rec.get("count") or "")
            except GresSpecError as exc:
                findings.append(Finding(Severity.ERROR, "gpu-devices", rec.location,
                                        f"Count={rec.get('count')}: {exc}",
                                        "write Count= as a number, e.g. Count=4"))
        is_gpu = (name or "").lower() == GPU
        if is_gpu and files and not multiple and count is not None and count != len(files):
            findings.append(Finding(
                Severity.ERROR, "gpu-devices", rec.location,
                f"Count={count} but File= names {len(files)} device(s); gres.conf(5): with File, "
                f"Count must equal the number of files or be left out",
                f"remove Count={rec.get('count')} (or make File= list {count} devices)"))
        if count is None:
            count = (1 if multiple else len(files)) if files else (1 if name else None)
        lines.append(_GresLine(rec, nodes, name, rec.get("type"), files, count,
                               bool(files), rec.get("autodetect")))
    for loc, names in unknown_nodes.items():
        if names:
            findings.append(Finding(
                Severity.WARNING, "gpu-devices", loc,
                f"gres.conf names nodes that slurm.conf does not define: "
                f"{compress_hostlist(names)}", "remove them or define them in slurm.conf"))
    return lines


@dataclass
class _NodeProblem:
    severity: Severity
    kind: str
    location: Location
    detail: tuple
    nodes: list[str] = field(default_factory=list)


def _cross_check(nodes: list[_Node], gres: ParsedConf | None, gres_path: str,
                 findings: list[Finding]) -> dict[str, tuple[int | None, tuple[str, ...], str | None]]:
    """Per node: (GPUs in gres.conf, device files, autodetect); problems into ``findings``."""
    known = {n.name for n in nodes}
    lines = _gres_lines(gres, known, findings) if gres is not None and gres.readable else []
    global_auto = gres.get("AutoDetect") if gres is not None else None
    result: dict[str, tuple[int | None, tuple[str, ...], str | None]] = {}
    problems: dict[tuple, _NodeProblem] = {}
    gres_unreadable = gres is not None and not gres.readable

    def problem(sev: Severity, kind: str, loc: Location, detail: tuple, node: str) -> None:
        key = (kind, loc, detail)
        problems.setdefault(key, _NodeProblem(sev, kind, loc, detail)).nodes.append(node)

    # Lines by node (in file order), so that the cost is linear in nodes + lines.
    everywhere = [i for i, ln in enumerate(lines) if ln.nodes is None]
    naming: dict[str, list[int]] = defaultdict(list)
    for i, ln in enumerate(lines):
        for name in ln.nodes or ():
            naming[name].append(i)
    for node in nodes:
        named = [lines[i] for i in naming.get(node.name, ())]
        auto = global_auto
        for line in named:
            if line.autodetect:
                auto = line.autodetect
        auto = None if auto is None or auto.lower() == AUTODETECT_OFF else auto
        applicable = [lines[i] for i in sorted(everywhere + naming.get(node.name, []))]
        mine = [ln for ln in applicable if (ln.name or "").lower() == GPU]
        files = tuple(f for ln in mine for f in ln.files)
        counted = [ln.count for ln in mine if ln.count is not None]
        gres_gpus = sum(counted) if mine else None
        result[node.name] = (gres_gpus, files, auto)
        if gres_unreadable:
            continue
        if node.gpus == 0:
            explicit = [ln for ln in mine if ln.nodes is not None]
            if explicit and sum(ln.count or 0 for ln in explicit) > 0:
                problem(Severity.WARNING, "gpus-not-in-slurm-conf", explicit[0].record.location,
                        (sum(ln.count or 0 for ln in explicit), node.record.location), node.name)
            continue
        if not mine:
            if auto:
                continue
            if gres is None:
                problem(Severity.ERROR, "no-gres-conf", node.record.location,
                        (node.gpus,), node.name)
            else:
                problem(Severity.ERROR, "no-gres-lines", Location(gres_path),
                        (node.gpus, node.record.location), node.name)
            continue
        no_files = [ln for ln in mine if not ln.has_files]
        if no_files and not auto:
            problem(Severity.ERROR, "no-files", no_files[0].record.location,
                    (node.gpus,), node.name)
        if gres_gpus is not None and gres_gpus != node.gpus:
            problem(Severity.ERROR, "count-mismatch", mine[0].record.location,
                    (gres_gpus, node.gpus, node.record.location, node.params.get("gres", "")),
                    node.name)
            continue
        slurm_types = _type_counts((g.type, g.count) for g in node.gres if g.name.lower() == GPU)
        gres_types = _type_counts((ln.type, ln.count or 0) for ln in mine)
        if None not in slurm_types and slurm_types != gres_types:
            problem(Severity.WARNING, "type-mismatch", mine[0].record.location,
                    (_fmt_types(gres_types), _fmt_types(slurm_types), node.record.location),
                    node.name)

    for p in problems.values():
        findings.append(_problem_finding(p, gres_path))
    return result


def _type_counts(pairs) -> dict[str | None, int]:
    out: dict[str | None, int] = defaultdict(int)
    for t, c in pairs:
        out[t.lower() if t else None] += c
    return dict(out)


def _fmt_types(types: dict[str | None, int]) -> str:
    return ", ".join(f"{t or 'untyped'}:{c}" for t, c in sorted(types.items(), key=str))


def _problem_finding(p: _NodeProblem, gres_path: str) -> Finding:
    hl = compress_hostlist(p.nodes)
    if p.kind == "no-gres-conf":
        (gpus,) = p.detail
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: Gres=gpu:{gpus} in slurm.conf, but there is no gres.conf "
                       f"({gres_path}), so no GPU has a device file: Slurm cannot bind a job to "
                       f"its GPUs (gres.conf(5): File is required for GPUs)",
                       f"create {gres_path} with the line: NodeName={hl} Name=gpu "
                       f"File={device_example(gpus)}   (or AutoDetect=nvml)")
    if p.kind == "no-gres-lines":
        gpus, slurm_loc = p.detail
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: Gres=gpu:{gpus} in slurm.conf ({slurm_loc}), but gres.conf has no "
                       f"Name=gpu line for them, so their GPUs have no device files: Slurm "
                       f"cannot bind a job to its GPUs",
                       f"add to {gres_path}: NodeName={hl} Name=gpu File={device_example(gpus)}"
                       f"   (or AutoDetect=nvml)")
    if p.kind == "no-files":
        (gpus,) = p.detail
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: the Name=gpu line has no File=, so Slurm cannot bind a job to its "
                       f"GPUs (gres.conf(5): File is required for all gpu GRES)",
                       f"add File={device_example(gpus)} to this line (the node's GPU device "
                       f"files), or set AutoDetect=nvml")
    if p.kind == "count-mismatch":
        gres_gpus, gpus, slurm_loc, gres_value = p.detail
        effect = ("slurmd registers fewer GPUs than configured and Slurm drains the node"
                  if gres_gpus < gpus else
                  "Slurm schedules only the slurm.conf count, so the other GPUs stay idle")
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: gres.conf gives {gres_gpus} GPU(s) per node but slurm.conf "
                       f"({slurm_loc}) says Gres={gres_value}: {effect}",
                       f"make them agree: Gres=gpu:{gres_gpus} on the NodeName line at "
                       f"{slurm_loc}, or list {gpus} device(s) in File= here")
    if p.kind == "type-mismatch":
        gres_types, slurm_types, slurm_loc = p.detail
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: GPU types differ: gres.conf has {gres_types}, slurm.conf "
                       f"({slurm_loc}) has {slurm_types}; jobs asking for a type may not match",
                       "use the same Type= in gres.conf as in Gres=gpu:TYPE:COUNT")
    if p.kind == "gpus-not-in-slurm-conf":
        count, slurm_loc = p.detail
        return Finding(p.severity, "gpu-devices", p.location,
                       f"{hl}: gres.conf gives {count} GPU(s) but the NodeName line "
                       f"({slurm_loc}) has no Gres=gpu, so Slurm never schedules them",
                       f"add Gres=gpu:{count} to the NodeName line at {slurm_loc}")
    raise AssertionError(f"unknown node problem {p.kind}")


def build_inventory(slurm: ParsedConf, gres: ParsedConf | None,
                    gres_path: str | None = None) -> tuple[Inventory, list[Finding]]:
    """Derive the GPU inventory and cross-check slurm.conf against gres.conf.

    Args:
        slurm: the parsed slurm.conf.
        gres: the parsed gres.conf, or None when there is no gres.conf file.
        gres_path: where gres.conf is (or would be), for messages; default the
            directory of slurm.conf.

    Returns:
        ``(inventory, findings)``: nodes in slurm.conf order, partitions in
        file order; findings with check ids ``gpu-nodes``, ``partitions`` and
        ``gpu-devices``. Never raises for bad content.
    """
    gres_path = gres_path or (gres.path if gres is not None else
                              os.path.join(os.path.dirname(slurm.path), "gres.conf"))
    findings: list[Finding] = []
    nodes = _nodes(slurm, findings)
    sets = _nodesets(slurm, nodes, findings)
    parts = _partitions(slurm, nodes, sets, findings)
    devices = _cross_check(nodes, gres, gres_path, findings)
    member_of: dict[str, list[str]] = defaultdict(list)
    for rec, _params, members in parts:
        for m in members:
            member_of[m].append(rec.name)
    gpus = {n.name: n.gpus for n in nodes}
    infos = []
    for n in nodes:
        gres_gpus, files, auto = devices[n.name]
        gpu_specs = [g for g in n.gres if g.name.lower() == GPU]
        infos.append(NodeInfo(
            name=n.name, gpus=n.gpus, gpu_types=tuple((g.type, g.count) for g in gpu_specs),
            gres=tuple(n.gres), location=n.record.location,
            partitions=tuple(member_of.get(n.name, ())), gres_conf_gpus=gres_gpus,
            device_files=files, autodetect=auto, state=n.params.get("state"),
            gres_error=n.gres_error))
    pinfos = []
    for rec, params, members in parts:
        gpu_members = [m for m in members if gpus.get(m, 0) > 0]
        pinfos.append(PartitionInfo(
            name=rec.name, nodes=tuple(members),
            default=(params.get("default", "NO").upper() == "YES"),
            state=params.get("state", "UP").upper(), gpu_nodes=len(gpu_members),
            gpus=sum(gpus[m] for m in gpu_members), location=rec.location))
    return Inventory(nodes=tuple(infos), partitions=tuple(pinfos)), findings
