"""The simulator's prediction of a `malleable replay` onto a real cluster.

`malleable replay` submits trace jobs as emulated jobs (examples/emulated_job.py)
whose step times are the model's measured profile divided by the replay's
speedup. `predict_replay` runs the same jobs (the same `malleable.replay.ReplayJob`
recipes: spec, initial size, batch size) through the simulator's daemon loop
(`malleable.sim.loop.run_prepared`) on the same compressed clock:

* arrivals are the recipes' trace arrivals divided by the speedup, from the
  first one (as `malleable.replay.replay` submits them);
* a job's step time is its profile's divided by the speedup
  (`CompressedProfile`); its statistical efficiency and target are the
  profile's, as for the emulator;
* the daemon's configuration is the cluster daemon's (same intervals, policy and
  limits, on the same compressed clock), and Slurm's backfill runs every
  ``bf_interval`` (30 s) as on the cluster, where it is not compressed;
* the restart cost is what was measured on the cluster (``restart_cost_s``:
  the seconds a requeued job takes from being started again to training, i.e.
  process start and checkpoint load), charged at every start as the simulated
  jobs do (`malleable.sim.jobs`), with a tenth of it as the save; and what a
  checkpoint-requeue took beyond that on the cluster (``requeue_latency_s``:
  Slurm's requeue and start, the daemon's calls between its polls) delays the
  requeued job's next start;
* a job tunes its batch size itself at every start and epoch when its recipe
  says so (``adaptive_batch``: the profile's goodput-optimal batch, as the
  emulator's ``--adaptive-batch``); otherwise it takes the batch size of the
  daemon's plan file at every start, as the emulator does (``follow_plan``).

The result's JCTs are therefore seconds on the cluster's clock, comparable with
the JCTs measured there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from malleable.config import Config
from malleable.sim.jobsetup import PreparedJob
from malleable.sim.loop import SimOptions, SimResult, run_prepared
from malleable.sim.profiles import ModelProfile, load_profile
from malleable.sim.traces import TraceJob
from malleable.spec import format_spec

if TYPE_CHECKING:
    from malleable.replay import ReplayJob

#: Share of the restart cost a simulated job spends saving (`ProfileJob`'s default).
SAVE_FRACTION = 0.1


class CompressedProfile:
    """A `ModelProfile` whose time runs ``speedup`` times faster.

    Step times (`step_time`) and isolated training times (`isolated_time`) are the
    wrapped profile's divided by ``speedup``, in seconds; the restart cost is
    ``restart_cost_s`` seconds on the compressed clock. Everything else (gradient
    statistics, efficiency, target, batch limits) is the wrapped profile's.

    Raises:
        ValueError: ``speedup`` not a finite number > 0, or ``restart_cost_s`` < 0.
    """

    def __init__(self, profile: ModelProfile, speedup: float, restart_cost_s: float):
        if not (isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0):
            raise ValueError(f"speedup={speedup!r}: expected a number > 0")
        if not (math.isfinite(restart_cost_s) and restart_cost_s >= 0):
            raise ValueError(f"restart_cost_s={restart_cost_s!r}: expected a number >= 0")
        self._profile = profile
        self.speedup = float(speedup)
        self.restart_cost_s = float(restart_cost_s)

    def step_time(self, placement, local_bsz: float) -> float:
        """Seconds per iteration on ``placement`` at per-GPU batch ``local_bsz``, compressed."""
        return self._profile.step_time(placement, local_bsz) / self.speedup

    def isolated_time(self, gpus: float, batch: float | None = None, gpus_per_node: int = 4,
                      placement=None) -> float:
        """`ModelProfile.isolated_time` in compressed seconds."""
        return self._profile.isolated_time(gpus, batch, gpus_per_node, placement) / self.speedup

    def __getattr__(self, name: str):
        return getattr(self._profile, name)

    def __repr__(self) -> str:
        return (f"CompressedProfile({self._profile!r}, speedup={self.speedup:g}, "
                f"restart_cost_s={self.restart_cost_s:g})")


def prepare_replay(recipes: Sequence[ReplayJob], *, speedup: float, restart_cost_s: float
                   ) -> list[PreparedJob]:
    """The simulator's jobs for ``recipes`` (see the module docstring).

    Args:
        recipes: the replay's jobs, in arrival order (`malleable.replay.recipe`).
        speedup: the replay's time compression (> 0).
        restart_cost_s: measured seconds from a (re)start to training, compressed clock.

    Returns:
        One `PreparedJob` per recipe: arrival in compressed seconds from the first
        recipe, submitted on ``initial_gpus``, spec and batch size of the recipe.

    Raises:
        ValueError: bad ``speedup`` or ``restart_cost_s``, or a recipe of a model
            without a profile.
    """
    origin = min((r.arrival_s for r in recipes), default=0.0)
    out = []
    for r in recipes:
        # restart_cost_s is the resume part: the whole cost has a tenth more as the save.
        prof = CompressedProfile(load_profile(r.model), speedup,
                                 restart_cost_s / (1.0 - SAVE_FRACTION))
        trace = TraceJob(name=r.name, arrival_s=(r.arrival_s - origin) / speedup,
                         gpus=r.initial_gpus, model=r.model, batch_size=r.batch)
        adaptive = r.adaptive_batch
        out.append(PreparedJob(trace=trace, requested=r.initial_gpus,
                               comment=format_spec(r.spec),
                               batch=None if adaptive else r.batch, adaptive=adaptive,
                               profile=prof))  # type: ignore[arg-type]
    return out


def predict_replay(recipes: Sequence[ReplayJob], config: Config, *, speedup: float,
                   nodes: int, gpus_per_node: int, restart_cost_s: float, seed: int = 0,
                   report_interval_s: float | None = None,
                   backfill_interval_s: float = 30.0, dry_run: bool = False,
                   requeue_latency_s: float = 0.0, sched_delay_s: float = 0.0,
                   workdir: str | os.PathLike | None = None) -> SimResult:
    """Simulate the replay of ``recipes`` on a cluster of ``nodes`` x ``gpus_per_node``
    GPUs run by a daemon configured as ``config`` (module docstring).

    Args:
        recipes, speedup, restart_cost_s: as `prepare_replay`.
        config: the cluster daemon's configuration (intervals in seconds of its clock).
        nodes, gpus_per_node: the cluster.
        seed: the policy's seed.
        report_interval_s: seconds between a job's progress lines on the compressed
            clock (default: the emulator's 30 emulated seconds, i.e. 30 / speedup).
        backfill_interval_s: the cluster's Slurm ``bf_interval`` (default 30 s, Slurm's
            default and the harness's): real seconds, not compressed.
        dry_run: the cluster's daemon ran with ``--dry-run`` (plain Slurm, observed).
        requeue_latency_s: seconds a checkpoint-requeue took on the cluster beyond
            the job's start-up and the wait for the daemon's next poll (Slurm's
            requeue and the daemon's calls; `SimSlurm`'s ``requeue_latency_s``).
        sched_delay_s: seconds the cluster's Slurm took from a submission (or any
            change) to starting a job that fits (`SimSlurm`'s ``sched_delay_s``).
        workdir: where the run's spool goes (default: a temporary directory).

    Returns:
        The `SimResult`; its outcomes' times are compressed seconds from the first
        submission.

    Raises:
        ValueError: bad arguments (named).
    """
    prepared = prepare_replay(recipes, speedup=speedup, restart_cost_s=restart_cost_s)
    interval = 30.0 / speedup if report_interval_s is None else report_interval_s
    # Slurm on the cluster starts a requeued job as soon as the daemon clears its
    # begin-time delay; the simulated Slurm does the same through the same call.
    options = SimOptions(nodes=nodes, gpus_per_node=gpus_per_node, seed=seed,
                         report_interval_s=interval, backfill_interval_s=backfill_interval_s,
                         dry_run=dry_run, requeue_latency_s=requeue_latency_s,
                         sched_delay_s=sched_delay_s)
    return run_prepared(prepared, config, options, workdir=workdir, follow_plan=True)
