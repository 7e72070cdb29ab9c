"""Replay a trace into the simulated Slurm: one simulated job per `TraceJob`, submitted
at its arrival time, and the outcomes collected for `malleable.sim.metrics`.

A trace job with one of the profiled models becomes a malleable `ProfileJob`
(requeueable, trained to its model's target at the trace's batch size); one with
only a duration becomes a `RigidJob` of that duration. Its GPU request becomes
Slurm's ``--nodes`` x ``TresPerNode`` shape by `shape_for`. Nothing here decides
sizes after submission: that is the daemon's (or a test driver's) business.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from malleable.sim.engine import PRIORITY_URGENT, Engine
from malleable.sim.jobs import ProfileJob, ProgressSink, RigidJob
from malleable.sim.metrics import JobOutcome
from malleable.sim.profiles import MODELS, load_profile
from malleable.sim.slurm import SimProgram, SimSlurm
from malleable.sim.traces import TraceJob
from malleable.slurm.records import SubmitRequest
from malleable.spec import SpecError, parse_spec


def shape_for(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """Slurm shape ``(nodes, gpus_per_node)`` for ``gpus`` GPUs on nodes of ``gpus_per_node``.

    One node if it fits; otherwise the fewest nodes ``n`` that split ``gpus``
    exactly with at most ``gpus_per_node`` each (6 on 4-GPU nodes: 2 x 3, 10: 5 x 2),
    as long as that is at most twice the fewest nodes that could hold them;
    otherwise whole nodes, rounded up (7 on 4-GPU nodes: 2 x 4). Slurm's
    ``--nodes`` x ``TresPerNode`` shapes are uniform, so not every count is exact.

    Raises:
        ValueError: ``gpus < 0`` or ``gpus_per_node < 1``.
    """
    if gpus < 0 or gpus_per_node < 1:
        raise ValueError(f"cannot shape {gpus} GPUs on nodes of {gpus_per_node}")
    if gpus <= gpus_per_node:
        return 1, gpus
    lo = -(-gpus // gpus_per_node)
    for n in range(lo, gpus + 1):
        if gpus % n == 0 and gpus // n <= gpus_per_node:
            if n <= 2 * lo:
                return n, gpus // n
            break
    return lo, gpus_per_node


def rigid_program(t: TraceJob) -> RigidJob:
    """The program of a trace job that is not a training job of a profiled model: a
    rigid job that holds its allocation for its recorded run time (``duration_s``, s).

    Raises:
        ValueError: the job has no recorded run time (naming the job and its model).
    """
    if t.duration_s is None:
        raise ValueError(f"job {t.name!r}: model {t.model!r} has no profile and the job has "
                         "no duration")
    return RigidJob(t.duration_s)


@dataclass
class ReplayedJob:
    """A trace job and what the replay made of it.

    Attributes:
        trace: the trace record.
        program: its simulated program (ProfileJob or RigidJob).
        nodes, gpus_per_node: the shape it was submitted with.
        job_id: Slurm id once submitted ("" before).
        capped: True if its request was cut to the cluster's size.
    """

    trace: TraceJob
    program: SimProgram
    nodes: int
    gpus_per_node: int
    job_id: str = ""
    capped: bool = False


class Replay:
    """Submits a trace's jobs to a `SimSlurm` at their arrival times.

    Args:
        engine, slurm: the simulation.
        jobs: the trace.
        spool_dir: where malleable jobs write progress files (None = nowhere).
        report_interval_s: seconds between progress lines of a malleable job.
        program_for: builds a job's program (default: see the module docstring).
        comment_for: the job's Slurm comment (e.g. the malleable spec); default "".
        sink: how progress records are written (default: JSON lines to files).
        restart_cost_s: restart cost of every malleable job (default: its model's,
            `malleable.sim.profiles.RESTART_COST_S`; Pollux's experiments use 30).
        adaptive_batch: malleable jobs pick their goodput-optimal batch at every
            start and epoch (`ProfileJob`'s oracle) instead of the trace's batch.
        oversize: "cap" cuts a request larger than the cluster to the cluster's
            size (recorded in ``capped``); "error" refuses it.

    Raises:
        ValueError: a job that is neither a profiled model nor has a duration, or
            an oversized job with ``oversize="error"``.
    """

    def __init__(self, engine: Engine, slurm: SimSlurm, jobs: Sequence[TraceJob], *,
                 spool_dir: str | Path | None = None, report_interval_s: float = 30.0,
                 program_for: Callable[[TraceJob], SimProgram] | None = None,
                 comment_for: Callable[[TraceJob], str] | None = None,
                 sink: ProgressSink | None = None, oversize: str = "cap",
                 restart_cost_s: float | None = None, adaptive_batch: bool = False):
        if oversize not in ("cap", "error"):
            raise ValueError(f"oversize must be 'cap' or 'error', got {oversize!r}")
        self.engine = engine
        self.slurm = slurm
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self.report_interval_s = report_interval_s
        self.comment_for = comment_for
        self.sink = sink
        self.restart_cost_s = restart_cost_s
        self.adaptive_batch = adaptive_batch
        self.jobs: list[ReplayedJob] = []
        self.by_id: dict[str, ReplayedJob] = {}
        total = slurm.num_nodes * slurm.gpus_per_node
        build = program_for or self._default_program
        for t in jobs:
            gpus, capped = t.gpus, False
            if gpus > total:
                if oversize == "error":
                    raise ValueError(f"job {t.name!r} asks for {gpus} GPUs, the cluster has "
                                     f"{total}")
                gpus, capped = total, True
            nodes, gpn = shape_for(gpus, slurm.gpus_per_node)
            self.jobs.append(ReplayedJob(t, build(t), nodes, gpn, capped=capped))
        self._started = False
        self._arrivals = sorted(max(r.trace.arrival_s, 0.0) for r in self.jobs)

    def next_arrival(self, now: float) -> float | None:
        """The first trace arrival after virtual time ``now`` (s), None if none is left
        (arrivals at ``now`` itself are submitted before any other event of ``now``)."""
        i = bisect.bisect_right(self._arrivals, now)
        return self._arrivals[i] if i < len(self._arrivals) else None

    @property
    def capped(self) -> list[str]:
        """Names of jobs whose request was cut to the cluster's size."""
        return [r.trace.name for r in self.jobs if r.capped]

    def _default_program(self, t: TraceJob) -> SimProgram:
        if t.model in MODELS:
            prof = load_profile(t.model, restart_cost_s=self.restart_cost_s)
            return ProfileJob(prof, spool_dir=self.spool_dir, batch=t.batch_size,
                              adaptive_batch=self.adaptive_batch,
                              report_interval_s=self.report_interval_s, sink=self.sink)
        return rigid_program(t)

    def start(self) -> None:
        """Schedule every submission at its arrival (call once, before running the engine)."""
        if self._started:
            raise RuntimeError("Replay.start() was already called")
        self._started = True
        for r in self.jobs:
            self.engine.schedule(max(r.trace.arrival_s, self.engine.now), self._submit, r,
                                 priority=PRIORITY_URGENT)

    def _submit(self, r: ReplayedJob) -> None:
        t = r.trace
        malleable = isinstance(r.program, ProfileJob)
        req = SubmitRequest(script=f"{t.name}.sbatch", nodes=r.nodes, gpus_per_node=r.gpus_per_node,
                            comment=self.comment_for(t) if self.comment_for else "",
                            name=t.name, requeue=malleable)
        r.job_id = self.slurm.submit_sim(req, r.program)
        self.by_id[r.job_id] = r

    @property
    def finished(self) -> int:
        """Jobs that ended (any final state)."""
        return self.slurm.ended_jobs

    def all_done(self) -> bool:
        """True when every job was submitted and has ended."""
        return len(self.by_id) == len(self.jobs) and self.slurm.active_jobs == 0

    def outcomes(self) -> list[JobOutcome]:
        """One `JobOutcome` per trace job, in trace order (unsubmitted jobs have no times)."""
        acct = {a.job_id: a for a in self.slurm.accounting()}
        g = self.slurm.gpus_per_node
        out = []
        for r in self.jobs:
            a = acct.get(r.job_id)
            requested = r.nodes * r.gpus_per_node
            out.append(JobOutcome(
                name=r.trace.name, job_id=r.job_id, model=r.trace.model,
                gpus_requested=requested, arrival_s=r.trace.arrival_s,
                start_s=a.started if a else None, end_s=a.ended if a else None,
                restarts=a.restarts if a else 0, gpu_seconds=a.gpu_seconds if a else 0.0,
                ideal_time=_ideal_time(r, g, self._max_gpus(r))))
        return out

    def _max_gpus(self, r: ReplayedJob) -> int:
        """The most GPUs the job can use: its spec's maximum, else what it was submitted on."""
        spec = None
        if self.comment_for is not None:
            try:
                spec = parse_spec(self.comment_for(r.trace))
            except SpecError:
                spec = None
        return spec.max_gpus if spec is not None else r.nodes * r.gpus_per_node


def _ideal_time(r: ReplayedJob, gpus_per_node: int, max_gpus: int
                ) -> Callable[[float], float] | None:
    """Seconds the job would take alone on a GPU share (for finish-time fairness).

    The share is capped at the most GPUs the job can use (``max_gpus``): GPUs of an
    equal share it could not use were not denied to it. Its start-up (the resume
    part of its restart cost) counts once, as it does in its JCT. None for a job
    of unknown kind and for a CPU-only job (0 GPUs: its time does not depend on a
    share of the GPUs; `malleable.sim.metrics.fairness_rho` leaves it out)."""
    prog = r.program
    if r.trace.gpus == 0:
        return None
    if isinstance(prog, ProfileJob):
        profile, batch, startup = prog.profile, prog.batch, prog.resume_s

        def ideal(share: float) -> float:
            return startup + profile.isolated_time(min(share, float(max_gpus)), batch,
                                                   gpus_per_node)

        return ideal
    if isinstance(prog, RigidJob):
        duration, gpus = prog.duration_s, max(1, r.nodes * r.gpus_per_node)

        def rigid(share: float) -> float:
            return duration * max(1.0, gpus / share)

        return rigid
    return None

