"""The ``pyslurm`` backend: `SlurmClient` through the pyslurm >= 25.11 API.

pyslurm links libslurm of one Slurm major release, so it is used only when its
version (``pyslurm.__version__``, "SLURM_MAJOR.PATCH", e.g. "25.11.0") matches
slurmctld; `malleable.slurm.connect` checks that and falls back to ``cli``.

API used (pyslurm 25.11 documentation): ``pyslurm.Jobs.load()``,
``pyslurm.Job.load(id)``, ``Job.modify(pyslurm.JobSubmitDescription(...))``,
``Job.hold()``, ``Job.release()``, ``Job.requeue(hold=True)``,
``Job.send_signal(sig, steps="batch"|"children"|"all")``, ``Job.cancel()``,
``JobSubmitDescription(...).submit()``, ``pyslurm.Nodes.load()``, and
``pyslurm.RPCError`` for refusals. Job attributes read: ``id``, ``name``,
``user_id``, ``user_name``, ``account``, ``partition``, ``state``, ``state_reason``,
``priority``, ``allocated_nodes``, ``num_nodes``, ``gres_per_node`` (dict),
``get_resource_layout_per_node()`` (allocated GRES per node), times as epoch
seconds, ``time_limit`` (minutes), ``requeue_count``, ``is_requeueable``,
``is_batch_job``, ``comment``, ``array_id``, ``array_task_id``,
``heterogeneous_id``, ``heterogeneous_offset``.

Limitation: pyslurm exposes the GPU request per node (``gres_per_node``) but not
per job (``--gpus``), so a pending ``--gpus=N`` job reads 0 GPUs here until it
runs (the port itself submits per-node GRES).

Every API call counts as one RPC; refusals raise `SlurmRejected` with Slurm's
message, an unreachable controller `SlurmUnavailable` after retries.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import TypeVar

from malleable.config import SlurmConfig
from malleable.slurm import fields, gres, rules, versions
from malleable.slurm.backend_cli import REQUEUE_SETTLE_S, _invalid_job, most_common_gpus
from malleable.slurm.client import (
    InvalidArgument,
    SlurmError,
    SlurmParseError,
    SlurmRejected,
    SlurmUnavailable,
)
from malleable.slurm.jobid import check_count, check_job_id, check_signal
from malleable.slurm.records import (
    ClusterInfo,
    JobState,
    SignalTarget,
    SlurmJob,
    SlurmNode,
    SubmitRequest,
)
from malleable.slurm.runner import unavailable, with_retries

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_PYSLURM: versions.Version = (25, 11, 0)
_STEPS = {SignalTarget.BATCH: "batch", SignalTarget.STEPS: "children", SignalTarget.FULL: "all"}


def _gpus_in_gres_dict(value: object, path: str) -> int | None:
    """{"gpu": 4}, {"gpu:a100": 2}, {"gres/gpu": 4}, {"gpu": {"count": "4", ...}} -> GPUs."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise fields.fail(path, value, "a GRES dict like {'gpu': 4}")
    total, seen = 0, False
    for key, count in value.items():
        name = str(key).removeprefix("gres/").removeprefix("gres:").split(":")[0]
        if name != "gpu":
            continue
        if isinstance(count, dict):
            count = count.get("count")
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int):
            raise fields.fail(f"{path}[{key!r}]", count, "a GPU count")
        total += count
        seen = True
    return total if seen else None


def _time(value: object, path: str) -> datetime | None:
    if value is None or value == 0:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    raise fields.fail(path, value, "epoch seconds")


def _int(value: object, path: str, default: int | None = None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise fields.fail(path, value, "an integer")
    return value


def job_record(job: object) -> SlurmJob:
    """A pyslurm ``Job`` -> `SlurmJob`, by the same rules as the JSON parser."""
    path = f"pyslurm.Job({getattr(job, 'id', '?')})"
    num = _int(getattr(job, "id", None), f"{path}.id")
    if not num or num <= 0:
        raise fields.fail(f"{path}.id", getattr(job, "id", None), "a positive job id")
    state, flags = fields.job_state(getattr(job, "state", None), f"{path}.state")
    array_job = _int(getattr(job, "array_id", None), f"{path}.array_id") or None
    array_task = _int(getattr(job, "array_task_id", None), f"{path}.array_task_id") \
        if array_job else None
    het_job = _int(getattr(job, "heterogeneous_id", None), f"{path}.heterogeneous_id") or None
    het_offset = _int(getattr(job, "heterogeneous_offset", None), f"{path}.heterogeneous_offset",
                      0) if het_job else None
    nodes = getattr(job, "allocated_nodes", None) or ""
    node_count = _int(getattr(job, "num_nodes", None), f"{path}.num_nodes", 0)
    allocated = bool(nodes) and state != JobState.PENDING
    node_gpus: list[int] = []
    if allocated:
        layout = job.get_resource_layout_per_node() or {}
        for node, res in layout.items():
            per = _gpus_in_gres_dict((res or {}).get("gres"), f"{path}.layout[{node}].gres")
            if per is not None:
                node_gpus.append(per)
    gpus, per_node = gres.job_gpus(
        allocated=allocated, node_count=node_count, node_gpus=node_gpus,
        per_node=_gpus_in_gres_dict(getattr(job, "gres_per_node", None), f"{path}.gres_per_node"))
    reason = getattr(job, "state_reason", None) or ""
    limit = getattr(job, "time_limit", None)
    limit = None if limit is None else timedelta(minutes=_int(limit, f"{path}.time_limit"))
    return SlurmJob(
        job_id=rules.display_job_id(num, array_job, array_task, het_job, het_offset),
        job_id_num=num, name=getattr(job, "name", None) or "",
        user=getattr(job, "user_name", None) or "",
        uid=_int(getattr(job, "user_id", None), f"{path}.user_id"),
        account=getattr(job, "account", None) or "",
        partition=getattr(job, "partition", None) or "",
        state=state, state_flags=flags, reason=reason,
        held=rules.is_held(state, _int(getattr(job, "priority", None), f"{path}.priority"),
                           reason),
        nodes=nodes, node_count=node_count, gpus=gpus, gpus_per_node=per_node,
        submit_time=_time(getattr(job, "submit_time", None), f"{path}.submit_time"),
        eligible_time=_time(getattr(job, "eligible_time", None), f"{path}.eligible_time"),
        start_time=_time(getattr(job, "start_time", None), f"{path}.start_time"),
        end_time=rules.end_time(_time(getattr(job, "end_time", None), f"{path}.end_time"),
                                limit, state),
        time_limit=limit,
        restart_count=_int(getattr(job, "requeue_count", None), f"{path}.requeue_count", 0),
        requeueable=bool(getattr(job, "is_requeueable", False)),
        comment=getattr(job, "comment", None) or "",
        batch=bool(getattr(job, "is_batch_job", True)),
        array_job_id=array_job, array_task_id=array_task,
        het_job_id=het_job, het_job_offset=het_offset,
    )


def node_record(node: object) -> SlurmNode:
    """A pyslurm ``Node`` -> `SlurmNode` (state "MIXED+DRAIN" -> "mixed", {"DRAIN"})."""
    path = f"pyslurm.Node({getattr(node, 'name', '?')})"
    name = getattr(node, "name", None)
    if not isinstance(name, str) or not name:
        raise fields.fail(f"{path}.name", name, "a node name")
    state = getattr(node, "state", None)
    if not isinstance(state, str) or not state:
        raise fields.fail(f"{path}.state", state, "a node state")
    base, *more = state.split("+")
    return SlurmNode(
        name=name, state=base.lower(), state_flags=frozenset(m.upper() for m in more),
        partitions=tuple(getattr(node, "partitions", None) or ()),
        gpus=_gpus_in_gres_dict(getattr(node, "configured_gres", None),
                                f"{path}.configured_gres") or 0,
        gpus_allocated=_gpus_in_gres_dict(getattr(node, "allocated_gres", None),
                                          f"{path}.allocated_gres") or 0)


class PyslurmSlurmClient:
    """`SlurmClient` over pyslurm >= 25.11.

    Args:
        config: retries (``max_retries``); pyslurm has its own RPC timeouts.
        module: the pyslurm module (default: ``import pyslurm``); tests pass a fake.
        controller_version: slurmctld's release ("25.11.0"), as `connect` read it.
        backoff_s, sleep: the retry schedule.

    Raises `SlurmError` at construction when pyslurm is older than 25.11.
    """

    def __init__(self, config: SlurmConfig | None = None, *, module: ModuleType | None = None,
                 controller_version: str = "", backoff_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep):
        config = config or SlurmConfig()
        self.ps = module or importlib.import_module("pyslurm")
        self.pyslurm_version = versions.parse_version(str(getattr(self.ps, "__version__", "")))
        if self.pyslurm_version < MIN_PYSLURM:
            raise SlurmError(f"pyslurm {self.ps.__version__} is older than 25.11; "
                             "use the cli backend")
        self._controller = (versions.parse_version(controller_version) if controller_version
                            else self.pyslurm_version)
        self.max_retries = config.max_retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.rpc_count = 0
        self.parse_errors: list[SlurmParseError] = []
        self._requeued_at: dict[str, float] = {}

    def _rpc(self, what: str, fn: Callable[[], T], *, idempotent: bool = True,
             job_id: str | None = None) -> T:
        def attempt() -> T:
            self.rpc_count += 1
            try:
                return fn()
            except self.ps.RPCError as exc:
                msg = str(getattr(exc, "msg", "") or exc)
                if unavailable(msg):
                    raise SlurmUnavailable(f"{what}: {msg}") from None
                raise SlurmRejected(f"{what}: {msg}", job_id=job_id, slurm_message=msg) from None
        return with_retries(attempt, max_retries=self.max_retries, backoff_s=self.backoff_s,
                            sleep=self.sleep, idempotent=idempotent, what=what)

    def _target(self, job_id: str):
        """The pyslurm Job object for an id; array tasks and het components are
        resolved to their own numeric id through one load."""
        if job_id.isdigit():
            return self.ps.Job(int(job_id))
        rec = self.job(job_id)
        if rec is None:
            raise SlurmRejected(f"job {job_id}: Invalid job id specified", job_id=job_id,
                                slurm_message="Invalid job id specified")
        return self.ps.Job(rec.job_id_num)

    # ------------------------------------------------------------------ reads

    def jobs(self) -> list[SlurmJob]:
        """Every job, from one ``Jobs.load()``; unparseable jobs go to ``parse_errors``."""
        loaded = self._rpc("Jobs.load", self.ps.Jobs.load)
        out, problems = [], []
        for job in loaded.values():
            try:
                out.append(job_record(job))
            except SlurmParseError as exc:
                problems.append(exc)
                log.warning("skipped a job pyslurm reported: %s", exc)
        self.parse_errors = problems
        return out

    def job(self, job_id: str) -> SlurmJob | None:
        """One job (``Job.load``), or None for "Invalid job id specified"."""
        job_id = check_job_id(job_id)
        num = job_id.split("_")[0].split("+")[0]
        if num != job_id:  # array task / het component: find it among all jobs
            for rec in self.jobs():
                if rec.job_id == job_id:
                    return rec
            return None
        try:
            return job_record(self._rpc("Job.load", lambda: self.ps.Job.load(int(num)),
                                        job_id=job_id))
        except SlurmRejected as exc:
            if _invalid_job(exc.slurm_message):
                return None
            raise

    def nodes(self) -> list[SlurmNode]:
        """Every node, from one ``Nodes.load()``."""
        loaded = self._rpc("Nodes.load", self.ps.Nodes.load)
        return [node_record(n) for n in loaded.values()]

    def cluster(self) -> ClusterInfo:
        """Version, GPUs per node, partitions (from the nodes; the default partition is
        the first, as pyslurm's node records do not flag it)."""
        nodes = self.nodes()
        parts: list[str] = []
        for n in nodes:
            parts += [p for p in n.partitions if p not in parts]
        return ClusterInfo(version=versions.version_string(self._controller),
                           version_tuple=self._controller,
                           gpus_per_node=most_common_gpus(nodes), partitions=tuple(parts),
                           default_partition=parts[0] if parts else "", nodes=len(nodes))

    # ------------------------------------------------------------------ changes

    def submit(self, request: SubmitRequest) -> str:
        """``JobSubmitDescription(...).submit()``; returns the job id (not retried after a
        timeout)."""
        nodes = check_count("nodes", request.nodes)
        gpus = check_count("gpus_per_node", request.gpus_per_node, minimum=0)
        desc = dict(script=request.script, nodes=nodes, is_requeueable=request.requeue,
                    comment=request.comment or None, name=request.name or None,
                    partitions=request.partition or None,
                    standard_output=request.output or None,
                    working_directory=request.workdir or None,
                    log_files_open_mode="append" if request.open_mode_append else None,
                    environment=dict(request.env) or None)
        if gpus:
            desc["gres_per_node"] = f"gpu:{gpus}"
        if request.hold:
            desc["priority"] = 0
        if request.extra_args:
            raise InvalidArgument("extra_args (sbatch options) are not supported by the "
                                  "pyslurm backend")
        sub = self.ps.JobSubmitDescription(**{k: v for k, v in desc.items() if v is not None})
        return check_job_id(self._rpc("JobSubmitDescription.submit", sub.submit,
                                      idempotent=False))

    def _modify(self, job_id: str, what: str, **changes) -> None:
        target = self._target(job_id)
        desc = self.ps.JobSubmitDescription(**changes)
        self._rpc(what, lambda: target.modify(desc), job_id=job_id)

    def resize_pending(self, job_id: str, nodes: int, gpus_per_node: int) -> None:
        """``Job.modify(JobSubmitDescription(nodes="n-n", gres_per_node="gpu:g"))``."""
        job_id = check_job_id(job_id)
        nodes = check_count("nodes", nodes)
        gpus = check_count("gpus_per_node", gpus_per_node, minimum=0)
        self._modify(job_id, "Job.modify", nodes=f"{nodes}-{nodes}", gres_per_node=f"gpu:{gpus}")

    def shrink_running(self, job_id: str, nodes: int) -> None:
        """``Job.modify(JobSubmitDescription(nodes=n))`` on a running job."""
        job_id = check_job_id(job_id)
        self._modify(job_id, "Job.modify", nodes=check_count("nodes", nodes))

    def hold(self, job_id: str) -> None:
        """``Job.hold()``."""
        job_id = check_job_id(job_id)
        target = self._target(job_id)
        self._rpc("Job.hold", target.hold, job_id=job_id)

    def release(self, job_id: str) -> None:
        """``Job.release()``."""
        job_id = check_job_id(job_id)
        target = self._target(job_id)
        self._rpc("Job.release", target.release, job_id=job_id)

    def requeue_hold(self, job_id: str) -> None:
        """``Job.requeue(hold=True)``; refused for a job that is not requeueable."""
        job_id = check_job_id(job_id)
        target = self._target(job_id)
        self._rpc("Job.requeue", lambda: target.requeue(hold=True), idempotent=False,
                  job_id=job_id)
        self._requeued_at[job_id] = time.monotonic()

    def start_now(self, job_id: str) -> None:
        """``Job.modify(JobSubmitDescription(begin_time="now"))``, after waiting out the
        rest of `REQUEUE_SETTLE_S` since this client's own requeue, as in the cli backend."""
        job_id = check_job_id(job_id)
        since = time.monotonic() - self._requeued_at.pop(job_id, -math.inf)
        if since < REQUEUE_SETTLE_S:
            self.sleep(REQUEUE_SETTLE_S - since)
        self._modify(job_id, "Job.modify", begin_time="now")

    def signal(self, job_id: str, signal: str, target: SignalTarget = SignalTarget.BATCH) -> None:
        """``Job.send_signal(sig, steps=batch|children|all)``."""
        job_id = check_job_id(job_id)
        sig = check_signal(signal)
        try:
            steps = _STEPS[SignalTarget(target)]
        except ValueError:
            raise InvalidArgument(f"invalid signal target {target!r}") from None
        job = self._target(job_id)
        self._rpc("Job.send_signal", lambda: job.send_signal(sig, steps=steps),
                  idempotent=False, job_id=job_id)

    def cancel(self, job_id: str) -> None:
        """``Job.cancel()``."""
        job_id = check_job_id(job_id)
        target = self._target(job_id)
        self._rpc("Job.cancel", target.cancel, job_id=job_id)
