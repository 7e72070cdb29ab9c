"""`malleable replay`: submit a trace to a real Slurm cluster, time-compressed.

::

    malleable replay --workload workload-1.csv --speedup 30 --limit 40 \\
        --script examples/emulated_job.sbatch --log replay.jsonl

Each trace job becomes a malleable emulated job (examples/emulated_job.py, which
runs at the speed its model's measured profile gives, divided by the speedup)
submitted at its arrival time divided by the speedup. The recipe that turns a
trace job into a malleable job (`recipe`) is a pure function shared with the
simulator's prediction of the same replay, so that the two run the same jobs:

* spec ``gpus=1-M`` (M = ``--max-gpus``, default the cluster's GPUs), the
  model's largest validated batch as the batch limit, the model's per-GPU
  batch limit (dropped when m0 cannot fit under it on M GPUs: the job
  accumulates gradients), the model name, the checkpoint signal and grace,
  shrink by checkpoint-requeue;
* the batch size: by default the job tunes it itself as AdaptDL jobs do
  (``--adaptive-batch`` of the emulator: the goodput-optimal batch for its
  placement at every start and epoch, Pollux's setup) and declares the
  model's smallest validated batch as m0; with ``--fixed-batch`` it trains at
  the trace's batch (Pollux's "tuned" configuration), declared as m0, and
  follows the daemon's plan when it restarts;
* the initial size is the trace's GPU request, rounded down to a legal shape
  (within one node, or whole nodes) and capped at M;
* the emulator's arguments: model, speedup, batch (and ``--adaptive-batch``).

Every submission is appended as one JSON line to ``--log`` (trace name, job id,
the time it was submitted, its recipe), which the demo reads to compute JCTs.
It submits through the same request builder as `malleable submit`
(`malleable.submit.malleable_request`), via the Slurm port. Exit codes: 0 all
submitted, 1 Slurm refused or did not answer, 2 bad input.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from malleable.clitypes import FiniteFloat, one_line
from malleable.config import ConfigError, load_config
from malleable.sim.profiles import MODELS, load_profile
from malleable.sim.traces import TraceError, TraceJob, load_pollux_workload
from malleable.slurm.client import SlurmClient, SlurmError
from malleable.spec import MalleableSpec, SpecError, format_spec

# The emulated job's batch script, relative to the malleable checkout.
DEFAULT_SCRIPT = "examples/emulated_job.sbatch"


@dataclass(frozen=True)
class ReplayJob:
    """One trace job as a malleable job.

    Attributes:
        name: the trace job's name.
        arrival_s: its arrival in the trace, seconds (uncompressed).
        model: the profiled model it emulates.
        spec: its malleable spec.
        initial_gpus: GPUs it is submitted with.
        batch: its initial global batch size (the trace's; with ``adaptive_batch``
            only a record of it: the job picks its own).
        adaptive_batch: the job tunes its batch size itself (AdaptDL-style).
    """

    name: str
    arrival_s: float
    model: str
    spec: MalleableSpec
    initial_gpus: int
    batch: int
    adaptive_batch: bool = False


def legal_gpus(k: int, gpus_per_node: int, cap: int) -> int:
    """The largest count <= min(k, cap) that fits in one node or is whole nodes (>= 1)."""
    k = max(1, min(int(k), int(cap)))
    if k <= gpus_per_node:
        return k
    return max(gpus_per_node, (k // gpus_per_node) * gpus_per_node)


def recipe(t: TraceJob, *, gpus_per_node: int, max_gpus: int, grace_s: float = 60.0,
           signal: str = "USR1", adaptive_batch: bool = True) -> ReplayJob:
    """The malleable job for trace job ``t`` (see the module docstring).

    ``adaptive_batch`` (default): the job tunes its batch size as AdaptDL does and
    declares the model's smallest validated batch as m0; otherwise it trains at the
    trace's batch, declared as m0.

    Raises:
        ValueError: a trace job without a profiled model (only those can be emulated).
    """
    if t.model not in MODELS:
        raise ValueError(f"trace job {t.name}: model {t.model!r} has no profile "
                         f"(known: {', '.join(MODELS)})")
    p = load_profile(t.model)
    cap = max(1, int(max_gpus))
    k = legal_gpus(t.gpus, gpus_per_node, cap)
    batch = int(t.batch_size) if t.batch_size else int(p.default_batch(k))
    m0 = int(p.init_batch_size) if adaptive_batch else batch
    # The per-GPU memory limit, unless m0 cannot fit under it on the size the job is
    # submitted with (then it accumulates gradients, as Pollux's jobs do; declared, the
    # limit would make that size one the job cannot start on).
    local = int(p.max_local_bsz) if math.ceil(m0 / k) <= p.max_local_bsz else None
    spec = MalleableSpec(
        min_gpus=1, max_gpus=cap, signal=signal, grace_s=grace_s, shrink_inplace=False,
        batch_size=m0, max_batch_size=max(m0, int(p.max_batch_size)),
        max_local_batch_size=local, model=t.model)
    return ReplayJob(t.name, float(t.arrival_s), t.model, spec, k, batch, adaptive_batch)


def select(jobs: Sequence[TraceJob], *, limit: int | None = None, every: int = 1,
           models: Sequence[str] | None = None, until_s: float | None = None
           ) -> list[TraceJob]:
    """A subset of a trace, in arrival order: every ``every``-th job of the given
    ``models`` arriving before ``until_s``, at most ``limit`` of them."""
    out = [j for j in sorted(jobs, key=lambda j: (j.arrival_s, j.name))
           if (models is None or j.model in models)
           and (until_s is None or j.arrival_s < until_s)]
    out = out[::max(1, every)]
    return out[:limit] if limit is not None else out


def replay(client: SlurmClient, jobs: Sequence[ReplayJob], *, script: str, speedup: float,
           spool_dir: str, gpus_per_node: int, log_path: str | None = None, workdir: str = "",
           extra_env: Sequence[tuple[str, str]] = (), clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep,
           on_submit: Callable[[dict], None] | None = None) -> list[dict]:
    """Submit ``jobs`` at their compressed arrival times; returns the log records.

    Args:
        client: the Slurm port.
        jobs: the recipes, in arrival order.
        script: the batch script (the emulated job's sbatch script).
        speedup: time compression: a trace second lasts 1/speedup real seconds.
        spool_dir: the daemon's progress spool (MALLEABLE_SPOOL for the jobs).
        gpus_per_node: g, to shape the initial request.
        log_path: append one JSON line per submission here (None: no file).
        extra_env: more environment for every job (e.g. MALLEABLE_PYTHON).
        workdir: the jobs' working directory (outputs, checkpoints); "" = the caller's.
        clock, sleep: time sources (for tests).
        on_submit: called with each log record (e.g. a progress display).

    Raises:
        SlurmError: Slurm refused a submission or did not answer.
    """
    from malleable.submit import malleable_request

    start = clock()
    origin = jobs[0].arrival_s if jobs else 0.0
    out = []
    for rj in jobs:
        due = start + (rj.arrival_s - origin) / speedup
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        args = f"--model {rj.model} --speedup {speedup:g} --batch {rj.batch}"
        env = [*extra_env,
               ("JOB_ARGS", args + (" --adaptive-batch" if rj.adaptive_batch else ""))]
        request = malleable_request(script, rj.spec, initial_gpus=rj.initial_gpus,
                                    gpus_per_node=gpus_per_node, spool_dir=spool_dir,
                                    name=f"{rj.name}", extra_env=env, workdir=workdir)
        job_id = client.submit(request)
        rec = {"name": rj.name, "job_id": job_id, "submitted_at": clock(),
               "trace_arrival_s": rj.arrival_s, "model": rj.model,
               "initial_gpus": rj.initial_gpus, "batch": rj.batch,
               "adaptive_batch": rj.adaptive_batch,
               "spec": format_spec(rj.spec), "speedup": speedup}
        out.append(rec)
        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
        if on_submit:
            on_submit(rec)
    return out


def load_replay_log(path: str | os.PathLike) -> list[dict]:
    """The records `replay` wrote (one JSON object per line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def recipes_as_dicts(jobs: Sequence[ReplayJob]) -> list[dict]:
    """JSON-friendly recipes (spec as its comment text)."""
    return [{**{k: v for k, v in asdict(j).items() if k != "spec"}, "spec": format_spec(j.spec)}
            for j in jobs]


def _fail(message: str, code: int) -> None:
    click.echo(f"malleable replay: error: {one_line(message)}", err=True)
    raise click.exceptions.Exit(code)


@click.command("replay")
@click.option("--workload", required=True, metavar="PATH",
              help="A Pollux workload CSV (name,time,application,num_replicas,batch_size).")
@click.option("--speedup", type=FiniteFloat(min=1.0, max=1e6), default=30.0,
              show_default=True,
              help="Time compression: arrivals and the emulated step times divide by it.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N jobs.")
@click.option("--every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Take every K-th job (thins the load for a smaller cluster).")
@click.option("--models", default=None, metavar="M[,M...]",
              help=f"Only jobs of these models ({', '.join(MODELS)}).")
@click.option("--until", "until_s", type=FiniteFloat(min=0.0), default=None,
              metavar="SECONDS", help="Only jobs arriving before this trace time.")
@click.option("--script", default=DEFAULT_SCRIPT, show_default=True,
              help="The emulated job's batch script.")
@click.option("--max-gpus", type=click.IntRange(min=1), default=None,
              help="Largest size a job may get (default: the cluster's GPUs).")
@click.option("--grace", "grace_s", type=FiniteFloat(min=0.0), default=60.0,
              show_default=True, help="Seconds a job has to checkpoint after the signal.")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node (default: ask the cluster; give it and --nodes for an "
                   "offline --dry-run).")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=None,
              help="Nodes in the cluster (default: ask the cluster).")
@click.option("--log", "log_path", default=None, metavar="PATH",
              help="Append one JSON line per submitted job.")
@click.option("--config", "config_path", default=None, metavar="PATH",
              help="malleable.toml, for the progress spool and Slurm settings (default "
                   "$MALLEABLE_CONFIG or /etc/malleable/malleable.toml).")
@click.option("--adaptive-batch/--fixed-batch", default=True, show_default=True,
              help="Jobs tune their batch size themselves (AdaptDL-style), or train at the "
                   "trace's batch size.")
@click.option("--dry-run", is_flag=True, help="Print the recipes as JSON; submit nothing.")
def replay_command(workload, speedup, limit, every, models, until_s, script, max_gpus, grace_s,
                   gpus_per_node, nodes, log_path, config_path, adaptive_batch, dry_run) -> None:
    """Submit a trace's jobs to Slurm at their (compressed) arrival times.

    Each job is a malleable emulated job following its model's measured profile;
    the daemon then decides their sizes. Use on any cluster with malleable's
    progress spool configured.
    """
    from malleable.slurm import connect

    try:
        trace = load_pollux_workload(workload)
        config = load_config(config_path)
    except (TraceError, ConfigError) as exc:
        _fail(str(exc), 2)
    wanted = None
    if models:
        wanted = [m.strip() for m in models.split(",") if m.strip()]
        unknown = sorted(set(wanted) - set(MODELS))
        if unknown:
            _fail(f"--models {models}: unknown model {unknown[0]!r} (known: "
                  f"{', '.join(MODELS)})", 2)
    if not trace:
        _fail(f"--workload {workload}: no job to replay (the trace has none)", 2)
    problem = None
    if os.path.isdir(script):
        problem = f"--script {script}: a directory, not a batch script"
    elif not os.path.isfile(script):
        hint = (" (the default is relative to the current directory: run from the malleable "
                "checkout, or give --script PATH)" if script == DEFAULT_SCRIPT else "")
        problem = f"--script {script}: no such file{hint}"
    if problem and dry_run:   # nothing is submitted: the real replay would need it
        click.echo(f"malleable replay: warning: {problem}; a replay that submits needs it",
                   err=True)
    elif problem:
        _fail(problem, 2)
    if dry_run and (gpus_per_node is None) != (nodes is None):
        given, missing = (("--gpus-per-node", "--nodes") if nodes is None
                          else ("--nodes", "--gpus-per-node"))
        _fail(f"{given} without {missing}: an offline --dry-run needs both (or neither, to "
              f"ask the cluster)", 2)
    chosen = select(trace, limit=limit, every=every, models=wanted, until_s=until_s)
    client = None
    if gpus_per_node is None or nodes is None or not dry_run:
        try:
            client = connect(config.slurm)
            info = client.cluster()
        except SlurmError as exc:
            _fail(str(exc) + ("; without a cluster, give --nodes and --gpus-per-node for an "
                              "offline --dry-run" if dry_run else ""), 1)
        gpus_per_node = gpus_per_node or info.gpus_per_node
        nodes = nodes or info.nodes
    g = max(1, gpus_per_node)
    total = g * max(1, nodes)
    cap = max_gpus or total
    if cap > total:
        click.echo(f"malleable replay: note: --max-gpus {cap} is above the cluster's {total} "
                   f"GPUs ({nodes} node(s) x {g}): no job gets more than {total}", err=True)
    try:
        recipes = [recipe(t, gpus_per_node=g, max_gpus=cap, grace_s=grace_s,
                          adaptive_batch=adaptive_batch) for t in chosen]
    except SpecError as exc:   # e.g. --grace above 7 days, --max-gpus above 2**63 - 1
        opt = {"grace": "--grace", "gpus": "--max-gpus"}.get(exc.field, exc.field)
        _fail(f"{opt}: {exc}", 2)
    if dry_run:
        click.echo(json.dumps(recipes_as_dicts(recipes), indent=2))
        return
    click.echo(f"replaying {len(recipes)} jobs of {workload} at {speedup:g}x "
               f"({(recipes[-1].arrival_s - recipes[0].arrival_s) / speedup:.0f} s of arrivals)"
               if recipes else "nothing to replay", err=True)
    try:
        replay(client, recipes, script=os.path.abspath(script), speedup=speedup,
               spool_dir=config.progress.spool_dir, gpus_per_node=g, log_path=log_path,
               on_submit=lambda r: click.echo(f"{r['job_id']} {r['name']}"))
    except SlurmError as exc:
        _fail(str(exc), 1)
