"""Typed, immutable records of what Slurm reports, independent of backend and release.

Every backend (command line, pyslurm, the simulator) returns these and only
these, so the daemon never sees a Slurm JSON shape. Times are timezone-aware
UTC datetimes (None when Slurm has none); GPU counts are integers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class JobState(enum.StrEnum):
    """Slurm's base job states (``squeue`` long names)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    CONFIGURING = "CONFIGURING"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"

    @property
    def finished(self) -> bool:
        """True for a state the job will not leave (COMPLETED, FAILED, ...)."""
        return self in _FINISHED

    @property
    def active(self) -> bool:
        """True while the job holds or waits for resources (PENDING, RUNNING, ...)."""
        return not self.finished


_FINISHED = frozenset({
    JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.TIMEOUT,
    JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL, JobState.DEADLINE,
    JobState.OUT_OF_MEMORY, JobState.REVOKED, JobState.SPECIAL_EXIT,
})


class SignalTarget(enum.StrEnum):
    """Which processes of a job a signal reaches (``scancel --signal``)."""

    BATCH = "batch"   # only the batch shell (scancel --batch)
    STEPS = "steps"   # the job's steps, not the batch shell (scancel without --batch/--full)
    FULL = "full"     # the batch shell and every step (scancel --full)


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it.

    Attributes:
        job_id: the id a user types: "123", an array task "123_4", a het component "123+0".
        job_id_num: Slurm's numeric id for this record (for an array task, its own id).
        name, user, uid, account, partition: as in squeue ("" when unset).
        state: base state; ``state_flags`` holds extra flags Slurm reports with it
            (e.g. "REQUEUED", "COMPLETING" in 23.11+ lists).
        reason: the pending/hold reason as squeue's %r shows it: Slurm's description
            when it set one ("job requeued in held state"), else the reason code
            ("JobHeldUser", "Resources"); "None" when running.
        held: True when the job is held (priority 0, or a held reason).
        nodes: the node list expression ("node[1-2]"), "" when pending.
        node_count: nodes allocated (running) or requested (pending; read from the
            job's TRES request, since Slurm keeps the old allocation's count after a requeue).
        gpus: GPUs allocated in total (running) or requested (pending).
        gpus_per_node: GPUs per node, allocated (running) or requested (pending);
            for an uneven allocation, the maximum over nodes.
        submit_time, eligible_time, start_time, end_time: UTC datetimes or None.
        time_limit: None for unlimited.
        restart_count: how often Slurm requeued it (RestartCnt).
        requeueable: the job may be requeued (``--requeue`` or JobRequeue=1).
        comment: the job's comment (where the malleable spec lives).
        batch: True for a batch job (sbatch); interactive jobs cannot be requeued.
        array_job_id, array_task_id, het_job_id, het_job_offset: None unless set.
    """

    job_id: str
    job_id_num: int
    name: str = ""
    user: str = ""
    uid: int | None = None
    account: str = ""
    partition: str = ""
    state: JobState = JobState.PENDING
    state_flags: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""
    held: bool = False
    nodes: str = ""
    node_count: int = 0
    gpus: int = 0
    gpus_per_node: int = 0
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit: timedelta | None = None
    restart_count: int = 0
    requeueable: bool = False
    comment: str = ""
    batch: bool = True
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None

    @property
    def running(self) -> bool:
        return self.state == JobState.RUNNING

    @property
    def pending(self) -> bool:
        return self.state == JobState.PENDING


@dataclass(frozen=True)
class SlurmNode:
    """One node.

    Attributes:
        name: node name.
        state: base state in lower case ("idle", "mixed", "allocated", "down", ...).
        state_flags: extra flags ("DRAIN", "NOT_RESPONDING", ...), upper case.
        partitions: partitions the node belongs to.
        gpus: GPUs configured (GRES gpu count).
        gpus_allocated: GPUs allocated to jobs now.
    """

    name: str
    state: str
    state_flags: frozenset[str] = field(default_factory=frozenset)
    partitions: tuple[str, ...] = ()
    gpus: int = 0
    gpus_allocated: int = 0

    @property
    def usable(self) -> bool:
        """Up and schedulable: not down, drained, failing or not responding."""
        bad = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
               "POWERED_DOWN", "POWER_DOWN", "MAINT", "REBOOT_REQUESTED", "FUTURE"}
        return self.state.upper() not in bad and not (self.state_flags & bad)


@dataclass(frozen=True)
class ClusterInfo:
    """What the controller says about itself.

    Attributes:
        version: Slurm release, e.g. "22.05.8".
        version_tuple: (major, minor, micro), e.g. (22, 5, 8).
        gpus_per_node: GPUs per node when homogeneous, else the most common count.
        partitions: partition names; ``default_partition`` the default one ("" if none).
        nodes: number of nodes.
    """

    version: str
    version_tuple: tuple[int, int, int]
    gpus_per_node: int
    partitions: tuple[str, ...] = ()
    default_partition: str = ""
    nodes: int = 0


@dataclass(frozen=True)
class SubmitRequest:
    """A batch job to submit (``sbatch``).

    Attributes:
        script: path of the batch script.
        nodes: number of nodes; gpus_per_node: GPUs per node (GRES).
        comment: the job comment (the malleable spec goes here).
        name: job name ("" = Slurm's default, the script name).
        partition: "" = the default partition.
        requeue: pass ``--requeue`` (malleable jobs must be requeueable).
        open_mode_append: pass ``--open-mode=append`` so a requeue keeps the output.
        output: stdout path pattern ("" = Slurm's default).
        workdir: working directory ("" = the caller's).
        extra_args: further sbatch options, passed as given (each one argv element).
        env: extra environment variables for the job.
        hold: submit the job held (``sbatch --hold``); it stays PENDING until released.
    """

    script: str
    nodes: int = 1
    gpus_per_node: int = 1
    comment: str = ""
    name: str = ""
    partition: str = ""
    requeue: bool = True
    open_mode_append: bool = True
    output: str = ""
    workdir: str = ""
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    hold: bool = False
