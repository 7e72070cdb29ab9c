"""`SimSlurm`: a simulated Slurm controller implementing the `SlurmClient` protocol.

It runs on the discrete-event engine's virtual clock (`malleable.sim.engine`):
nothing happens between engine events, and every method acts at ``engine.now``.
Time advances only when the caller runs the engine (``engine.run(until)``).

What is modelled (each checked against Slurm 22.05.8 on the project's harness,
the messages are Slurm's own words):

* A cluster of ``nodes`` x ``gpus_per_node`` GPUs in one partition; a job asks for
  ``nodes`` x ``gpus_per_node`` GPUs (Slurm's ``--nodes`` and ``TresPerNode``).
* A scheduler pass after every change (at the same instant, after the change's
  other effects): pending jobs in priority order (FIFO by submit time, then id;
  Slurm resets the submit time of a requeued job) are started when ``nodes``
  distinct nodes each have ``gpus_per_node`` free GPUs (first fit in node order,
  or best fit for one-node jobs). With ``backfill`` (Slurm's default
  sched/backfill) a job further down may start when the first blocked one cannot;
  the simulator has no time limits, so no reservation for the blocked job can be
  computed and backfill is greedy. Without it, the pass stops at the first job
  that does not fit. Pending reasons: None (not yet considered), Priority,
  Resources, BeginTime, JobHeldAdmin, job_requeued_in_held_state,
  PartitionNodeLimit / PartitionConfig (more nodes than the partition has).
* ``requeue_hold``: the job's program is killed, its nodes freed, it returns to
  PENDING held with ``RestartCnt + 1``, its submit time reset, and a begin time
  ``requeue_delay_s`` later (121 s measured on 22.05); ``start_now`` clears it.
  A job that is not requeueable is refused ("Requested operation is presently
  disabled"), as is a pending one ("Job is pending execution").
* ``shrink_running``: the job keeps its first ``n`` nodes; the program is told.
  Growing is refused ("Requested operation not supported on this system"); on
  22.05 a second shrink of the same run is refused ("Job update not available
  right now, the DB index is being set, try again in a bit", configurable with
  ``second_shrink_fails``, fixed in 23.11.5). As on 22.05, a shrink changes the
  node count Slurm reports but not the request a requeued job restarts with;
  ``resize_pending`` sets both.
* ``resize_pending`` on a running job: "Job is no longer pending execution";
  ``NumNodes`` below 1: "Node count specification invalid"; more nodes than the
  partition: accepted, the job then pends with reason PartitionNodeLimit.
  Deviation: more GPUs per node than a node has is refused here with sbatch's
  "Requested node configuration is not available" (the harness accepted the
  update, an artefact of its file-backed GPUs).
* ``hold`` of a running job sets priority 0 and the reason but does not stop it;
  ``signal`` on a pending job: "Job can not be altered now, try again later";
  finished jobs stay visible for ``min_job_age_s`` (Slurm's MinJobAge, 300 s).
* Not modelled: the COMPLETING state after a requeue or end (a second on the
  harness), time limits, reservations, partitions beyond one, node failures.

Attaching a simulated job: a submitted script cannot run in a simulation, so
each job is driven by a program object implementing `SimProgram` (on_start,
on_signal, on_shrink, on_kill). Use ``submit_sim(request, program)``; it returns
the job id and counts as one RPC like ``submit``. Plain ``submit(request)`` (the
protocol method) asks the ``job_factory`` given to the constructor for a program,
and without one attaches an `IdleProgram` that holds its allocation until
cancelled, like a script that never ends. The program persists across requeues
(it stands for the job's code and its checkpoint); each start hands it a fresh
`Run` whose ``exit()`` ends the job. A stale run (killed by a requeue) cannot end
the job.
"""

from __future__ import annotations

import collections
import heapq
import math
import os
import pwd
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from malleable.sim.engine import PRIORITY_LATE, Engine
from malleable.slurm.client import InvalidJobId, SlurmRejected
from malleable.slurm.hostlist import compress_hostlist
from malleable.slurm.records import (
    ClusterInfo,
    JobState,
    SignalTarget,
    SlurmJob,
    SlurmNode,
    SubmitRequest,
)

_JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+|\+[0-9]+)?$")

# Slurm's own messages (22.05.8, seen on the harness; see the module docstring).
MSG_INVALID_ID = "Invalid job id specified"
MSG_NOT_PENDING = "Job is no longer pending execution"
MSG_PENDING = "Job is pending execution"
MSG_NODE_COUNT = "Node count specification invalid"
MSG_NOT_SUPPORTED = "Requested operation not supported on this system"
MSG_DISABLED = "Requested operation is presently disabled"
MSG_FINISHED = "Job has already finished"
MSG_CANNOT_ALTER = "Job can not be altered now, try again later"
MSG_COMPLETED = "Job/step already completing or completed"
MSG_NODE_CONFIG = "Requested node configuration is not available"
MSG_SECOND_SHRINK = "Job update not available right now, the DB index is being set, try again in a bit"

REASON_REQUEUE_HELD = "job_requeued_in_held_state"


def _user_name(uid: int) -> str:
    """The login name of ``uid`` (its number as text if it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


REASON_HELD = "JobHeldAdmin"


# ----------------------------------------------------------------------------- the program side


class Run:
    """One start of a job: what its program gets in `SimProgram.on_start`.

    Attributes:
        job_id: the Slurm job id ("17").
        placement: GPUs per allocated node, e.g. (4, 4); updated by a shrink.
        node_names: the allocated node names, same order.
        restart_count: Slurm's RestartCnt (0 on the first run).
        engine: the simulation's engine (for scheduling the program's events).
        started: virtual time (s) of this start.
    """

    __slots__ = ("job_id", "placement", "node_names", "restart_count", "engine", "started",
                 "_slurm", "_alive")

    def __init__(self, slurm: SimSlurm, job_id: str, placement: tuple[int, ...],
                 node_names: tuple[str, ...], restart_count: int):
        self._slurm = slurm
        self._alive = True
        self.job_id = job_id
        self.placement = placement
        self.node_names = node_names
        self.restart_count = restart_count
        self.engine = slurm.engine
        self.started = slurm.engine.now

    @property
    def gpus(self) -> int:
        """GPUs of this run now."""
        return sum(self.placement)

    @property
    def nodes(self) -> int:
        """Nodes of this run now."""
        return len(self.placement)

    @property
    def alive(self) -> bool:
        """False once the run ended (exit, requeue or cancel)."""
        return self._alive

    def exit(self, state: JobState = JobState.COMPLETED) -> None:
        """The job's script ends now with ``state`` (COMPLETED or FAILED); ignored if stale."""
        if self._alive:
            self._slurm._program_exit(self, state)


class SimProgram(Protocol):
    """What SimSlurm drives: the simulated stand-in for a job's batch script."""

    def on_start(self, run: Run) -> None:
        """The job starts (again, after a requeue) on ``run.placement``."""

    def on_signal(self, signal: str, target: SignalTarget) -> None:
        """``scancel --signal`` reached the running job."""

    def on_shrink(self, placement: tuple[int, ...]) -> None:
        """Slurm took nodes away in place; ``placement`` is what is left."""

    def on_kill(self, reason: str) -> None:
        """The job's processes are killed ("requeued" or "cancelled"); no more events."""


class IdleProgram:
    """A program that holds its allocation until cancelled (a script that never ends)."""

    def on_start(self, run: Run) -> None:
        """Nothing to do."""

    def on_signal(self, signal: str, target: SignalTarget) -> None:
        """Signals are ignored."""

    def on_shrink(self, placement: tuple[int, ...]) -> None:
        """Nothing to do."""

    def on_kill(self, reason: str) -> None:
        """Nothing to do."""


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class JobAccount:
    """Accounting of one job over its whole life (what ``sacct`` would add up).

    Attributes:
        job_id, name, comment: as submitted.
        submitted: virtual time (s) of the first submission (not reset by requeues).
        started: virtual time of the first start, None if it never started.
        ended: virtual time it finished, None while active.
        state: current state.
        restarts: RestartCnt.
        gpu_seconds: GPU-seconds allocated over all runs.
        max_gpus: the most GPUs it held at once.
    """

    job_id: str
    name: str
    comment: str
    submitted: float
    started: float | None
    ended: float | None
    state: JobState
    restarts: int
    gpu_seconds: float
    max_gpus: int


class _Job:
    __slots__ = ("id", "name", "comment", "partition", "requeueable", "req_nodes", "req_gpn",
                 "shown_nodes", "state", "held", "hold_reason", "reason", "submit_time",
                 "first_submit", "begin_time", "start_time", "first_start", "end_time",
                 "restart_count", "alloc", "shrinks", "program", "run", "gpu_seconds",
                 "alloc_since", "max_gpus", "partition_reason", "queued", "ready_pass",
                 "alloc_ver", "cached", "requeued_at")

    def __init__(self, jid: int, request: SubmitRequest, program: SimProgram, now: float,
                 partition: str):
        self.id = jid
        self.name = request.name or os.path.basename(request.script) or "sbatch"
        self.comment = request.comment
        self.partition = request.partition or partition
        self.requeueable = bool(request.requeue)
        self.req_nodes = request.nodes
        self.req_gpn = request.gpus_per_node
        self.shown_nodes = request.nodes
        self.state = JobState.PENDING
        self.held = False
        self.hold_reason = ""
        self.reason = "None"
        self.submit_time = now
        self.first_submit = now
        self.begin_time = now
        self.requeued_at = -math.inf
        self.start_time: float | None = None
        self.first_start: float | None = None
        self.end_time: float | None = None
        self.restart_count = 0
        self.alloc: list[tuple[int, int]] = []   # (node index, GPUs)
        self.shrinks = 0
        self.program = program
        self.run: Run | None = None
        self.gpu_seconds = 0.0
        self.alloc_since = now
        self.max_gpus = 0
        self.partition_reason = "PartitionConfig"
        self.queued: tuple[int, int, float] | None = None   # (nodes, gpn, submit) last queued
        self.ready_pass = 0
        self.alloc_ver = 0          # bumped whenever ``alloc`` changes
        self.cached: tuple[tuple, SlurmJob] | None = None   # (signature, record)

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.alloc)


# ----------------------------------------------------------------------------- the controller


class SimSlurm:
    """A simulated Slurm controller (see the module docstring for what is modelled).

    Args:
        engine: the simulation's engine; all times are its virtual times.
        nodes: number of nodes N (named node1..nodeN); gpus_per_node: g.
        requeue_delay_s: begin-time delay Slurm sets on a requeued job (121 s on 22.05).
        min_job_age_s: how long a finished job stays visible (MinJobAge).
        backfill: let later jobs start when the first blocked one cannot (greedy).
        requeue_latency_s: a requeued job cannot start sooner than this after its
            requeue, even when its begin time is cleared (what a real controller
            and the daemon's RPCs add to a checkpoint-requeue; default 0).
        backfill_interval_s: 0 (default): backfill in every scheduler pass; > 0: as
            Slurm's sched/backfill with ``bf_interval``, the passes after a change
            stop at the first blocked job (Slurm's main scheduler) and a greedy
            backfill pass runs every ``backfill_interval_s`` seconds of virtual time
            (Slurm's default 30) while a job is blocked.
        placement: "first_fit" (node order) or "best_fit" (one-node jobs go to
            the fullest node that fits).
        second_shrink_fails: refuse a second shrink of the same run (22.05 bug).
        sched_delay_s: seconds from a change to the scheduler pass (0 = same instant).
        version: the Slurm release to report.
        partition: the partition's name.
        first_job_id: the first id handed out.
        job_factory: builds the program for a plain `submit` (default: `IdleProgram`).
        uid, user: the owner every job reports (default: this process's user, so
            that the daemon's spool reader, which accepts only files owned by
            the job's user, reads the progress files the simulated jobs write).

    Attributes:
        rpc_count: protocol calls so far (each is one RPC, as for a real backend).
        allocation_log: ``(virtual s, job id, GPUs held from then on)`` at every
            change of a job's allocation (for plots and audits).

    Cost: a scheduler pass tries only the highest-priority pending job of each
    request shape ((nodes, GPUs per node)), since a shape that does not fit
    cannot fit later in the same pass; held jobs and jobs waiting for their
    begin time are kept out of the queues. ``jobs()`` reuses a job's record
    while nothing it reports has changed.

    Raises:
        ValueError: a bad size or option (names the argument).
    """

    def __init__(self, engine: Engine, nodes: int = 16, gpus_per_node: int = 4, *,
                 requeue_delay_s: float = 121.0, min_job_age_s: float = 300.0,
                 requeue_latency_s: float = 0.0,
                 backfill: bool = True, backfill_interval_s: float = 0.0,
                 placement: str = "first_fit", second_shrink_fails: bool = True, sched_delay_s: float = 0.0,
                 version: str = "22.05.8", partition: str = "gpu", first_job_id: int = 1,
                 job_factory: Callable[[SubmitRequest], SimProgram] | None = None,
                 uid: int | None = None, user: str | None = None):
        for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node),
                        ("first_job_id", first_job_id)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, f in (("requeue_delay_s", requeue_delay_s), ("min_job_age_s", min_job_age_s),
                        ("sched_delay_s", sched_delay_s),
                        ("backfill_interval_s", backfill_interval_s),
                        ("requeue_latency_s", requeue_latency_s)):
            if not (isinstance(f, (int, float)) and f >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {f!r}")
        if placement not in ("first_fit", "best_fit"):
            raise ValueError(f"placement must be 'first_fit' or 'best_fit', got {placement!r}")
        parts = version.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"version must look like 22.05.8, got {version!r}")
        self.engine = engine
        self.num_nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.requeue_delay_s = float(requeue_delay_s)
        self.min_job_age_s = float(min_job_age_s)
        self.backfill = backfill
        self.backfill_interval_s = float(backfill_interval_s)
        self.requeue_latency_s = float(requeue_latency_s)
        self._backfilling = False            # inside a periodic backfill pass
        self._backfill_at: float | None = None
        self.best_fit = placement == "best_fit"
        self.second_shrink_fails = second_shrink_fails
        self.sched_delay_s = float(sched_delay_s)
        self.version = version
        self.partition = partition
        self.job_factory = job_factory
        self.uid = os.getuid() if uid is None else int(uid)
        self.user = user if user is not None else _user_name(self.uid)
        self.rpc_count = 0
        self.node_names = tuple(f"node{i + 1}" for i in range(nodes))
        self._free = [gpus_per_node] * nodes
        self._next_id = first_job_id
        self._jobs: dict[int, _Job] = {}          # every job ever (accounting)
        self._visible: dict[int, _Job] = {}       # what the controller still reports
        self._active: dict[int, _Job] = {}        # pending or running
        self._pass_pending = False
        self._passes = 0
        self._wakeup_at: float | None = None
        # Pending, unheld, eligible jobs by shape (nodes, GPUs per node): heaps of
        # (submit time, id), lazily cleaned; pending jobs waiting for a begin time.
        self._ready: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self._waiting: list[tuple[float, int]] = []
        self._ended: collections.deque[tuple[float, int]] = collections.deque()
        self._used = 0
        self._timeline_t: list[float] = [0.0]
        self._timeline_used: list[int] = [0]
        self.allocation_log: list[tuple[float, str, int]] = []

    # ------------------------------------------------------------------ protocol: reads

    def jobs(self) -> list[SlurmJob]:
        """Every job the controller knows now (one RPC), in id order."""
        self.rpc_count += 1
        self._purge()
        return [self._record(j) for j in self._visible.values()]

    def unchanged_since(self, records: Sequence[SlurmJob]) -> bool:
        """Whether a poll now (`jobs`) would return exactly ``records``: the same
        record objects in the same order (a record is rebuilt whenever anything it
        shows changes). Not an RPC: the simulator's own view, for skipping cycles."""
        self._purge()
        if len(records) != len(self._visible):
            return False
        return all(self._record(j) is r for j, r in zip(self._visible.values(), records,
                                                         strict=True))

    def job(self, job_id: str) -> SlurmJob | None:
        """One job, or None if unknown (or forgotten after MinJobAge). Raises InvalidJobId."""
        self.rpc_count += 1
        jid = self._parse_id(job_id)
        self._purge()
        j = self._visible.get(jid)
        return self._record(j) if j is not None else None

    def nodes(self) -> list[SlurmNode]:
        """Every node with its GPU allocation (one RPC)."""
        self.rpc_count += 1
        g = self.gpus_per_node
        out = []
        for name, free in zip(self.node_names, self._free, strict=True):
            used = g - free
            state = "idle" if used == 0 else "allocated" if free == 0 else "mixed"
            out.append(SlurmNode(name=name, state=state, partitions=(self.partition,),
                                 gpus=g, gpus_allocated=used))
        return out

    def cluster(self) -> ClusterInfo:
        """Version, GPUs per node, the partition (one RPC)."""
        self.rpc_count += 1
        major, minor, micro = (int(p) for p in self.version.split("."))
        return ClusterInfo(version=self.version, version_tuple=(major, minor, micro),
                           gpus_per_node=self.gpus_per_node, partitions=(self.partition,),
                           default_partition=self.partition, nodes=self.num_nodes)

    # ------------------------------------------------------------------ protocol: changes

    def submit(self, request: SubmitRequest) -> str:
        """Submit a batch job driven by ``job_factory(request)`` (default `IdleProgram`)."""
        program = self.job_factory(request) if self.job_factory is not None else IdleProgram()
        return self.submit_sim(request, program)

    def submit_sim(self, request: SubmitRequest, program: SimProgram) -> str:
        """Submit a batch job driven by ``program``; returns its id (one RPC).

        Raises:
            SlurmRejected: nodes < 1 ("Node count specification invalid"), or more
                GPUs per node than a node has ("Requested node configuration is
                not available").
        """
        self.rpc_count += 1
        if not isinstance(request.nodes, int) or request.nodes < 1:
            raise SlurmRejected(f"sbatch: {MSG_NODE_COUNT} (nodes={request.nodes!r})",
                                slurm_message=MSG_NODE_COUNT)
        if not isinstance(request.gpus_per_node, int) or \
                not 0 <= request.gpus_per_node <= self.gpus_per_node:
            raise SlurmRejected(f"sbatch: Batch job submission failed: {MSG_NODE_CONFIG} "
                                f"(gpus_per_node={request.gpus_per_node!r})",
                                slurm_message=MSG_NODE_CONFIG)
        jid = self._next_id
        self._next_id += 1
        job = _Job(jid, request, program, self.engine.now, self.partition)
        self._jobs[jid] = self._visible[jid] = self._active[jid] = job
        self._changed(job)
        return str(jid)

    def resize_pending(self, job_id: str, nodes: int, gpus_per_node: int) -> None:
        """Set a pending job's request to ``nodes`` x ``gpus_per_node`` (one RPC).

        Raises:
            SlurmRejected: unknown id, not pending, nodes < 1, or more GPUs per node
                than a node has.
        """
        job = self._get(job_id)
        if job.state != JobState.PENDING:
            self._reject(job, MSG_NOT_PENDING)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            self._reject(job, MSG_NODE_COUNT, f"NumNodes={nodes!r}")
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or \
                not 0 <= gpus_per_node <= self.gpus_per_node:
            self._reject(job, MSG_NODE_CONFIG, f"TresPerNode=gres/gpu:{gpus_per_node!r}")
        job.req_nodes = job.shown_nodes = nodes
        job.req_gpn = gpus_per_node
        job.partition_reason = "PartitionNodeLimit"
        self._changed(job)

    def shrink_running(self, job_id: str, nodes: int) -> None:
        """Keep the first ``nodes`` nodes of a running job, release the rest (one RPC).

        Raises:
            SlurmRejected: unknown id, not running, nodes < 1, more nodes than it has,
                or a second shrink of the same run when ``second_shrink_fails``.
        """
        job = self._get(job_id)
        if job.state == JobState.PENDING:
            self._reject(job, MSG_PENDING)
        if job.state != JobState.RUNNING:
            self._reject(job, MSG_FINISHED)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            self._reject(job, MSG_NODE_COUNT, f"NumNodes={nodes!r}")
        if nodes > len(job.alloc):
            self._reject(job, MSG_NOT_SUPPORTED, f"NumNodes={nodes} > {len(job.alloc)}")
        if nodes == len(job.alloc):
            return
        if job.shrinks >= 1 and self.second_shrink_fails:
            self._reject(job, MSG_SECOND_SHRINK)
        self._account(job)
        for idx, g in job.alloc[nodes:]:
            self._free[idx] += g
        job.alloc = job.alloc[:nodes]
        job.alloc_ver += 1
        job.shown_nodes = nodes
        job.shrinks += 1
        self._note_usage()
        self._log_alloc(job)
        run = job.run
        if run is not None:
            run.placement = tuple(g for _, g in job.alloc)
            run.node_names = tuple(self.node_names[i] for i, _ in job.alloc)
            job.program.on_shrink(run.placement)
        self._request_pass()

    def hold(self, job_id: str) -> None:
        """Hold a job (priority 0): a pending one will not start; a running one keeps running."""
        job = self._get(job_id)
        if job.state.finished:
            self._reject(job, MSG_FINISHED)
        job.held = True
        job.hold_reason = REASON_HELD
        self._changed(job)

    def release(self, job_id: str) -> None:
        """Release a held job (no-op if not held); it may still wait for its begin time."""
        job = self._get(job_id)
        if job.state.finished:
            self._reject(job, MSG_FINISHED)
        job.held = False
        job.hold_reason = ""
        self._changed(job)

    def requeue_hold(self, job_id: str) -> None:
        """Requeue a running job and hold it: its program is killed, its nodes freed,
        RestartCnt + 1, submit time reset, begin time ``requeue_delay_s`` from now.

        Raises:
            SlurmRejected: unknown id, pending ("Job is pending execution"), or not
                requeueable ("Requested operation is presently disabled").
        """
        job = self._get(job_id)
        if job.state == JobState.PENDING:
            self._reject(job, MSG_PENDING)
        if not job.requeueable:
            self._reject(job, MSG_DISABLED)
        now = self.engine.now
        if job.state == JobState.RUNNING:
            self._stop(job, "requeued")
        else:  # a finished job may be requeued while the controller still knows it
            self._active[job.id] = job
            job.end_time = None
        job.state = JobState.PENDING
        job.held = True
        job.hold_reason = REASON_REQUEUE_HELD
        job.restart_count += 1
        job.submit_time = now
        job.begin_time = now + self.requeue_delay_s
        job.requeued_at = now
        job.start_time = None
        self._changed(job)

    def start_now(self, job_id: str) -> None:
        """Clear a pending job's begin-time delay (``StartTime=now``)."""
        job = self._get(job_id)
        if job.state != JobState.PENDING:
            self._reject(job, MSG_NOT_PENDING)
        job.begin_time = min(job.begin_time,
                             max(self.engine.now, job.requeued_at + self.requeue_latency_s))
        self._changed(job)

    def signal(self, job_id: str, signal: str, target: SignalTarget = SignalTarget.BATCH) -> None:
        """Deliver ``signal`` to the running job's program (``scancel --signal``).

        Raises:
            SlurmRejected: unknown id, pending ("Job can not be altered now, try
                again later"), finished ("Job/step already completing or completed").
            ValueError: an empty signal name.
        """
        job = self._get(job_id)
        if not isinstance(signal, str) or not signal.strip():
            raise ValueError(f"signal must be a signal name such as 'USR1', got {signal!r}")
        if job.state == JobState.PENDING:
            self._reject(job, MSG_CANNOT_ALTER)
        if job.state != JobState.RUNNING:
            self._reject(job, MSG_COMPLETED)
        name = signal.strip().upper()
        name = name[3:] if name.startswith("SIG") else name
        job.program.on_signal(name, SignalTarget(target))

    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job (no-op for a finished one)."""
        job = self._get(job_id)
        if job.state.finished:
            return
        if job.state == JobState.RUNNING:
            self._stop(job, "cancelled")
        self._finish(job, JobState.CANCELLED)

    # ------------------------------------------------------------------ simulation helpers

    def accounting(self) -> list[JobAccount]:
        """Every job ever submitted, with its whole-life accounting (not an RPC)."""
        now = self.engine.now
        out = []
        for j in self._jobs.values():
            gs = j.gpu_seconds + (j.gpus * (now - j.alloc_since) if j.alloc else 0.0)
            out.append(JobAccount(job_id=str(j.id), name=j.name, comment=j.comment,
                                  submitted=j.first_submit, started=j.first_start,
                                  ended=j.end_time, state=j.state, restarts=j.restart_count,
                                  gpu_seconds=gs, max_gpus=j.max_gpus))
        return out

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return self.num_nodes * self.gpus_per_node

    def gpu_timeline(self) -> tuple[np.ndarray, np.ndarray]:
        """``(times, used)``: allocated GPUs in total from each time (s) on, (T,) arrays."""
        return np.array(self._timeline_t), np.array(self._timeline_used, dtype=np.int64)

    @property
    def known_jobs(self) -> int:
        """Jobs a poll would report now (active, and ended ones until MinJobAge). Not an
        RPC: the simulator's own view, for skipping cycles."""
        self._purge()
        return len(self._visible)

    @property
    def active_jobs(self) -> int:
        """Pending plus running jobs."""
        return len(self._active)

    @property
    def ended_jobs(self) -> int:
        """Jobs submitted so far that have ended (any final state), in O(1).

        Every submitted job is either active (pending or running) or has ended,
        and a requeued finished job is active again, so this is the count of
        `accounting` entries with an end time."""
        return len(self._jobs) - len(self._active)

    @property
    def used_gpus(self) -> int:
        """GPUs allocated now."""
        return self._used

    # ------------------------------------------------------------------ internals

    def _parse_id(self, job_id: str) -> int:
        if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            raise InvalidJobId(f"invalid job id {job_id!r} (expected 123, 123_4 or 123+0)")
        try:
            return int(job_id)
        except ValueError:
            return -1  # array task or het component: this controller has none

    def _get(self, job_id: str) -> _Job:
        self.rpc_count += 1
        jid = self._parse_id(job_id)
        self._purge()
        job = self._visible.get(jid)
        if job is None:
            raise SlurmRejected(f"{MSG_INVALID_ID} for job {job_id}", job_id=job_id,
                                slurm_message=MSG_INVALID_ID)
        return job

    @staticmethod
    def _reject(job: _Job, message: str, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        raise SlurmRejected(f"{message} for job {job.id}{extra}", job_id=str(job.id),
                            slurm_message=message)

    def _purge(self) -> None:
        """Forget jobs that ended ``min_job_age_s`` ago (ends are queued in time order)."""
        cutoff = self.engine.now - self.min_job_age_s
        ended = self._ended
        while ended and ended[0][0] <= cutoff:
            t, jid = ended.popleft()
            job = self._visible.get(jid)
            if job is not None and job.end_time == t:
                del self._visible[jid]

    def _record(self, j: _Job) -> SlurmJob:
        """The job's record; reused while nothing it shows has changed (records are
        immutable), so a poll of many idle pending jobs costs little."""
        running = j.state == JobState.RUNNING
        if running:
            reason = j.hold_reason if j.held else "None"
        elif j.state == JobState.PENDING:
            reason = self._pending_reason(j)
        else:
            reason = j.reason
        sig = (j.state, j.held, reason, j.alloc_ver, j.shown_nodes, j.req_nodes, j.req_gpn,
               j.submit_time, j.begin_time, j.start_time, j.end_time, j.restart_count)
        cached = j.cached
        if cached is not None and cached[0] == sig:
            return cached[1]
        rec = self._build_record(j, reason)
        j.cached = (sig, rec)
        return rec

    def _build_record(self, j: _Job, reason: str) -> SlurmJob:
        at = self.engine.datetime_at
        if j.state == JobState.RUNNING:
            names = [self.node_names[i] for i, _ in j.alloc]
            node_count = len(j.alloc)
            gpus = j.gpus
            gpn = max((g for _, g in j.alloc), default=0)
        else:
            names = []
            node_count = j.shown_nodes
            gpus = j.req_nodes * j.req_gpn
            gpn = j.req_gpn
        return SlurmJob(
            job_id=str(j.id), job_id_num=j.id, name=j.name, user=self.user, uid=self.uid,
            partition=j.partition, state=j.state, reason=reason, held=j.held,
            nodes=compress_hostlist(names), node_count=node_count, gpus=gpus, gpus_per_node=gpn,
            submit_time=at(j.submit_time),
            eligible_time=at(j.begin_time) if j.state == JobState.PENDING else None,
            start_time=at(j.start_time) if j.start_time is not None else None,
            end_time=at(j.end_time) if j.end_time is not None else None,
            restart_count=j.restart_count, requeueable=j.requeueable, comment=j.comment,
            batch=True)

    def _note_usage(self) -> None:
        now = self.engine.now
        used = self.num_nodes * self.gpus_per_node - sum(self._free)
        self._used = used
        if self._timeline_t[-1] == now:
            self._timeline_used[-1] = used
        else:
            self._timeline_t.append(now)
            self._timeline_used.append(used)

    def _log_alloc(self, job: _Job) -> None:
        self.allocation_log.append((self.engine.now, str(job.id), job.gpus))

    def _account(self, job: _Job) -> None:
        now = self.engine.now
        job.gpu_seconds += job.gpus * (now - job.alloc_since)
        job.alloc_since = now

    def _request_pass(self) -> None:
        if not self._pass_pending:
            self._pass_pending = True
            self.engine.schedule_in(self.sched_delay_s, self._schedule_pass,
                                    priority=PRIORITY_LATE)

    def _fit(self, job: _Job) -> list[int] | None:
        need, gpn = job.req_nodes, job.req_gpn
        free = self._free
        if need == 1 and self.best_fit:
            best = None
            for i, f in enumerate(free):
                if f >= gpn and (best is None or f < free[best]):
                    best = i
            return None if best is None else [best]
        chosen = []
        for i, f in enumerate(free):
            if f >= gpn:
                chosen.append(i)
                if len(chosen) == need:
                    return chosen
        return None

    def _pending_reason(self, j: _Job) -> str:
        if j.held:
            return j.hold_reason
        if j.begin_time > self.engine.now:
            return "BeginTime"
        if j.req_nodes > self.num_nodes:
            return j.partition_reason
        if j.reason != "None":
            return j.reason
        return "Priority" if j.ready_pass < self._passes else "None"

    def _changed(self, job: _Job) -> None:
        """A job's request, hold or begin time changed: requeue it for the scheduler."""
        if job.state == JobState.PENDING:
            job.reason = "None"
            if not job.held and job.req_nodes <= self.num_nodes:
                if job.begin_time > self.engine.now:
                    heapq.heappush(self._waiting, (job.begin_time, job.id))
                else:
                    self._enqueue(job)
        self._request_pass()

    def _enqueue(self, job: _Job) -> None:
        key = (job.req_nodes, job.req_gpn, job.submit_time)
        if job.queued == key:
            return
        job.queued = key
        job.ready_pass = self._passes
        heapq.heappush(self._ready.setdefault(key[:2], []), (job.submit_time, job.id))

    def _ready_job(self, shape: tuple[int, int], entry: tuple[float, int]) -> _Job | None:
        """The job of a ready-queue entry if the entry is still current, else None."""
        job = self._active.get(entry[1])
        if job is None or job.state != JobState.PENDING or job.held or \
                job.queued != (shape[0], shape[1], entry[0]) or job.begin_time > self.engine.now:
            return None
        return job

    def _head(self, shape: tuple[int, int]) -> tuple[float, int] | None:
        heap = self._ready[shape]
        while heap and self._ready_job(shape, heap[0]) is None:
            t, jid = heapq.heappop(heap)
            job = self._active.get(jid)
            if job is not None and job.queued == (shape[0], shape[1], t):
                job.queued = None   # dropped (held, or waiting again): may be queued anew
        return heap[0] if heap else None

    def _schedule_pass(self) -> None:
        """Start pending jobs in priority order (see the module docstring).

        Cost: per shape, only its highest-priority job is tried; a shape that does
        not fit is not tried again in the pass (free GPUs only shrink during it).
        """
        self._pass_pending = False
        self._passes += 1
        now = self.engine.now
        while self._waiting and self._waiting[0][0] <= now:
            _, jid = heapq.heappop(self._waiting)
            job = self._active.get(jid)
            if job is not None and job.state == JobState.PENDING and not job.held \
                    and job.begin_time <= now:
                self._enqueue(job)
        heads = []
        for shape in list(self._ready):
            h = self._head(shape)
            if h is None:
                del self._ready[shape]
            else:
                heads.append((h, shape))
        heapq.heapify(heads)
        blocked = False
        max_free = max(self._free)
        while heads:
            entry, shape = heapq.heappop(heads)
            job = self._ready_job(shape, entry)
            if job is None:
                h = self._head(shape)
                if h is not None:
                    heapq.heappush(heads, (h, shape))
                continue
            nodes = self._fit(job) if job.req_gpn <= max_free else None
            if nodes is None:
                job.reason = "Priority" if blocked else "Resources"
                blocked = True
                if not self.backfill:
                    break
                if self.backfill_interval_s > 0 and not self._backfilling:
                    self._schedule_backfill(now)
                    break
                continue
            heapq.heappop(self._ready[shape])
            job.queued = None
            self._start(job, nodes)
            max_free = max(self._free)
            h = self._head(shape)
            if h is not None:
                heapq.heappush(heads, (h, shape))
        if self._waiting:
            nxt = self._waiting[0][0]
            if self._wakeup_at is None or nxt < self._wakeup_at:
                self._wakeup_at = nxt
                self.engine.schedule(nxt, self._wakeup, nxt, priority=PRIORITY_LATE)

    def _schedule_backfill(self, now: float) -> None:
        """Schedule the next periodic backfill pass (every ``backfill_interval_s``)."""
        if self._backfill_at is not None and self._backfill_at > now:
            return
        i = self.backfill_interval_s
        self._backfill_at = (math.floor(now / i) + 1) * i
        self.engine.schedule(self._backfill_at, self._backfill_pass, priority=PRIORITY_LATE)

    def _backfill_pass(self) -> None:
        """Slurm's sched/backfill cycle: one greedy pass."""
        self._backfill_at = None
        self._backfilling = True
        try:
            self._schedule_pass()
        finally:
            self._backfilling = False
        if any(self._ready.values()):
            self._schedule_backfill(self.engine.now)

    def _wakeup(self, at: float) -> None:
        """A begin time has come: run a pass (only the latest-scheduled wake-up counts)."""
        if self._wakeup_at == at:
            self._wakeup_at = None
        self._request_pass()

    def _start(self, job: _Job, nodes: list[int]) -> None:
        now = self.engine.now
        gpn = job.req_gpn
        for i in nodes:
            self._free[i] -= gpn
        job.alloc = [(i, gpn) for i in nodes]
        job.alloc_ver += 1
        job.alloc_since = now
        job.max_gpus = max(job.max_gpus, job.gpus)
        job.state = JobState.RUNNING
        job.reason = "None"
        job.start_time = now
        job.shown_nodes = len(nodes)
        if job.first_start is None:
            job.first_start = now
        job.shrinks = 0
        self._note_usage()
        self._log_alloc(job)
        run = Run(self, str(job.id), tuple(g for _, g in job.alloc),
                  tuple(self.node_names[i] for i in nodes), job.restart_count)
        job.run = run
        job.program.on_start(run)

    def _stop(self, job: _Job, reason: str) -> None:
        """Kill a running job's program and free its nodes (it stays in _active)."""
        self._account(job)
        for idx, g in job.alloc:
            self._free[idx] += g
        job.alloc = []
        job.alloc_ver += 1
        self._note_usage()
        self._log_alloc(job)
        run, job.run = job.run, None
        if run is not None:
            run._alive = False
        job.program.on_kill(reason)

    def _finish(self, job: _Job, state: JobState) -> None:
        job.state = state
        job.end_time = self.engine.now
        self._ended.append((job.end_time, job.id))
        job.reason = "None"
        self._active.pop(job.id, None)
        self._request_pass()

    def _program_exit(self, run: Run, state: JobState) -> None:
        job = self._jobs[int(run.job_id)]
        if job.run is not run:
            return
        if state not in (JobState.COMPLETED, JobState.FAILED):
            raise ValueError(f"a program exits COMPLETED or FAILED, not {state}")
        self._account(job)
        for idx, g in job.alloc:
            self._free[idx] += g
        job.alloc = []
        job.alloc_ver += 1
        run._alive = False
        job.run = None
        self._note_usage()
        self._log_alloc(job)
        self._finish(job, state)
