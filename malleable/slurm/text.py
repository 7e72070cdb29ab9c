"""Text fallbacks: ``scontrol show ... -o`` and ``scontrol show config`` -> records.

Used where a release has no JSON for the query (``scontrol show job --json`` only
exists from 23.02, so 22.05's ``job(id)`` reads ``scontrol show job -d -o ID``),
for partitions (their default flag is only in the text form on every release),
and for the whole job table when a site's Slurm was built without JSON support.

One-liner output is ``Key=Value`` pairs separated by spaces. Values may contain
spaces (``Comment=``, ``Reason=``, ``OS=``), so a pair boundary is a ``Key=`` token
outside free-text fields, or one of Slurm's own key names inside them. Times are
printed in the local time zone (the commands run with SLURM_TIME_FORMAT=standard)
and converted to UTC here. The same rules as the JSON parser (`rules`, `gres`)
make the records equal to the JSON ones for the same job.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from malleable.slurm import fields as f
from malleable.slurm import gres, rules
from malleable.slurm.client import SlurmParseError
from malleable.slurm.records import JobState, SlurmJob, SlurmNode

_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z_][A-Za-z0-9_/:.]*)=")

# Values that are free text: inside them, only these Slurm key names end the value.
_FREE_TEXT = {"Comment", "AdminComment", "SystemComment", "Extra", "Reason", "OS", "JobName"}
_KNOWN_KEYS = {
    "JobId", "ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle", "HetJobId", "HetJobOffset",
    "HetJobIdSet", "JobName", "UserId", "GroupId", "MCS_label", "Priority", "Nice",
    "Account", "QOS", "JobState", "Reason", "Dependency", "Requeue", "Restarts", "BatchFlag",
    "Reboot", "ExitCode", "DerivedExitCode", "RunTime", "TimeLimit", "TimeMin",
    "SubmitTime", "EligibleTime", "AccrueTime", "StartTime", "EndTime", "Deadline",
    "SuspendTime", "SecsPreSuspend", "LastSchedEval", "Scheduler", "Partition",
    "AllocNode:Sid", "ReqNodeList", "ExcNodeList", "NodeList", "SchedNodeList", "BatchHost",
    "NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "ReqB:S:C:T", "TRES", "ReqTRES",
    "AllocTRES", "Socks/Node", "NtasksPerN:B:S:C", "CoreSpec", "JOB_GRES", "Nodes",
    "CPU_IDs", "Mem", "GRES", "MinCPUsNode", "MinMemoryNode", "MinMemoryCPU",
    "MinTmpDiskNode", "Features", "DelayBoot", "OverSubscribe", "Contiguous", "Licenses",
    "Network", "Command", "WorkDir", "Comment", "AdminComment", "SystemComment", "Extra",
    "StdErr", "StdIn", "StdOut", "Power", "TresPerNode", "TresPerJob", "TresPerTask",
    "TresPerSocket", "CpusPerTres", "MemPerTres", "TresBind", "TresFreq", "MailUser",
    "MailType", "Container", "ContainerID", "Reservation", "Prefer", "NtasksPerTRES",
    "NodeName", "Arch", "CoresPerSocket", "CPUAlloc", "CPUEfctv", "CPUTot", "CPULoad",
    "AvailableFeatures", "ActiveFeatures", "Gres", "GresDrain", "GresUsed", "NodeAddr",
    "NodeHostName", "Port", "Version", "OS", "RealMemory", "AllocMem", "FreeMem",
    "Sockets", "Boards", "State", "ThreadsPerCore", "TmpDisk", "Weight", "Owner",
    "Partitions", "BootTime", "SlurmdStartTime", "LastBusyTime", "ResumeAfterTime",
    "CfgTRES", "CapWatts", "CurrentWatts", "AveWatts", "ExtSensorsJoules",
    "ExtSensorsWatts", "ExtSensorsTemp", "PartitionName", "Default",
}
_NONE = {"", "(null)", "Unknown", "None", "N/A", "n/a"}
# A comment ends where Slurm's next field starts; these follow it on 22.05-25.11, so a
# comment containing "Power=x" is not cut short when one of them comes later.
_AFTER_COMMENT = ("StdErr", "StdIn", "StdOut")
_COMMENTS = {"Comment", "AdminComment", "SystemComment", "Extra"}


def key_values(line: str) -> list[tuple[str, str]]:
    """``"A=1 B=x y C=(null)"`` -> [("A", "1"), ("B", "x y"), ("C", "(null)")], in order
    (keys may repeat: ``Nodes=``/``GRES=`` appear once per node group)."""
    pairs: list[tuple[str, str]] = []
    key, start = None, 0
    matches = list(_KEY.finditer(line))
    for i, m in enumerate(matches):
        if key is not None and key in _FREE_TEXT and m.group(1) not in _KNOWN_KEYS:
            continue
        if (key in _COMMENTS and m.group(1) not in _AFTER_COMMENT
                and any(later.group(1) in _AFTER_COMMENT for later in matches[i:])):
            continue
        if key is not None:
            pairs.append((key, line[start:m.start()].strip()))
        key, start = m.group(1), m.end()
    if key is not None:
        pairs.append((key, line[start:].strip()))
    return pairs


def _value(d: dict, key: str) -> str:
    v = d.get(key, "")
    return "" if v in _NONE else v


def _int(d: dict, key: str, path: str, default: int | None = None) -> int | None:
    v = _value(d, key)
    if not v:
        return default
    m = re.match(r"\d+", v)
    if not m:
        raise f.fail(f"{path}.{key}", v, "an integer")
    return int(m.group(0))


def _time(d: dict, key: str, path: str) -> datetime | None:
    v = _value(d, key)
    if not v:
        return None
    try:
        return datetime.strptime(v, "%Y-%m-%dT%H:%M:%S").astimezone(UTC)
    except (ValueError, OverflowError, OSError):
        raise f.fail(f"{path}.{key}", v, "a time like 2026-01-31T12:00:00") from None


def time_limit(value: str, path: str = "TimeLimit") -> timedelta | None:
    """``UNLIMITED`` -> None; ``1-02:03:04``, ``02:03:04``, ``03:04`` (min:sec), ``90`` (min)."""
    if value in _NONE or value.upper() in {"UNLIMITED", "INFINITE", "PARTITION_LIMIT", "NONE"}:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not m:
        raise f.fail(path, value, "a time limit like 1-00:00:00 or UNLIMITED")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    try:
        if days is not None:  # d-h, d-h:m, d-h:m:s
            limit = timedelta(days=days, hours=a, minutes=b or 0, seconds=c or 0)
        elif c is not None:
            limit = timedelta(hours=a, minutes=b, seconds=c)
        elif b is not None:
            limit = timedelta(minutes=a, seconds=b)
        else:
            limit = timedelta(minutes=a)
    except OverflowError:
        limit = None
    if limit is None or limit > timedelta(days=70_000):
        raise f.fail(path, value, "a time limit under 190 years")
    return limit


def _gres(value: str, path: str) -> int | None:
    try:
        return gres.gpus_in_gres(value)
    except ValueError:
        raise f.fail(path, value, "a GRES list like gpu:4") from None


def _tres(value: str, path: str) -> int | None:
    try:
        return gres.gpus_in_tres(value)
    except ValueError:
        raise f.fail(path, value, "a TRES list like cpu=2,gres/gpu=8") from None


def parse_job_line(line: str, path: str = "job") -> SlurmJob:
    """One ``scontrol show job -d -o`` line -> `SlurmJob` (same rules as the JSON parser)."""
    pairs = key_values(line)
    d: dict[str, str] = {}
    node_gpus: list[int] = []
    group_nodes = None
    for k, v in pairs:
        if k == "Nodes":
            group_nodes = v
        elif k == "GRES" and group_nodes is not None:
            if not _value({"v": v}, "v"):  # a finished job keeps "GRES=" empty
                continue
            try:
                n = gres.hostlist_count(group_nodes)
            except ValueError:
                raise f.fail(f"{path}.Nodes", group_nodes, "a host list") from None
            node_gpus += [_gres(v, f"{path}.GRES") or 0] * n
            continue
        d.setdefault(k, v)
    num = _int(d, "JobId", path)
    if not num:
        raise f.fail(f"{path}.JobId", d.get("JobId"), "a positive job id")
    if not _value(d, "JobState"):
        raise f.fail(f"{path}.JobState", d.get("JobState"), "a job state")
    state, flags = f.job_state(d["JobState"], f"{path}.JobState")

    array_job = _int(d, "ArrayJobId", path) or None
    task = _value(d, "ArrayTaskId")
    array_task = int(task) if array_job and task.isdigit() else None
    het_job = _int(d, "HetJobId", path) or None
    het_offset = _int(d, "HetJobOffset", path, default=0) if het_job else None

    nodes = _value(d, "NodeList")
    node_count = _int(d, "NumNodes", path, default=0)
    allocated = bool(nodes) and state != JobState.PENDING
    alloc_str = _value(d, "AllocTRES") or (_value(d, "TRES") if allocated else "")
    req_str = _value(d, "ReqTRES") or ("" if allocated else _value(d, "TRES"))
    try:
        node_count = rules.pending_node_count(state, node_count, gres.tres_count(req_str, "node"))
    except ValueError:
        raise f.fail(f"{path}.ReqTRES", req_str, "a TRES list like cpu=2,node=2") from None
    alloc_total = _tres(alloc_str, f"{path}.AllocTRES")
    if alloc_total is None and not node_gpus and allocated:
        alloc_total = _gres(_value(d, "JOB_GRES"), f"{path}.JOB_GRES")
    gpus, per_node = gres.job_gpus(
        allocated=allocated, node_count=node_count, alloc_total=alloc_total,
        node_gpus=node_gpus,
        per_node=_gres(_value(d, "TresPerNode"), f"{path}.TresPerNode"),
        per_job=_gres(_value(d, "TresPerJob"), f"{path}.TresPerJob"),
        per_task=_gres(_value(d, "TresPerTask"), f"{path}.TresPerTask"),
        tasks=_int(d, "NumTasks", path),
        req_total=_tres(req_str, f"{path}.ReqTRES"))

    user, uid = _value(d, "UserId"), None
    m = re.fullmatch(r"(.*)\((\d+)\)", user)
    if m:
        user, uid = m.group(1), int(m.group(2))
    reason = rules.reason(d.get("Reason", ""))
    limit = time_limit(d.get("TimeLimit", ""), f"{path}.TimeLimit")
    return SlurmJob(
        job_id=rules.display_job_id(num, array_job, array_task, het_job, het_offset),
        job_id_num=num, name=d.get("JobName", ""), user=user, uid=uid,
        account=_value(d, "Account"), partition=_value(d, "Partition"),
        state=state, state_flags=flags, reason=reason,
        held=rules.is_held(state, _int(d, "Priority", path), reason),
        nodes=nodes, node_count=node_count, gpus=gpus, gpus_per_node=per_node,
        submit_time=_time(d, "SubmitTime", path),
        eligible_time=_time(d, "EligibleTime", path),
        start_time=_time(d, "StartTime", path),
        end_time=rules.end_time(_time(d, "EndTime", path), limit, state),
        time_limit=limit,
        restart_count=_int(d, "Restarts", path, default=0),
        requeueable=_value(d, "Requeue") == "1",
        comment=_value(d, "Comment"),
        batch=_value(d, "BatchFlag") != "0",
        array_job_id=array_job, array_task_id=array_task,
        het_job_id=het_job, het_job_offset=het_offset,
    )


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "=" in ln]


def parse_jobs_text(text: str, errors: list[SlurmParseError] | None = None) -> list[SlurmJob]:
    """All jobs of ``scontrol show job -d -o`` output ("No jobs in the system" -> []);
    ``errors`` as in `malleable.slurm.parse.parse_jobs`."""
    out = []
    for i, line in enumerate(_lines(text)):
        try:
            out.append(parse_job_line(line, f"job line {i + 1}"))
        except SlurmParseError as exc:
            if errors is None:
                raise
            errors.append(exc)
    return out


def parse_node_line(line: str, path: str = "node") -> SlurmNode:
    """One ``scontrol show node -d -o`` line -> `SlurmNode`."""
    d: dict[str, str] = {}
    for k, v in key_values(line):
        d.setdefault(k, v)
    name = _value(d, "NodeName")
    if not name:
        raise f.fail(f"{path}.NodeName", d.get("NodeName"), "a node name")
    base, *more = (_value(d, "State") or "unknown").split("+")
    return SlurmNode(
        name=name, state=base.lower(), state_flags=frozenset(m.upper() for m in more),
        partitions=tuple(p for p in _value(d, "Partitions").split(",") if p),
        gpus=_gres(_value(d, "Gres"), f"{path}.Gres") or 0,
        gpus_allocated=_gres(_value(d, "GresUsed"), f"{path}.GresUsed") or 0,
    )


def parse_nodes_text(text: str) -> list[SlurmNode]:
    """All nodes of ``scontrol show node -d -o`` output."""
    return [parse_node_line(ln, f"node line {i + 1}") for i, ln in enumerate(_lines(text))]


def parse_partitions_text(text: str) -> list[tuple[str, bool]]:
    """``scontrol show partition -o`` -> [(name, is_default)] in Slurm's order."""
    out = []
    for i, line in enumerate(_lines(text)):
        d = dict(key_values(line))
        name = _value(d, "PartitionName")
        if not name:
            raise f.fail(f"partition line {i + 1}.PartitionName", d.get("PartitionName"),
                         "a partition name")
        out.append((name, d.get("Default", "NO").upper() == "YES"))
    return out


def parse_config_text(text: str) -> dict[str, str]:
    """``scontrol show config`` ("Key = Value" lines) -> {Key: Value}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out
