"""A test-only driver: plain Slurm behaviour (`static`) on the simulated Slurm.

Until the daemon exists, this proves the simulator's pieces together: a trace
is replayed into `SimSlurm` with simulated jobs, and every ``interval_s``
simulated seconds the driver polls Slurm once and gives each pending job the
size it asked for at submission (what Slurm does anyway: no policy, no
estimator). It is not a policy and lives in the tests on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from malleable.sim.engine import Engine
from malleable.sim.metrics import JobOutcome, summarize, write_jobs_csv, write_summary
from malleable.sim.slurm import SimSlurm
from malleable.sim.traces import TraceJob
from malleable.sim.workload import Replay


@dataclass
class StaticRun:
    """What one run produced."""

    engine: Engine
    slurm: SimSlurm
    replay: Replay
    outcomes: list[JobOutcome]
    summary: dict
    cycles: int


def run_static(jobs: list[TraceJob], out_dir: Path | None, *, nodes: int = 16,
               gpus_per_node: int = 4, interval_s: float = 60.0, spool_dir: Path | None = None,
               max_time_s: float = 30 * 86400.0) -> StaticRun:
    """Replay ``jobs`` with the static driver until all end (or ``max_time_s``);
    write summary.json and jobs.csv to ``out_dir`` when given."""
    engine = Engine()
    slurm = SimSlurm(engine, nodes, gpus_per_node)
    replay = Replay(engine, slurm, jobs, spool_dir=spool_dir)
    replay.start()
    cycles = 0

    def cycle() -> None:
        nonlocal cycles
        cycles += 1
        for job in slurm.jobs():
            r = replay.by_id.get(job.job_id)
            if r is None or not job.pending:
                continue
            if (job.node_count, job.gpus_per_node) != (r.nodes, r.gpus_per_node):
                slurm.resize_pending(job.job_id, r.nodes, r.gpus_per_node)
        if not replay.all_done() and engine.now + interval_s <= max_time_s:
            engine.schedule_in(interval_s, cycle)

    engine.schedule(0.0, cycle)
    engine.run()
    outcomes = replay.outcomes()
    total = nodes * gpus_per_node
    summary = summarize(outcomes, total, slurm.gpu_timeline())
    if out_dir is not None:
        write_summary(summary, out_dir / "summary.json")
        write_jobs_csv(outcomes, total, out_dir / "jobs.csv")
    return StaticRun(engine, slurm, replay, outcomes, summary, cycles)
