"""The prerequisite checks: what malleable needs from Slurm's configuration.

Each check reads the effective settings (`Settings`: file values, overridden
by the running controller's) and the GPU inventory, and returns findings with
the check's id, a severity, the file and line concerned and the concrete fix.
docs/conf-check.md lists every check, its reasons and its sources.

Severity decisions (the reasons are in each message):

* ``SelectType``: select/cons_tres is required. select/linear is an error (it
  allocates whole nodes and does not track GPUs per GRES). select/cons_res is
  an error too: the GPU job options (``--gpus``, ``--gpus-per-task``,
  ``--cpus-per-gpu``, ``--mem-per-gpu``, ``--ntasks-per-gpu``) are
  cons_tres-only per sbatch(1), malleable counts job sizes in GPUs, and the
  fix is cheap: cons_res -> cons_tres is the one SelectType change that keeps
  running and pending jobs (slurm.conf(5)).
* ``JobRequeue=0`` is an error: checkpoint-requeue is how malleable grows
  and shrinks jobs, and with it every malleable job submitted without
  ``--requeue`` is left at its size (``malleable submit`` adds ``--requeue``,
  so its jobs still work; the finding says so).
* ``MinJobAge`` below two poll intervals is a warning: a job that ends just
  after one poll can be purged before the next, and the daemon never sees its
  final state. ``MinJobAge=0`` (never purge) is an info.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from malleable.config import Config
from malleable.slurm.hostlist import compress_hostlist
from malleable.slurm_conf.controller import ControllerQuery
from malleable.slurm_conf.keys import GRES_CONF_KEYS, GRES_CONF_PARAMS, SLURM_CONF_KEYS
from malleable.slurm_conf.parser import ParsedConf
from malleable.slurm_conf.records import CheckResult, Finding, Inventory, Location, Severity
from malleable.slurm_conf.settings import Settings

CHECKS: tuple[tuple[str, str], ...] = (
    ("files", "configuration files readable and well-formed"),
    ("keys", "every setting is one Slurm knows"),
    ("controller", "running slurmctld agrees with the files"),
    ("select-type", "GPUs allocated as consumable TRES (select/cons_tres)"),
    ("gres-types", "GresTypes includes gpu"),
    ("gpu-nodes", "nodes with GPU GRES"),
    ("gpu-devices", "GPU GRES bound to device files (gres.conf)"),
    ("partitions", "a partition holds the GPU nodes"),
    ("job-requeue", "jobs can be requeued (checkpoint-requeue resizes)"),
    ("job-shrink", "running jobs may shrink in place"),
    ("min-job-age", "finished jobs stay visible for two poll intervals"),
    ("proctrack", "process tracking and prolog"),
    ("spool-dir", "slurmstepd's sockets fit Linux's path limit"),
)
"""(check id, title) in report order."""

FILE_FINDINGS = frozenset({"syntax", "unreadable", "include", "duplicate"})
"""Parser finding ids, reported under the ``files`` check."""

STATUS_OK = "ok"
STATUS_SKIPPED = "skipped"
RECOMMENDED_MIN_JOB_AGE_S = 300
"""Slurm's default MinJobAge; the fix never suggests less."""
SOCKET_PATH_MAX = 107
"""Bytes in a Unix socket path on Linux (``sun_path`` is 108 with its NUL)."""
DEFAULT_SPOOL_DIR = "/var/spool/slurmd"
DEFAULT_MAX_JOB_ID = 67043328
"""slurm.conf(5) defaults of SlurmdSpoolDir and MaxJobId."""
STEP_ID_DIGITS = 10
"""Digits of the batch and extern step ids (4294967291, 4294967292)."""


def _finding(sev: Severity, check: str, setting_loc: Location, message: str,
             fix: str | None) -> Finding:
    return Finding(sev, check, setting_loc, message, fix)


def _items(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def check_job_requeue(settings: Settings) -> tuple[str, list[Finding]]:
    """``JobRequeue``: 1 (default) lets batch jobs be requeued; 0 needs ``--requeue`` per job."""
    s = settings.get("JobRequeue")
    if s.value is None:
        return "JobRequeue=1 (default): batch jobs may be requeued", []
    v = s.value.strip()
    if v == "1":
        return f"JobRequeue=1 ({s.where})", []
    if v == "0":
        return f"JobRequeue=0 ({s.where})", [_finding(
            Severity.ERROR, "job-requeue", s.location,
            "JobRequeue=0: batch jobs are not requeueable unless submitted with --requeue. "
            "`malleable submit` adds --requeue, so its jobs can be resized; a malleable job "
            "submitted with plain sbatch and no --requeue cannot be grown or shrunk by "
            "checkpoint-requeue (Slurm refuses: 'Requested operation is presently disabled')",
            "JobRequeue=1   (or submit every malleable job with --requeue)")]
    return f"JobRequeue={v} ({s.where})", [_finding(
        Severity.ERROR, "job-requeue", s.location,
        f"JobRequeue={v} is not 0 or 1; slurmctld refuses to start", "JobRequeue=1")]


def check_select_type(settings: Settings) -> tuple[str, list[Finding]]:
    """``SelectType`` must be select/cons_tres (see the module docstring for why)."""
    s = settings.get("SelectType")
    params = {p.upper() for p in _items(settings.get("SelectTypeParameters").value)}
    restart = "then restart slurmctld and every slurmd"
    if s.value is None:
        return "SelectType not set", [_finding(
            Severity.ERROR, "select-type", s.location,
            "SelectType is not set: Slurm 22.05 then uses select/linear, which allocates whole "
            "nodes and cannot give a job some of a node's GPUs (the default differs between "
            "releases: set it explicitly)",
            f"SelectType=select/cons_tres   ({restart})")]
    v = s.value.strip()
    low = v.lower()
    summary = f"SelectType={v} ({s.where})"
    if low == "select/cons_tres" or (low == "select/cray_aries" and "OTHER_CONS_TRES" in params):
        return summary, []
    if low == "select/linear" or low == "select/cray_aries":
        return summary, [_finding(
            Severity.ERROR, "select-type", s.location,
            f"SelectType={v} allocates whole nodes and does not track GPUs per GRES: a job "
            f"cannot hold k GPUs of a node, and malleable sizes jobs in GPUs",
            f"SelectType=select/cons_tres   ({restart}; slurm.conf(5): leaving {v} loses "
            f"running and pending jobs, so drain first)")]
    if low == "select/cons_res":
        return summary, [_finding(
            Severity.ERROR, "select-type", s.location,
            "SelectType=select/cons_res does not allocate GPUs as consumable TRES: the GPU job "
            "options (--gpus, --gpus-per-task, --cpus-per-gpu, --mem-per-gpu, "
            "--ntasks-per-gpu) need select/cons_tres (sbatch(1)), and malleable sizes jobs in "
            "GPUs",
            f"SelectType=select/cons_tres   ({restart}; slurm.conf(5): cons_res -> cons_tres "
            f"keeps running and pending jobs)")]
    return summary, [_finding(
        Severity.ERROR, "select-type", s.location,
        f"SelectType={v} is not select/cons_tres, the plugin that allocates GPUs as "
        f"consumable TRES", f"SelectType=select/cons_tres   ({restart})")]


def check_gres_types(settings: Settings, inventory: Inventory) -> tuple[str, list[Finding]]:
    """``GresTypes`` must list gpu, or Slurm does not manage the GPUs at all."""
    s = settings.get("GresTypes")
    types = _items(s.value)
    if "gpu" in {t.lower() for t in types}:
        return f"GresTypes={s.value} ({s.where})", []
    fix = f"GresTypes={','.join(types + ['gpu'])}"
    why = ("the nodes' Gres=gpu is refused" if inventory.gpu_nodes
           else "no GPU can be defined")
    if s.value is None:
        return "GresTypes not set", [_finding(
            Severity.ERROR, "gres-types", s.location,
            f"GresTypes is not set, so Slurm manages no generic resources and {why}", fix)]
    return f"GresTypes={s.value} ({s.where})", [_finding(
        Severity.ERROR, "gres-types", s.location,
        f"GresTypes={s.value} does not include gpu, so {why}",
        f"{fix}   (restart slurmctld and every slurmd)")]


def check_gpu_nodes(conf: ParsedConf, inventory: Inventory) -> tuple[str, list[Finding]]:
    """At least one node must have GPU GRES (``Gres=gpu:N`` on its NodeName line)."""
    gpu_nodes = inventory.gpu_nodes
    if gpu_nodes:
        types = sorted({t for n in gpu_nodes for t, _ in n.gpu_types if t})
        kind = f" ({', '.join(types)})" if types else ""
        return (f"{inventory.total_gpus} GPUs{kind} on {len(gpu_nodes)} of "
                f"{len(inventory.nodes)} nodes"), []
    records = conf.records_of("NodeName")
    loc = records[0].location if records else Location(conf.path)
    names = compress_hostlist(n.name for n in inventory.nodes) or "gpu[01-04]"
    return f"no GPU among {len(inventory.nodes)} nodes", [_finding(
        Severity.ERROR, "gpu-nodes", loc,
        "no node has GPU GRES (Gres=gpu:N on its NodeName line): malleable has no GPUs to "
        "manage",
        f"NodeName={names} ... Gres=gpu:4   (the node's GPU count; with GresTypes=gpu and "
        f"gres.conf device files)")]


def check_gpu_devices(inventory: Inventory, gres: ParsedConf | None,
                      gres_path: str) -> str:
    """Summary of the GPU device cross-check; its findings come from `build_inventory`."""
    gpu_nodes = inventory.gpu_nodes
    if gres is not None and not gres.readable:
        return f"{gres_path} unreadable: device files not checked"
    auto = [n for n in gpu_nodes if n.autodetect]
    files = [n for n in gpu_nodes if n.device_files]
    parts = []
    if files:
        parts.append(f"{sum(len(n.device_files) for n in files)} device files on "
                     f"{len(files)} nodes")
    if auto:
        parts.append(f"AutoDetect={auto[0].autodetect} on {len(auto)} nodes")
    if gres is None:
        parts.append(f"no gres.conf at {gres_path}")
    return "; ".join(parts) or "no GPU nodes"


def check_partitions(inventory: Inventory, config: Config) -> tuple[str, list[Finding]]:
    """A partition in state UP must hold GPU nodes; GPU nodes outside every partition and
    partitions named in malleable's ``slurm.partitions`` that lack GPUs are reported."""
    findings: list[Finding] = []
    gpu_parts = [p for p in inventory.partitions if p.gpu_nodes]
    up = [p for p in gpu_parts if p.state == "UP"]
    gpu_nodes = inventory.gpu_nodes
    if gpu_nodes and not gpu_parts:
        last = inventory.partitions[-1].location if inventory.partitions else \
            (gpu_nodes[0].location)
        findings.append(_finding(
            Severity.ERROR, "partitions", last,
            "no partition holds a GPU node: no job can be given GPUs",
            f"PartitionName=gpu Nodes={compress_hostlist(n.name for n in gpu_nodes)} "
            f"State=UP MaxTime=INFINITE"))
    elif gpu_parts and not up:
        p = gpu_parts[0]
        findings.append(_finding(
            Severity.WARNING, "partitions", p.location,
            f"every partition with GPU nodes is {p.state}, so no GPU job starts",
            f"State=UP on the PartitionName={p.name} line"))
    lonely = [n for n in gpu_nodes if not n.partitions]
    if lonely and gpu_parts:
        p = gpu_parts[0]
        findings.append(_finding(
            Severity.WARNING, "partitions", lonely[0].location,
            f"GPU nodes in no partition: {compress_hostlist(n.name for n in lonely)}; their "
            f"GPUs are never used",
            f"add them to Nodes= of PartitionName={p.name} ({p.location})"))
    for name in config.slurm.partitions:
        p = inventory.partition(name)
        where = Location(config.source)
        if p is None:
            findings.append(_finding(
                Severity.ERROR, "partitions", where,
                f"malleable's slurm.partitions names {name!r}, which slurm.conf does not define",
                f"define PartitionName={name} in slurm.conf, or correct slurm.partitions in "
                f"{config.source}"))
        elif not p.gpu_nodes:
            findings.append(_finding(
                Severity.ERROR, "partitions", p.location,
                f"partition {name} (managed by malleable per slurm.partitions) holds no GPU node",
                f"add GPU nodes to Nodes= of PartitionName={name}"))
    summary = "; ".join(f"{p.name}{' (default)' if p.default else ''}: {p.gpu_nodes} GPU "
                        f"nodes, {p.gpus} GPUs, {p.state}" for p in gpu_parts)
    return summary or "no partition with GPU nodes", findings


def check_job_shrink(settings: Settings) -> tuple[str, list[Finding]]:
    """``SchedulerParameters=disable_job_shrink`` refuses in-place shrink (a warning)."""
    s = settings.get("SchedulerParameters")
    items = _items(s.value)
    if not any(i.lower() == "disable_job_shrink" for i in items):
        shown = f"SchedulerParameters={s.value}" if s.value else "SchedulerParameters not set"
        return f"{shown}: shrink allowed", []
    rest = [i for i in items if i.lower() != "disable_job_shrink"]
    fix = (f"SchedulerParameters={','.join(rest)}   (disable_job_shrink removed; then "
           f"`scontrol reconfigure`)" if rest else
           "remove the SchedulerParameters line (disable_job_shrink is its only option); then "
           "`scontrol reconfigure`")
    return f"SchedulerParameters has disable_job_shrink ({s.where})", [_finding(
        Severity.WARNING, "job-shrink", s.location,
        "SchedulerParameters has disable_job_shrink: Slurm refuses to shrink a running job "
        "(scontrol update NumNodes=), so every shrink becomes a checkpoint-requeue and costs "
        "a restart; keep it only if no malleable job should shrink in place", fix)]


def check_min_job_age(settings: Settings, config: Config) -> tuple[str, list[Finding]]:
    """``MinJobAge`` must keep finished jobs for at least two of the daemon's poll intervals."""
    s = settings.get("MinJobAge")
    poll = config.daemon.poll_interval_s
    need = 2 * poll
    if s.value is None:
        value = RECOMMENDED_MIN_JOB_AGE_S
        shown = f"MinJobAge={value} s (default)"
    else:
        digits = s.value.strip().split()[0] if s.value.strip() else ""
        if not digits.isdigit():
            return f"MinJobAge={s.value}", [_finding(
                Severity.ERROR, "min-job-age", s.location,
                f"MinJobAge={s.value} is not a number of seconds; slurmctld refuses it",
                f"MinJobAge={max(RECOMMENDED_MIN_JOB_AGE_S, math.ceil(need))}")]
        value = int(digits)
        shown = f"MinJobAge={value} s ({s.where})"
    summary = f"{shown}; daemon polls every {poll:g} s"
    if value == 0:
        return summary, [_finding(
            Severity.INFO, "min-job-age", s.location,
            "MinJobAge=0: finished job records are never purged; the daemon sees every final "
            "state, but slurmctld's memory grows until MaxJobCount",
            None)]
    if value < need:
        return summary, [_finding(
            Severity.WARNING, "min-job-age", s.location,
            f"MinJobAge={value}: finished jobs leave squeue {value} s after they end, but the "
            f"daemon polls every {poll:g} s (daemon.poll_interval_s); a job that ends just "
            f"after one poll can be gone before the next, and its final state is never seen. "
            f"It needs at least two poll intervals ({need:g} s)",
            f"MinJobAge={max(RECOMMENDED_MIN_JOB_AGE_S, math.ceil(need))}   "
            f"(then `scontrol reconfigure`)")]
    return summary, []


def check_proctrack(settings: Settings) -> tuple[str, list[Finding]]:
    """``ProctrackType`` and ``PrologFlags`` notes that matter for checkpoint-requeue."""
    out: list[Finding] = []
    s = settings.get("ProctrackType")
    value = (s.value or "proctrack/cgroup").strip()
    low = value.lower()
    shown = f"ProctrackType={value} ({s.where})"
    if low in ("proctrack/linuxproc", "proctrack/pgid"):
        sev = Severity.INFO if low == "proctrack/linuxproc" else Severity.WARNING
        out.append(_finding(
            sev, "proctrack", s.location,
            f"ProctrackType={value} can miss processes that leave the job's process tree "
            f"(slurm.conf(5)); after a checkpoint-requeue such a process can keep a GPU busy "
            f"while the job restarts elsewhere",
            "ProctrackType=proctrack/cgroup   (with cgroup.conf; restart slurmctld and slurmd)"))
    p = settings.get("PrologFlags")
    flags = {f.lower() for f in _items(p.value)}
    if "x11" in flags and low == "proctrack/linuxproc":
        out.append(_finding(
            Severity.WARNING, "proctrack", p.location,
            "PrologFlags has X11, which slurm.conf(5) says is incompatible with "
            "proctrack/linuxproc", "ProctrackType=proctrack/cgroup, or remove X11"))
    if flags & {"alloc", "contain", "x11", "serial"}:
        out.append(_finding(
            Severity.INFO, "proctrack", p.location,
            f"PrologFlags={p.value}: the prolog runs at each allocation, so again at every "
            f"restart after a checkpoint-requeue; its run time adds to malleable's restart "
            f"cost (policy.default_restart_cost_s until one is measured)", None))
    if p.value:
        shown += f", PrologFlags={p.value}"
    return shown, out


def stepd_socket_path(spool_dir: str, node: str, job_id_digits: int) -> str:
    """The longest socket path slurmstepd creates for a job on ``node``.

    Slurm (src/common/stepd_api.c) names a step's socket
    ``<SlurmdSpoolDir>/<node>_<job id>.<step id>``, with ``%n`` and ``%h`` in the
    spool directory replaced by the node's name (``%h``, its hostname, is taken
    as the node name here). Both ids are written at their widest: ``job_id_digits``
    for the job, 10 for the step (the batch and extern steps' ids).
    """
    directory = spool_dir.replace("%n", node).replace("%h", node).rstrip("/")
    return f"{directory}/{node}_{'9' * job_id_digits}.{'9' * STEP_ID_DIGITS}"


def check_spool_dir(settings: Settings, inventory: Inventory) -> tuple[str, list[Finding]]:
    """slurmstepd's socket paths under ``SlurmdSpoolDir`` must fit in 107 bytes (an error).

    Past that slurmstepd cannot create its socket, and every job that Slurm starts
    on the node fails to launch ("launch failed requeued held"), with no hint of
    why in squeue. Node names come from the inventory; job ids are taken at the
    width of ``MaxJobId``.
    """
    s = settings.get("SlurmdSpoolDir")
    spool = (s.value or DEFAULT_SPOOL_DIR).strip()
    m = settings.get("MaxJobId").value
    digits = len(str(int(m))) if m and m.strip().isdigit() else len(str(DEFAULT_MAX_JOB_ID))
    nodes = [n.name for n in inventory.nodes] or ["localhost"]
    worst = max(nodes, key=lambda n: len(stepd_socket_path(spool, n, digits)))
    path = stepd_socket_path(spool, worst, digits)
    shown = (f"SlurmdSpoolDir={spool} ({s.where if s.value else 'default'}): longest step "
             f"socket {len(path)} bytes (node {worst})")
    if len(path) <= SOCKET_PATH_MAX:
        return shown, []
    room = SOCKET_PATH_MAX - (len(path) - len(spool.replace("%n", worst).replace("%h", worst)))
    return shown, [_finding(
        Severity.ERROR, "spool-dir", s.location,
        f"slurmstepd's socket {path} would be {len(path)} bytes, over Linux's "
        f"{SOCKET_PATH_MAX}: every job Slurm starts on {worst} fails to launch "
        f"(\"launch failed requeued held\")",
        f"SlurmdSpoolDir={DEFAULT_SPOOL_DIR}   (or any directory of at most {room} bytes with "
        f"%n expanded; then restart slurmd)")]


def check_keys(slurm: ParsedConf, gres: ParsedConf | None,
               query: ControllerQuery) -> list[Finding]:
    """Top-level keys that no known Slurm (nor the running controller) accepts."""
    known = set(SLURM_CONF_KEYS)
    if query.config is not None:
        known |= {k.lower() for k in query.config.values if "[" not in k}
    out = []
    for e in slurm.entries:
        if e.key.lower() not in known:
            out.append(_finding(
                Severity.WARNING, "keys", e.location,
                f"{e.key} is not a slurm.conf setting known to malleable (Slurm 22.05's "
                f"slurm.conf(5) and later additions{', or the running controller' if query.config else ''}); "
                f"slurmctld stops at an unrecognized key",
                f"check the spelling of {e.key} against slurm.conf(5) of your Slurm release"))
    if gres is not None:
        for e in gres.entries:
            if e.key.lower() not in GRES_CONF_KEYS:
                out.append(_finding(
                    Severity.WARNING, "keys", e.location,
                    f"{e.key} is not a gres.conf setting; a gres.conf line starts with "
                    f"NodeName=, Name= or AutoDetect=", "check the spelling against gres.conf(5)"))
        for r in gres.records:
            bad = [k for k in r.params if k not in GRES_CONF_PARAMS]
            if bad:
                out.append(_finding(
                    Severity.WARNING, "keys", r.location,
                    f"unknown gres.conf parameter(s): {', '.join(bad)}",
                    "check the spelling against gres.conf(5) (Name, Type, File, Count, Cores, "
                    "Links, Flags, AutoDetect, MultipleFiles)"))
    return out


def _from_file(f: Finding) -> Finding:
    """A finding about the file's value where the running controller uses another one."""
    return Finding(f.severity, f.check, f.location,
                   f"{f.message} [this is the file's value; the running slurmctld still uses "
                   f"another one until `scontrol reconfigure` or a restart]", f.fix)


def _version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def check_glob_includes(confs: Iterable[ParsedConf], query: ControllerQuery) -> list[Finding]:
    """Glob Includes: read here as their matches, but Slurm 22.05 does not expand them.

    Error when the running controller is 22.05 or older, warning when its
    release is unknown, info when it is newer (the release may expand them).
    """
    version = _version(query.config.version if query.config else None)
    out = []
    for conf in confs:
        for loc, pattern, matches in conf.glob_includes:
            seen = ("Slurm 22.05 (tested) does not expand a glob in Include: it looks for a "
                    f"file literally named {pattern}, retries for 60 s and fails")
            fix = ("write one Include line per file: " +
                   "; ".join(f"Include {m}" for m in matches) if matches else
                   "write one Include line per file")
            if version is not None and version <= (22, 5):
                out.append(_finding(Severity.ERROR, "include", loc,
                                    f"{seen}; the running slurmctld is "
                                    f"{query.config.version}", fix))
            elif version is None:
                out.append(_finding(Severity.WARNING, "include", loc,
                                    f"{seen}; if your Slurm release expands globs here, "
                                    f"this is fine (read as {len(matches)} file(s))", fix))
            else:
                out.append(_finding(Severity.INFO, "include", loc,
                                    f"read as {len(matches)} file(s); {seen} (the running "
                                    f"slurmctld is {query.config.version})", None))
    return out


def status_of(findings: Iterable[Finding]) -> str:
    """``ok`` when there are no findings, else the worst severity's name."""
    worst = min((f.severity for f in findings), key=lambda s: s.rank, default=None)
    return STATUS_OK if worst is None else str(worst)


def run_checks(*, slurm: ParsedConf, gres: ParsedConf | None, gres_path: str,
               settings: Settings, inventory: Inventory, inventory_findings: list[Finding],
               controller: ControllerQuery, controller_findings: list[Finding],
               config: Config) -> tuple[list[CheckResult], list[Finding]]:
    """Run every check.

    Args:
        slurm, gres: the parsed files (gres None: no gres.conf exists).
        gres_path: where gres.conf is or would be (for messages and fixes).
        settings: effective settings (file and controller).
        inventory, inventory_findings: from `build_inventory`.
        controller, controller_findings: the query and `settings.compare`'s findings.
        config: malleable's configuration (poll interval, managed partitions).

    Returns:
        ``(checks, findings)``: one `CheckResult` per entry of `CHECKS`, in that
        order, and every finding, worst first, then by file and line. When
        slurm.conf itself cannot be read, only ``files`` runs (the others are
        ``skipped``). When a controller answered, the settings checks judge its
        running values, and the file's values too: a value in the file that
        would fail takes effect at the next reconfigure or restart, so it is
        reported as well (marked as the file's value).
    """
    file_findings = list(slurm.findings) + (list(gres.findings) if gres is not None else [])
    file_findings += check_glob_includes([slurm] + ([gres] if gres is not None else []),
                                         controller)
    files = slurm.files + (gres.files if gres is not None else [])
    results: dict[str, tuple[str, list[Finding]]] = {
        "files": ("read " + ", ".join(files) if files else "nothing read", file_findings),
    }
    if slurm.readable:
        by_id: dict[str, list[Finding]] = {}
        for f in inventory_findings:
            by_id.setdefault(f.check, []).append(f)
        if not controller.queried:
            ctl_summary = "not asked (--no-controller)"
        elif controller.config is None:
            ctl_summary = f"no answer: {controller.error}"
        else:
            c = controller.config
            ctl_summary = (f"slurmctld {c.version or '?'}: {'; '.join(c.status) or 'answered'}"
                           f"; HASH_VAL={c.hash_val or '?'}")
        unknown = check_keys(slurm, gres, controller)
        results["keys"] = (f"{len(unknown)} unknown key(s)" if unknown else "all keys known",
                           unknown)
        results["controller"] = (ctl_summary, controller_findings)
        file_only = Settings(slurm, None)
        pending = settings.controller is not None

        def both(fn, *args) -> tuple[str, list[Finding]]:
            """Check what runs; and, when the file differs, what the file will run."""
            summary, found = fn(settings, *args)
            if pending:
                _, in_file = fn(file_only, *args)
                found = found + [_from_file(f) for f in in_file
                                 if (f.check, f.severity, f.message) not in
                                 {(g.check, g.severity, g.message) for g in found}]
            return summary, found

        results["select-type"] = both(check_select_type)
        results["gres-types"] = both(check_gres_types, inventory)
        s, f = check_gpu_nodes(slurm, inventory)
        results["gpu-nodes"] = (s, f + by_id.get("gpu-nodes", []))
        results["gpu-devices"] = (check_gpu_devices(inventory, gres, gres_path),
                                  by_id.get("gpu-devices", []))
        s, f = check_partitions(inventory, config)
        results["partitions"] = (s, f + by_id.get("partitions", []))
        results["job-requeue"] = both(check_job_requeue)
        results["job-shrink"] = both(check_job_shrink)
        results["min-job-age"] = both(check_min_job_age, config)
        results["proctrack"] = both(check_proctrack)
        results["spool-dir"] = both(check_spool_dir, inventory)
    checks: list[CheckResult] = []
    findings: list[Finding] = []
    for cid, title in CHECKS:
        if cid not in results:
            checks.append(CheckResult(cid, title, STATUS_SKIPPED, "slurm.conf could not be read"))
            continue
        summary, fs = results[cid]
        if cid == "controller" and not controller.queried:
            checks.append(CheckResult(cid, title, STATUS_SKIPPED, summary))
        else:
            checks.append(CheckResult(cid, title, status_of(fs), summary))
        findings.extend(fs)
    findings.sort(key=lambda f: (f.severity.rank, f.location.path, f.location.line or 0))
    return checks, findings

