"""How a trace job becomes a simulated malleable job for a policy: its spec, request and program.

A trace row says what a user ran (a model, GPUs, a batch size, an arrival);
what the *simulated* job declares to the daemon (its ``malleable:`` spec in
the Slurm comment), what it asks Slurm for at submission, and how it picks
its batch size depend on the scheduler being compared. `JobSetup` holds
those choices; `POLICY_SETUPS` gives, per policy, the setup Pollux's own
simulator used for the scheduler it stands for (petuum/adaptdl, branch
osdi21-artifact, ``simulator/simulator.py``), so that a comparison with its
published numbers is like for like:

* ``pollux`` (Pollux): sizes 1..max (``range``); the batch is chosen by the
  job itself at every start and epoch (``adaptive``: AdaptDL's in-job batch
  tuning; here the truth model's goodput-optimal batch,
  `ModelProfile.best_batch`); submitted on 1 GPU (the artifact ignores the
  trace's ``num_replicas`` and ``batch_size`` for Pollux and starts every job
  at the model's initial batch).
* ``las`` (as Tiresias) and ``static``: exactly the trace's GPU request
  (``requested``: spec ``gpus=N``, preemptible but never resized) at the
  trace's batch size, submitted at that request (the artifact's Tiresias
  runs a job on ``num_replicas`` GPUs or not at all, at ``batch_size``).
* ``optimus`` (Optimus+Oracle): sizes 1..``batch // min_local_bsz`` at the
  trace's fixed batch size, submitted at the request, and the job declares
  its true total work (``oracle_work``: ``target_samples``, what the
  artifact's Optimus reads from the validation curves as the remaining
  iterations).
* any other policy: ``range`` sizes at the trace's fixed batch size, no oracle.

Shapes: the daemon runs a job inside one node (k <= g) or on whole nodes
(k = n*g) (`malleable.daemon.shapes`), while the artifact places any count
anywhere. A request that is not such a size (6 GPUs on 4-GPU nodes) becomes
one of the two legal sizes around it by seeded randomized rounding
(`legal_size`): 4 or 8 with probabilities that keep the expected GPU count
(6 -> 4 or 8, each with probability 1/2). NCF runs on one GPU in every
setup, as in the artifact (``max_replicas = 1``).

Every malleable job also declares its restart cost (``restart_cost``, the
model's, `ModelProfile.restart_cost_s`, as Pollux's policy is given its 30 s),
the checkpoint signal it handles (USR1 to the batch shell, the spec default)
and that a shrink is a checkpoint-requeue (AdaptDL restarts on every change).
It declares no per-GPU batch limit (``max_local_batch``): the simulated jobs,
like Pollux's, accumulate gradients when a GPU's share of the batch exceeds
what fits in its memory (`ModelProfile.step_time`), so any size runs; a
declared limit would make the estimators treat the sizes that need
accumulation as infeasible (an ImageNet job at batch 6400 could then run only
on 32 or more GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from malleable.policies.registry import DEFAULT as DEFAULT_POLICY
from malleable.sim.jobs import ProfileJob, ProgressSink
from malleable.sim.profiles import MODELS, ModelProfile, load_profile
from malleable.sim.traces import TraceJob
from malleable.spec import MalleableSpec, format_spec

SIZES = ("range", "requested")
BATCHES = ("fixed", "adaptive")
SUBMITS = ("requested", "one")

#: Models the artifact never runs on more than one GPU.
SINGLE_GPU_MODELS = ("ncf",)
#: The artifact's per-job cap on GPUs ("simulator can't handle more").
MAX_GPUS_PER_JOB = 64


@dataclass(frozen=True)
class JobSetup:
    """What a simulated malleable job declares and does (see the module docstring).

    Attributes:
        sizes: "range" (spec ``gpus=1-max``) or "requested" (``gpus=N-N``, the
            trace's request made legal).
        batch: "fixed" (the trace's batch, ``max_batch`` = ``batch``) or "adaptive"
            (the job picks the goodput-optimal batch itself; spec ``batch`` = the
            model's initial batch m0, ``max_batch`` its largest validated batch).
        submit: "requested" (the legal request) or "one" (1 GPU).
        oracle_work: declare the job's true total work (``target_samples``).

    Raises:
        ValueError: an unknown value (names the field).
    """

    sizes: str = "range"
    batch: str = "fixed"
    submit: str = "requested"
    oracle_work: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("sizes", SIZES), ("batch", BATCHES), ("submit", SUBMITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"job setup {name}={getattr(self, name)!r}: expected one of "
                                 f"{', '.join(allowed)}")


#: The Pollux artifact's setup of the scheduler each policy stands for.
POLICY_SETUPS: Mapping[str, JobSetup] = {
    "pollux": JobSetup(sizes="range", batch="adaptive", submit="one"),
    "las": JobSetup(sizes="requested", batch="fixed", submit="requested"),
    "static": JobSetup(sizes="requested", batch="fixed", submit="requested"),
    "optimus": JobSetup(sizes="range", batch="fixed", submit="requested", oracle_work=True),
}
DEFAULT_SETUP = JobSetup()

#: Named setups for the command line ("auto" = `POLICY_SETUPS` by policy).
NAMED_SETUPS: Mapping[str, JobSetup] = {
    "requested": POLICY_SETUPS["las"],
    "elastic": DEFAULT_SETUP,
    "adaptive": POLICY_SETUPS["pollux"],
}


def setup_for(policy: str, name: str = "auto", oracle_work: bool | None = None) -> JobSetup:
    """The job setup for ``policy``: ``name`` "auto" (the artifact's, `POLICY_SETUPS`)
    or one of `NAMED_SETUPS`; ``oracle_work`` overrides the setup's when not None.
    ``policy`` "default" is the registry's default policy (`malleable.policies.registry.DEFAULT`),
    as the daemon resolves it.

    Raises:
        ValueError: an unknown setup name.
    """
    if name == "auto":
        policy = DEFAULT_POLICY if policy == "default" else policy
        setup = POLICY_SETUPS.get(policy, DEFAULT_SETUP)
    elif name in NAMED_SETUPS:
        setup = NAMED_SETUPS[name]
    else:
        raise ValueError(f"job setup {name!r}: expected auto or one of "
                         f"{', '.join(NAMED_SETUPS)}")
    return setup if oracle_work is None else replace(setup, oracle_work=oracle_work)


def legal_sizes(max_gpus: int, gpus_per_node: int) -> np.ndarray:
    """Sizes the daemon can run on nodes of g GPUs, up to ``max_gpus``: 1..g, 2g, 3g, ..."""
    g = gpus_per_node
    small = np.arange(1, min(g, max_gpus) + 1)
    big = np.arange(2 * g, max_gpus + 1, g)
    return np.concatenate((small, big)).astype(np.int64)


def legal_floor(k: int, gpus_per_node: int) -> int:
    """The largest legal size <= k (k >= 1)."""
    return k if k <= gpus_per_node else (k // gpus_per_node) * gpus_per_node


def legal_size(k: int, gpus_per_node: int, u: float) -> int:
    """``k`` GPUs made a legal size: itself if legal, else the legal size below
    (``lo``) or above (``hi``), ``hi`` when ``u < (k - lo) / (hi - lo)`` (randomized
    rounding: the expected result is ``k``). ``u`` is a uniform number in [0, 1).

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"a GPU request must be >= 1, got {k}")
    g = gpus_per_node
    if k <= g or k % g == 0:
        return k
    lo = (k // g) * g
    hi = lo + g
    return hi if u < (k - lo) / (hi - lo) else lo


def oracle_samples(profile: ModelProfile, batch: int) -> int:
    """Samples a job trains at global batch ``batch`` until its target (the true total
    work in the spec's unit, samples at m0 = ``batch``): the sum over epochs of the
    epoch's progress divided by the progress one sample makes at that batch
    (``gain(batch) / batch``). The same count Pollux's Optimus+Oracle reads off the
    validation curves (iterations to the completion epoch times the batch)."""
    bounds = np.concatenate(([0.0], profile.epoch_progress))
    total = 0.0
    for e in range(profile.epochs):
        width = float(bounds[e + 1] - bounds[e])
        if width <= 0:
            continue
        mid = float(bounds[e]) + 0.5 * width
        total += width * batch / profile.gain(batch, mid)
    return max(1, int(math.ceil(total)))


@dataclass(frozen=True)
class PreparedJob:
    """A trace job ready to be replayed.

    Attributes:
        trace: the trace job, with ``gpus`` set to what it is submitted with.
        requested: the GPUs the trace asked for (before the setup).
        comment: its Slurm comment (the spec; "" for a rigid job).
        batch: the fixed global batch (None: adaptive, or a rigid job).
        adaptive: the job picks its own batch.
        profile: its truth model (None for a rigid job).
    """

    trace: TraceJob
    requested: int
    comment: str
    batch: int | None
    adaptive: bool
    profile: ModelProfile | None


def prepare_jobs(jobs: list[TraceJob], setup: JobSetup, *, gpus_per_node: int,
                 total_gpus: int, seed: int, restart_cost_s: float | None = None,
                 ) -> list[PreparedJob]:
    """Apply ``setup`` to every job of a trace (see the module docstring).

    Jobs whose model is one of the profiled `MODELS` become malleable; the others
    stay as they are (rigid, run for their duration). ``seed`` drives the
    randomized rounding of requests (one uniform draw per job, in trace order,
    whatever the setup, so the same seed gives the same sizes). With the trace's
    fixed batch, a request is never rounded up past the batch (6 GPUs at batch 6
    on 4-GPU nodes become 4, not 8): a GPU must get at least one sample.

    Args:
        jobs: the trace, arrivals in s.
        setup: the `JobSetup`.
        gpus_per_node: g >= 1; total_gpus: GPUs in the cluster.
        seed: the run's seed.
        restart_cost_s: every job's restart cost, s (None: per model).

    Returns:
        One `PreparedJob` per job, in the order of ``jobs``.

    Raises:
        ValueError: a job of a profiled model without a usable size, or whose batch
            is smaller than its GPUs (``batch_size < gpus``: no data-parallel job can
            give each GPU a sample; the trace loaders refuse such a row).
    """
    rng = np.random.default_rng([seed, 1])
    draws = rng.random(len(jobs))
    cap = min(MAX_GPUS_PER_JOB, total_gpus)
    out = []
    for t, u in zip(jobs, draws, strict=True):
        if t.model not in MODELS:
            out.append(PreparedJob(t, t.gpus, "", None, False, None))
            continue
        if t.batch_size is not None and t.batch_size < t.gpus:
            raise ValueError(f"job {t.name!r}: batch size {t.batch_size} is below its "
                             f"{t.gpus} GPUs (at least one sample per GPU)")
        prof = load_profile(t.model, restart_cost_s=restart_cost_s)
        single = t.model in SINGLE_GPU_MODELS
        adaptive = setup.batch == "adaptive" and not single
        req = 1 if single else legal_size(min(max(t.gpus, 1), cap), gpus_per_node, float(u))
        req = min(req, legal_floor(cap, gpus_per_node))
        if t.batch_size is not None and not adaptive:
            # (rounded up past the batch, a GPU would get no sample: no size could run)
            req = min(req, legal_floor(t.batch_size, gpus_per_node))
        if adaptive:
            m0, max_batch, batch = prof.init_batch_size, prof.max_batch_size, None
        else:
            fixed = t.batch_size or prof.default_batch(req)
            m0, max_batch, batch = fixed, fixed, fixed
        if setup.sizes == "requested":
            lo = hi = req
        else:
            per = max(1, (max_batch if setup.batch == "adaptive" else m0) // prof.min_local_bsz)
            hi = 1 if single else max(1, legal_floor(min(per, cap), gpus_per_node))
            lo = 1
        submit = lo if setup.submit == "one" else min(max(req, lo), hi)
        spec = MalleableSpec(
            min_gpus=lo, max_gpus=hi, batch_size=int(m0), max_batch_size=int(max_batch),
            model=t.model,
            restart_cost_s=float(prof.restart_cost_s),
            target_samples=oracle_samples(prof, int(m0)) if setup.oracle_work else None)
        out.append(PreparedJob(replace(t, gpus=submit), t.gpus, format_spec(spec), batch,
                               adaptive, prof))
    return out


def program_for(job: PreparedJob, *, spool_dir, report_interval_s: float,
                sink: ProgressSink | None = None, follow_plan: bool = False) -> ProfileJob:
    """The simulated program of a malleable prepared job (a `ProfileJob`); ``sink``
    writes its progress records (default: JSON lines appended to its file);
    ``follow_plan`` as `ProfileJob`'s.

    Raises:
        ValueError: a rigid job (no profile).
    """
    if job.profile is None:
        raise ValueError(f"job {job.trace.name!r} is rigid: it has no profile")
    return ProfileJob(job.profile, spool_dir=spool_dir, batch=job.batch,
                      adaptive_batch=job.adaptive, report_interval_s=report_interval_s,
                      sink=sink, follow_plan=follow_plan)
