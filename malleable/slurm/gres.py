"""GPU counts from Slurm's GRES and TRES strings, and node counts from host lists.

Slurm spells the same GPUs several ways, depending on the field and the release:

* requested per node/job/task (``tres_per_node`` etc.): ``gres:gpu:4`` (22.05),
  ``gres/gpu:4`` (23.02+), with a type ``gres/gpu:a100:2``, several GRES
  comma-separated ``gres/gpu:2,gres/shard:1``; ``--gres=gpu`` means one GPU;
* allocated per node (``gres_detail``, scontrol ``GRES=``): ``gpu:4(IDX:0-3)``,
  ``gpu:h100:1(IDX:0),gpu:h200:0(IDX:)``;
* configured/used on a node: ``gpu:4``, ``gpu:a100:4(S:0-1)``;
* TRES totals (``tres_alloc_str``, ``AllocTRES=``): ``cpu=2,gres/gpu=8,gres/gpu:a100=8``
  (without slurmdbd, 22.05 leaves gres/gpu out of the allocated TRES entirely).

Every function here is pure (the string parsers keep an LRU cache, since one
queue repeats the same few strings across thousands of jobs); a malformed string
raises ``ValueError`` naming it, which the parsers turn into `SlurmParseError`
with the field name.
"""

from __future__ import annotations

import re
from functools import lru_cache

_NULL = {"", "n/a", "(null)", "none"}


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split ``text`` at ``sep`` outside parentheses and brackets.

    >>> split_top("gpu:2(IDX:0,2),shard:1")
    ['gpu:2(IDX:0,2)', 'shard:1']
    """
    if "(" not in text and "[" not in text:  # the common case, without a Python loop
        return [p.strip() for p in text.split(sep) if p.strip()]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _gres_entry(entry: str) -> tuple[str, int]:
    """(name, count) of one GRES entry such as ``gres/gpu:a100:2`` or ``gpu:4(IDX:0-3)``."""
    core = entry.split("(", 1)[0].strip()
    for prefix in ("gres:", "gres/"):
        if core.startswith(prefix):
            core = core[len(prefix):]
    parts = core.split(":")
    name = parts[0]
    if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"bad GRES entry {entry!r}")
    if len(parts) == 1:
        return name, 1
    last = parts[-1]
    if last.isdigit():
        return name, int(last)
    if len(parts) == 2:  # name:type with the count left out, e.g. --gres=gpu:a100
        return name, 1
    raise ValueError(f"bad GRES count in {entry!r}")


@lru_cache(maxsize=8192)
def gpus_in_gres(spec: str | None) -> int | None:
    """Total GPUs in a GRES list (``gres/gpu:a100:2,gres/shard:1`` -> 2).

    Returns None when the string names no GPU at all (so a caller can fall back to
    another field), 0 for an explicit zero. Raises ValueError for a malformed entry.
    """
    if spec is None or spec.strip().lower() in _NULL:
        return None
    total, seen = 0, False
    for entry in split_top(spec):
        if entry.lower() in _NULL:
            continue
        name, count = _gres_entry(entry)
        if name == "gpu":
            total += count
            seen = True
    return total if seen else None


@lru_cache(maxsize=8192)
def gpus_in_tres(tres: str | None) -> int | None:
    """GPUs in a TRES string (``cpu=2,gres/gpu=8,gres/gpu:a100=8`` -> 8).

    The untyped ``gres/gpu`` entry is the total; when only typed entries are
    present they are summed. None when no GPU entry exists.
    """
    items = tres_map(tres)
    if "gres/gpu" in items:
        return items["gres/gpu"]
    typed = [v for k, v in items.items() if k.startswith("gres/gpu:")]
    return sum(typed) if typed else None


def tres_count(tres: str | None, name: str) -> int | None:
    """The count of one TRES (``node`` in ``cpu=3,node=3`` -> 3), None when absent."""
    return tres_map(tres).get(name)


@lru_cache(maxsize=8192)
def tres_map(tres: str | None) -> dict[str, int]:
    """``cpu=2,mem=1G,node=2,gres/gpu=8`` -> {"cpu": 2, "node": 2, "gres/gpu": 8} (keys lower
    case; counts with a unit suffix such as ``mem=1G`` are left out). Treat as read-only
    (cached). Raises ValueError for an entry without ``=`` or a non-numeric GPU/node count."""
    if tres is None or tres.strip().lower() in _NULL:
        return {}
    out = {}
    for item in split_top(tres):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"bad TRES entry {item!r} in {tres!r}")
        key, value = key.strip().lower(), value.strip()
        if value.isdigit():
            out[key] = int(value)
        elif key in ("node", "gres/gpu") or key.startswith("gres/gpu:"):
            raise ValueError(f"bad count {value!r} in {tres!r}")
    return out


def gpus_per_allocated_node(details: list[str]) -> list[int]:
    """Per-node allocated GPUs from ``gres_detail`` (one string per allocated node)."""
    return [gpus_in_gres(d) or 0 for d in details]


def _bracket_size(inner: str) -> int:
    size = 0
    for part in inner.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"bad host range {part!r}")
        size += (int(hi) - int(lo) + 1) if dash else 1
        if dash and int(hi) < int(lo):
            raise ValueError(f"bad host range {part!r}")
    return size


@lru_cache(maxsize=8192)
def hostlist_count(expr: str | None) -> int:
    """Number of hosts in a Slurm host list: ``node[1-2],gpu3`` -> 3, ``""`` -> 0.

    Handles several bracket groups in one name (``r[1-2]n[1-3]`` -> 6).
    Raises ValueError for a malformed range.
    """
    if expr is None or expr.strip().lower() in _NULL:
        return 0
    count = 0
    for host in split_top(expr):
        n = 1
        for inner in re.findall(r"\[([^\]]*)\]", host):
            n *= _bracket_size(inner)
        if "[" in host and not re.search(r"\[[^\]]*\]", host):
            raise ValueError(f"bad host list {expr!r}")
        count += n
    return count


def tres_per_node_gpus(version: tuple[int, int, int], gpus_per_node: int) -> str:
    """The ``TresPerNode=`` value that sets ``gpus_per_node`` GPUs on each node.

    Slurm stores GRES requests with a type prefix and compares the string it was
    given with that form: 22.05 uses ``gres:gpu:N`` (an update to ``gres/gpu:N``
    is accepted there but ignored at allocation, verified on the harness);
    23.02 and later use ``gres/gpu:N`` (``gres_prepend_tres_type`` writes
    ``gres/`` and squeue/scontrol of 23.11-25.11 print ``gres/gpu:N``).
    """
    prefix = "gres:" if version < (23, 2, 0) else "gres/"
    return f"{prefix}gpu:{gpus_per_node}"


def job_gpus(*, allocated: bool, node_count: int, alloc_total: int | None = None,
             node_gpus: list[int] | None = None, per_node: int | None = None,
             per_job: int | None = None, per_task: int | None = None,
             tasks: int | None = None, req_total: int | None = None) -> tuple[int, int]:
    """(GPUs in total, GPUs per node) of one job, from already parsed counts.

    With an allocation (``allocated``: the job holds nodes), the allocated TRES
    total wins when it names gres/gpu (sites with slurmdbd, newer releases);
    else the per-node allocated GRES (``gres_detail`` / scontrol ``GRES=``),
    summed, with the per-node figure the maximum over nodes. Without an
    allocation (pending), or when neither is known, the request: per node x
    nodes, per job, per task x tasks, or the requested TRES total, in that order.
    Arguments are the outputs of `gpus_in_gres` / `gpus_in_tres` (None = absent).
    """
    nodes = max(node_count, 1)
    if allocated:
        if alloc_total is not None:
            per = max(node_gpus) if node_gpus else -(-alloc_total // nodes)
            return alloc_total, per
        if node_gpus:
            return sum(node_gpus), max(node_gpus)
    if per_node is not None:
        return per_node * nodes, per_node
    if per_job is not None:
        return per_job, -(-per_job // nodes)
    if per_task is not None:
        total = per_task * max(tasks or 1, 1)
        return total, -(-total // nodes)
    if req_total is not None:
        return req_total, -(-req_total // nodes)
    return 0, 0
