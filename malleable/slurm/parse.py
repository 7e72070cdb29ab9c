"""Slurm JSON documents -> records, for every shape from data_parser v0.0.38 (22.05)
to v0.0.44 (25.11).

Covers ``squeue --json`` and ``scontrol show job --json`` (key ``jobs``),
``sinfo --json`` of 22.05 and ``scontrol show nodes --json`` (key ``nodes``).
What changes between releases, and how it is read here:

==========  ==================================================================
v0.0.38     plain ints (``null`` = unset); ``meta.Slurm.version`` ints;
            ``job_state`` a string; node ``state`` a lower-case string plus
            ``state_flags``; ``tres_per_*`` as ``gres:gpu:N``
v0.0.39     counts become ``{"set","infinite","number"}``; ``hold`` appears;
            ``tres_per_*`` as ``gres/gpu:N``; node ``state`` a list
v0.0.40     times become number objects too; ``job_state`` a list (base
            state + flags); ``meta.slurm.version`` strings
v0.0.41     ``job_resources.nodes`` becomes an object (``count``, ``list``,
            ``allocation``)
v0.0.42-44  ``null`` instead of ``{}`` for unset objects; renamed fields we do
            not read (e.g. ``minimum_switches`` -> ``required_switches``)
==========  ==================================================================

Unknown extra fields are ignored; missing optional fields take defaults; a field
of the wrong shape raises `SlurmParseError` naming the field path and the value.
GPUs: allocated (TRES when it names gres/gpu, else ``gres_detail``) for a job
holding nodes, requested (``tres_per_node``/``_job``/``_task``, ``tres_req_str``)
for a pending one.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

try:  # a faster decoder for the 10-60 MB a big queue prints; the stdlib one otherwise
    import orjson
except ImportError:  # pragma: no cover - orjson is a declared dependency
    orjson = None

from malleable.slurm import fields as f
from malleable.slurm import gres, rules
from malleable.slurm.client import SlurmParseError
from malleable.slurm.records import JobState, SlurmJob, SlurmNode
from malleable.slurm.versions import OLDEST_SUPPORTED, Version, version_string


@dataclass(frozen=True)
class DocMeta:
    """What a JSON document says about the Slurm that wrote it.

    Attributes:
        version: (major, minor, micro) of the client library, e.g. (22, 5, 8).
        release: "22.05.8".
        data_parser: "v0.0.38" .. "v0.0.44" ("" when the document does not say).
    """

    version: Version
    release: str
    data_parser: str


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while millions of acyclic objects (the
    decoded document, the records) are created: collections triggered by allocation
    would otherwise scan them again and again (about 40% of the parse time of a
    10,000-job 25.11 document). Restores the previous state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_json(text: str | bytes, source: str) -> dict:
    """Parse command output as a JSON object; `SlurmParseError` (naming ``source`` and the
    position) for truncated or non-JSON text, or a top level that is not an object."""
    try:
        with gc_paused():
            doc = orjson.loads(text) if orjson is not None else json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SlurmParseError(f"{source}: output is not valid JSON ({exc})",
                              field=source, value=str(text)[:200]) from None
    if not isinstance(doc, dict):
        raise f.fail(source, doc, "a JSON object")
    return doc


def _version_part(value: object, path: str) -> int:
    if isinstance(value, bool):
        raise f.fail(path, value, "a version number")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise f.fail(path, value, "a version number")


def parse_meta(doc: dict) -> DocMeta:
    """Read ``meta.Slurm.version`` (v0.0.38/39: ints) or ``meta.slurm.version`` (v0.0.40+:
    strings) and the data_parser name. Raises `SlurmParseError` when absent or malformed,
    or when the release is older than 22.05."""
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        raise f.fail("meta", meta, "an object with the Slurm version")
    key = "slurm" if "slurm" in meta else "Slurm"
    slurm = meta.get(key)
    if not isinstance(slurm, dict) or not isinstance(slurm.get("version"), dict):
        raise f.fail(f"meta.{key}.version", slurm, "an object {major, minor, micro}")
    ver = slurm["version"]
    version = tuple(_version_part(ver.get(k), f"meta.{key}.version.{k}")
                    for k in ("major", "minor", "micro"))
    if version < OLDEST_SUPPORTED:
        raise f.fail(f"meta.{key}.version", ver, "Slurm 22.05 or newer")
    release = slurm.get("release")
    release = release if isinstance(release, str) and release else version_string(version)
    plugin = meta.get("plugin") if isinstance(meta.get("plugin"), dict) else {}
    parser = plugin.get("data_parser") or plugin.get("type") or ""
    parser = parser.rsplit("/", 1)[-1] if isinstance(parser, str) else ""
    return DocMeta(version=version, release=release,
                   data_parser=parser if parser.startswith("v0.0.") else "")


def document_errors(doc: dict) -> list[str]:
    """The messages in a document's ``errors`` list (22.05 exits 0 with an empty job list
    and an error entry when the controller is down, so this must be checked)."""
    errors = doc.get("errors")
    if not isinstance(errors, list):
        return []
    out = []
    for e in errors:
        if isinstance(e, dict):
            parts = [str(e.get(k)) for k in ("error", "description", "source") if e.get(k)]
            out.append(": ".join(parts) or json.dumps(e)[:200])
        else:
            out.append(str(e)[:200])
    return out


def _gres_field(obj: dict, key: str, path: str) -> int | None:
    value = f.string(obj, key, path)
    try:
        return gres.gpus_in_gres(value)
    except ValueError:
        raise f.fail(f"{path}.{key}", value, "a GRES list like gres/gpu:4") from None


def _tres_field(obj: dict, key: str, path: str) -> int | None:
    value = f.string(obj, key, path)
    try:
        return gres.gpus_in_tres(value)
    except ValueError:
        raise f.fail(f"{path}.{key}", value, "a TRES list like cpu=2,gres/gpu=8") from None


def _job_nodes(obj: dict, path: str) -> tuple[str, int | None]:
    """(node list, node count from job_resources or None) across the v0.0.38-44 shapes."""
    nodes = f.string(obj, "nodes", path)
    res = obj.get("job_resources")
    count = None
    if res is None:
        return nodes, None
    if not isinstance(res, dict):
        raise f.fail(f"{path}.job_resources", res, "an object or null")
    inner = res.get("nodes")
    if isinstance(inner, dict):  # v0.0.41+
        count = f.number(inner, "count", f"{path}.job_resources.nodes")
        listed = f.string(inner, "list", f"{path}.job_resources.nodes")
        nodes = nodes or listed
    elif isinstance(inner, str) or inner is None:  # up to v0.0.40
        nodes = nodes or (inner or "")
        count = f.number(res, "allocated_hosts", f"{path}.job_resources")
    else:
        raise f.fail(f"{path}.job_resources.nodes", inner, "a host list or an object")
    return nodes, count


def parse_job(obj: object, path: str = "job") -> SlurmJob:
    """One job object of any v0.0.38-v0.0.44 shape -> `SlurmJob`.

    Raises `SlurmParseError` naming ``path.field`` and the value for a missing job id
    or state, or any field of the wrong shape.
    """
    if not isinstance(obj, dict):
        raise f.fail(path, obj, "a job object")
    num = f.number(obj, "job_id", path)
    if num is None or num <= 0:
        raise f.fail(f"{path}.job_id", obj.get("job_id"), "a positive job id")
    if "job_state" not in obj:
        raise f.fail(f"{path}.job_state", None, "a job state")
    state, flags = f.job_state(obj["job_state"], f"{path}.job_state")

    array_job = f.number(obj, "array_job_id", path) or None
    array_task = f.number(obj, "array_task_id", path) if array_job else None
    het_job = f.number(obj, "het_job_id", path) or None
    het_offset = f.number(obj, "het_job_offset", path, default=0) if het_job else None

    nodes, res_count = _job_nodes(obj, path)
    node_count = f.number(obj, "node_count", path)
    if node_count is None:
        node_count = res_count
    if node_count is None:
        try:
            node_count = gres.hostlist_count(nodes)
        except ValueError:
            raise f.fail(f"{path}.nodes", nodes, "a host list like node[1-2]") from None
    if node_count < 0:
        raise f.fail(f"{path}.node_count", obj.get("node_count"), "a count >= 0")
    try:
        requested_nodes = gres.tres_count(f.string(obj, "tres_req_str", path), "node")
    except ValueError:
        raise f.fail(f"{path}.tres_req_str", obj.get("tres_req_str"),
                     "a TRES list like cpu=2,node=2") from None
    node_count = rules.pending_node_count(state, node_count, requested_nodes)

    try:
        node_gpus = gres.gpus_per_allocated_node(f.string_list(obj, "gres_detail", path))
    except ValueError:
        raise f.fail(f"{path}.gres_detail", obj.get("gres_detail"),
                     "per-node GRES like gpu:4(IDX:0-3)") from None
    allocated = bool(nodes) and state != JobState.PENDING
    per_task = _gres_field(obj, "tres_per_task", path)
    gpus, gpus_per_node = gres.job_gpus(
        allocated=allocated, node_count=node_count,
        alloc_total=_tres_field(obj, "tres_alloc_str", path) if allocated else None,
        node_gpus=node_gpus,
        per_node=_gres_field(obj, "tres_per_node", path),
        per_job=_gres_field(obj, "tres_per_job", path),
        per_task=per_task,
        tasks=f.number(obj, "tasks", path) if per_task is not None else None,
        req_total=_tres_field(obj, "tres_req_str", path))

    reason = rules.reason(f.string(obj, "state_reason", path),
                          f.string(obj, "state_description", path))
    time_limit = f.minutes(obj, "time_limit", path)
    return SlurmJob(
        job_id=rules.display_job_id(num, array_job, array_task, het_job, het_offset),
        job_id_num=num,
        name=f.string(obj, "name", path),
        user=f.string(obj, "user_name", path),
        uid=f.number(obj, "user_id", path),
        account=f.string(obj, "account", path),
        partition=f.string(obj, "partition", path),
        state=state,
        state_flags=flags,
        reason=reason,
        held=state == JobState.PENDING and rules.is_held(
            state, f.number(obj, "priority", path), reason, f.boolean(obj, "hold", path)),
        nodes=nodes,
        node_count=node_count,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        submit_time=f.epoch(obj, "submit_time", path),
        eligible_time=f.epoch(obj, "eligible_time", path),
        start_time=f.epoch(obj, "start_time", path),
        end_time=rules.end_time(f.epoch(obj, "end_time", path), time_limit, state),
        time_limit=time_limit,
        restart_count=f.number(obj, "restart_cnt", path, default=0),
        requeueable=f.boolean(obj, "requeue", path),
        comment=f.string(obj, "comment", path),
        batch=f.boolean(obj, "batch_flag", path, default=True),
        array_job_id=array_job,
        array_task_id=array_task,
        het_job_id=het_job,
        het_job_offset=het_offset,
    )


def _records(doc: object, key: str, parse_one, errors: list[SlurmParseError] | None) -> list:
    if not isinstance(doc, dict):
        raise f.fail("document", doc, "a JSON object")
    parse_meta(doc)
    items = doc.get(key)
    if not isinstance(items, list):
        raise f.fail(key, items, "a list")
    out = []
    with gc_paused():
        for i, item in enumerate(items):
            try:
                out.append(parse_one(item, f"{key}[{i}]"))
            except SlurmParseError as exc:
                if errors is None:
                    raise
                errors.append(exc)
    return out


def parse_jobs(doc: object, errors: list[SlurmParseError] | None = None) -> list[SlurmJob]:
    """All jobs of a ``squeue --json`` / ``scontrol show job --json`` document.

    With ``errors`` given, a job that cannot be parsed is skipped and its
    `SlurmParseError` appended there (one bad job never hides the others);
    without it, the first error is raised. The document's meta is checked first.
    """
    return _records(doc, "jobs", parse_job, errors)


def _node_state(obj: dict, path: str) -> tuple[str, frozenset[str]]:
    value = obj.get("state")
    if isinstance(value, str) and value:  # v0.0.38: "mixed" + state_flags, or "IDLE+DRAIN"
        base, *more = value.split("+")
        flags = {m.upper() for m in more} | {s.upper() for s in f.string_list(obj, "state_flags",
                                                                              path)}
        return base.lower(), frozenset(flags)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value[0].lower(), frozenset(v.upper() for v in value[1:])
    raise f.fail(f"{path}.state", value, "a node state string or list")


def parse_node(obj: object, path: str = "node") -> SlurmNode:
    """One node object (22.05 ``sinfo --json`` or 23.02+ ``scontrol show nodes --json``)."""
    if not isinstance(obj, dict):
        raise f.fail(path, obj, "a node object")
    name = f.string(obj, "name", path)
    if not name:
        raise f.fail(f"{path}.name", obj.get("name"), "a node name")
    state, flags = _node_state(obj, path)
    return SlurmNode(
        name=name, state=state, state_flags=flags,
        partitions=tuple(f.string_list(obj, "partitions", path)),
        gpus=_gres_field(obj, "gres", path) or 0,
        gpus_allocated=_gres_field(obj, "gres_used", path) or 0,
    )


def parse_nodes(doc: object, errors: list[SlurmParseError] | None = None) -> list[SlurmNode]:
    """All nodes of a ``sinfo --json`` (22.05) / ``scontrol show nodes --json`` document;
    ``errors`` as in `parse_jobs`."""
    return _records(doc, "nodes", parse_node, errors)
