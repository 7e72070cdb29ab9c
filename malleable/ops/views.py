"""Numbers the admin commands derive from the state store, shared by ``status`` and ``job show``.

* `recent_throughput`: samples per second over a job's latest progress lines
  of its current run (a checkpoint-requeue starts a new run; an interval never
  spans one, as in the estimators).
* `goodput_curve`: the fitted goodput at each GPU count, evaluated from the
  parameters the daemon stored with its latest estimate (`Estimate.params`:
  the Pollux throughput vector ``u``, the noise scale ``phi`` and ``m0``) by
  the estimators' own function (`malleable.estimators.efficiency.optimal_batch`,
  Pollux's GOODPUT = X * E at the goodput-optimal batch size).
* `remaining_time`: remaining work over the goodput at a GPU count.
* `resolve_gpus_per_node`: g, which the store does not record: from
  ``--gpus-per-node``, slurm.conf's GPU inventory, or the jobs in the store.

Pure functions over rows and numbers, except the g lookups (store, slurm.conf).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from malleable.db.models import Job
from malleable.estimators.efficiency import optimal_batch
from malleable.estimators.params import NUM_PARAMS, EstimateFlags, EstimatorConfig
from malleable.estimators.pipeline import nodes_for, optimistic_cross_node
from malleable.estimators.table import candidate_grid, feasible_mask
from malleable.ops.output import BadInput

RECENT_SAMPLES = 10
"""Progress lines of the current run that `recent_throughput` looks at."""
# The daemon's estimators run with the default settings: the cap its speedup table applies.
_CROSS_NODE_OPTIMISM = EstimatorConfig().cross_node_optimism


@dataclass(frozen=True)
class Throughput:
    """Training samples per second over an interval of a job's progress lines.

    Attributes:
        samples_per_s: samples processed per second of wall time.
        window_s: length of the interval, seconds.
        lines: progress lines in it (>= 2).
        restart: the run (Slurm restart count) the lines belong to.
        gpus: GPUs the job ran on at the last line.
    """

    samples_per_s: float
    window_s: float
    lines: int
    restart: int | None
    gpus: int


def recent_throughput(rows: Sequence[Any], last: int = RECENT_SAMPLES) -> Throughput | None:
    """Throughput over the latest progress lines of the job's latest run.

    Args:
        rows: a job's progress samples, oldest first, with attributes ``time``
            (aware datetime), ``samples``, ``gpus`` and ``restart``
            (`malleable.db.store.latest_samples` rows).
        last: at most this many of the latest lines are used.

    Returns:
        `Throughput`, or None with fewer than two lines in the latest run or no
        time between them.
    """
    if not rows:
        return None
    run = rows[-1].restart
    same = [r for r in rows if r.restart == run][-last:]
    if len(same) < 2:
        return None
    dt = (same[-1].time - same[0].time).total_seconds()
    if dt <= 0:
        return None
    rate = (same[-1].samples - same[0].samples) / dt
    if rate < 0 or not math.isfinite(rate):
        return None
    return Throughput(rate, dt, len(same), run, int(same[-1].gpus))


@dataclass(frozen=True)
class GoodputCurve:
    """A job's fitted goodput over GPU counts (from one stored estimate).

    Attributes:
        gpus: (K,) the GPU counts the job may run on (its spec and node granularity).
        nodes: (K,) nodes at each count (1 if k <= g, else k/g).
        goodput: (K,) expected useful progress per second at each count, samples at
            the initial batch size m0 per second.
        batch: (K,) the goodput-optimal global batch size at each count.
        goodput_1: goodput at 1 GPU (the model's value, feasible or not), for speedup.
        gpus_per_node: g used for the node counts.
    """

    gpus: np.ndarray
    nodes: np.ndarray
    goodput: np.ndarray
    batch: np.ndarray
    goodput_1: float
    gpus_per_node: int

    @property
    def speedup(self) -> np.ndarray:
        """(K,) goodput relative to one GPU, s(k) = goodput(k) / goodput(1) (NaN if unknown)."""
        if not (self.goodput_1 > 0):
            return np.full(self.goodput.shape, np.nan)
        return self.goodput / self.goodput_1

    def at(self, k: int) -> float | None:
        """Goodput at exactly ``k`` GPUs, or None if ``k`` is not a count of the curve."""
        hit = np.flatnonzero(self.gpus == k)
        return float(self.goodput[hit[0]]) if hit.size else None


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def goodput_curve(params: Mapping[str, Any] | None, spec: Mapping[str, Any] | None,
                  gpus_per_node: int, extra: Sequence[int] = (),
                  flags: int | None = None) -> GoodputCurve | None:
    """Goodput at every feasible GPU count of a job, from its stored estimate parameters.

    Args:
        params: `Estimate.params` as the daemon stores it (`malleable.daemon.estimates.
            estimate_params`): ``u`` (7 numbers), ``phi``, ``m0``.
        spec: the job's parsed spec (``min_gpus``, ``max_gpus``, ``step``,
            ``max_batch_size``, ``max_local_batch_size``).
        gpus_per_node: g >= 1.
        extra: further counts to evaluate even if infeasible (e.g. a target).
        flags: the estimate's `EstimateFlags` bits (``Estimate.flags["bits"]``): a job
            that never ran across nodes has its cross-node synchronisation capped as
            in the daemon's speedup table (`optimistic_cross_node`); None: not capped.

    Returns:
        `GoodputCurve`, or None when the parameters or the spec are unusable
        (no ``u`` of 7 finite numbers, no m0 > 0, no GPU range).

    Source: goodput = X(k, n, m) * E(m) at the goodput-optimal batch m (Qiao et
    al., Pollux, OSDI'21, section 3), evaluated by `optimal_batch`.
    """
    if not params or not spec:
        return None
    u = params.get("u")
    if not isinstance(u, list) or len(u) != NUM_PARAMS:
        return None
    u_arr = np.array([_num(x) for x in u], dtype=np.float64)
    m0 = _num(params.get("m0"))
    try:
        lo, hi, step = int(spec["min_gpus"]), int(spec["max_gpus"]), int(spec.get("step") or 1)
    except (KeyError, TypeError, ValueError):
        return None
    if not (np.all(np.isfinite(u_arr)) and m0 > 0 and 1 <= lo <= hi and step >= 1):
        return None
    g = max(int(gpus_per_node), 1)
    grid = candidate_grid(np.array([hi]), g, hi)
    ok = feasible_mask(grid, np.array([lo]), np.array([hi]), np.array([step]), g)[0]
    ks = sorted(set(int(k) for k in grid[ok & (grid > 0)]) | {int(k) for k in extra if k > 0})
    ks_eval = np.array([1, *ks], dtype=np.int64)
    phi = _num(params.get("phi"))
    mb = _num(spec.get("max_batch_size"))
    ml = _num(spec.get("max_local_batch_size"))
    if flags is not None:
        u_arr = optimistic_cross_node(u_arr[None, :], np.array([int(flags)]),
                                      _CROSS_NODE_OPTIMISM)[0]
    gp, batch, _ = optimal_batch(
        u_arr[None, :], ks_eval, nodes_for(ks_eval, g),
        np.array([m0]), np.array([mb if math.isfinite(mb) and mb >= m0 else m0]),
        np.array([ml if math.isfinite(ml) and ml > 0 else np.inf]), np.array([phi]))
    k_arr = np.array(ks, dtype=np.int64)
    return GoodputCurve(gpus=k_arr, nodes=nodes_for(k_arr, g), goodput=gp[0, 1:],
                        batch=batch[0, 1:], goodput_1=float(gp[0, 0]), gpus_per_node=g)


def estimate_bits(est: Any) -> int | None:
    """The `EstimateFlags` bits of a stored estimate (``Estimate.flags["bits"]``), or None
    (no estimate, or flags not stored as the daemon stores them)."""
    flags = getattr(est, "flags", None)
    bits = flags.get("bits") if isinstance(flags, Mapping) else None
    return int(bits) if isinstance(bits, int) and not isinstance(bits, bool) else None


def remaining_time(remaining_work: float | None, goodput: float | None) -> float | None:
    """Seconds to finish ``remaining_work`` (samples at m0) at ``goodput`` (samples at m0/s).

    None when either is unknown or the goodput is not positive.
    """
    if remaining_work is None or goodput is None:
        return None
    if not (goodput > 0 and math.isfinite(goodput) and math.isfinite(remaining_work)):
        return None
    return max(0.0, remaining_work) / goodput


UNPLANNED_START_S = 300 * 86400.0
"""A pending job's expected start this far ahead (s) is no estimate: Slurm's backfill
puts a start it cannot plan (e.g. the running jobs have no time limit) a year ahead."""


def queue_wait(state: str | None, start_time: datetime | None, now: datetime,
               held: bool = False) -> float | None:
    """Seconds a PENDING job still waits to start, by Slurm's expected start time.

    Args:
        state: the job's Slurm state name.
        start_time: its ``start_time`` (for a PENDING job, Slurm's estimate; aware UTC).
        now: the time to measure from (aware UTC).
        held: the job is held (its start time is then when it became eligible, not an
            expected start).

    Returns:
        ``max(0, start_time - now)`` in seconds for a PENDING job with an expected start;
        None for any other job, a held one, or a PENDING one Slurm gave no expected
        start (none, or its a-year-ahead placeholder, `UNPLANNED_START_S`).
    """
    if state != "PENDING" or start_time is None or held:
        return None
    wait = (start_time - now).total_seconds()
    return None if wait >= UNPLANNED_START_S else max(0.0, wait)


def eta_with_wait(run_s: float | None, wait_s: float | None) -> float | None:
    """A job's ETA in seconds: its queue wait (`queue_wait`, None = none known) plus
    its remaining run time (`remaining_time`; None = unknown, and then so is the ETA)."""
    if run_s is None:
        return None
    return run_s + (wait_s or 0.0)


REMAINING_BASES = {EstimateFlags.REMAINING_EXACT: "target",
                   EstimateFlags.REMAINING_CURVE: "curve",
                   EstimateFlags.REMAINING_HISTORY: "history",
                   EstimateFlags.REMAINING_DEFAULT: "default"}
"""What an estimate's remaining work rests on, by its flag: a declared steps, samples or
epochs ``target``; the learning ``curve`` towards a target metric; finished jobs' sizes
(``history``: no target, so it grows while the job runs, as a heavy-tailed size's
residual does); or the ``default`` (no target, curve or history)."""


def remaining_basis(bits: int | None) -> str | None:
    """``target``, ``curve``, ``history`` or ``default`` (`REMAINING_BASES`) for an
    estimate's flag bits; None without an estimate or flags."""
    if not bits:
        return None
    return next((name for f, name in REMAINING_BASES.items() if int(bits) & f.value), None)


def goodput_basis(bits: int | None) -> str | None:
    """What an estimate's goodput rests on, by its flag bits: ``fit`` (the job's own
    throughput), ``finished_jobs`` (no usable throughput yet: the prior from finished
    jobs like it: same model, else same name and user) or ``default`` (no usable
    throughput and no such prior: the cluster's default, a guess); None without an
    estimate or flags."""
    if not bits:
        return None
    if not int(bits) & (EstimateFlags.NO_SAMPLES | EstimateFlags.FIT_FAILED):
        return "fit"
    return "finished_jobs" if int(bits) & EstimateFlags.PRIOR_SUPPLIED else "default"


def flag_names(bits: int | None) -> list[str]:
    """The names of the `EstimateFlags` set in ``bits`` (lower case), in bit order."""
    if not bits:
        return []
    return [f.name.lower() for f in EstimateFlags if f.value and int(bits) & f.value]


def infer_gpus_per_node(s: Session) -> int:
    """g as the store shows it: the GPUs per node of a multi-node job if any job ever
    spanned nodes (exact), else the largest GPUs per node of any job (a lower bound); 1 if
    no job had GPUs."""
    multi = s.scalar(select(func.max(Job.gpus_per_node)).where(Job.nodes > 1))
    if multi and multi > 0:
        return int(multi)
    g = s.scalar(select(func.max(Job.gpus_per_node)))
    return int(g) if g and g > 0 else 1


def slurm_conf_gpus_per_node(path: str | None = None) -> int | None:
    """g from slurm.conf's GPU inventory, by the daemon's rule (the most common GPU count
    among nodes with GPUs, `malleable.daemon.inputs.cluster_gpus_per_node`); None when
    slurm.conf cannot be read or declares no GPUs. Reads files only (no Slurm RPC).

    Args:
        path: slurm.conf; default ``$SLURM_CONF`` or /etc/slurm/slurm.conf.

    Raises:
        BadInput: a node's ``Gres=`` cannot be read (a count that is not a number, or
            past 2**63 - 1): the message names the file, the line and the value, and
            ``--gpus-per-node`` (which skips slurm.conf).
    """
    from malleable.slurm_conf.inventory import build_inventory
    from malleable.slurm_conf.parser import parse_slurm_conf
    from malleable.slurm_conf.report import default_slurm_conf

    conf = parse_slurm_conf(path or default_slurm_conf())
    if not conf.readable:
        return None
    inventory, _ = build_inventory(conf, None)
    bad = next((n for n in inventory.nodes if n.gres_error), None)
    if bad is not None:
        # g from the other nodes could be wrong: say so rather than guess.
        raise BadInput(f"{bad.location}: node {bad.name}: {bad.gres_error}; fix the line "
                       f"(`malleable conf check` checks the file), or give --gpus-per-node G")
    counts = Counter(n.gpus for n in inventory.nodes if n.gpus > 0)
    return counts.most_common(1)[0][0] if counts else None


def resolve_gpus_per_node(s: Session, option: int | None) -> tuple[int, str]:
    """g for the goodput curve and where it came from: ``--gpus-per-node`` ("option"),
    slurm.conf's inventory ("slurm.conf"), else the store ("store", `infer_gpus_per_node`)."""
    if option:
        return int(option), "option"
    g = slurm_conf_gpus_per_node()
    if g:
        return g, "slurm.conf"
    return infer_gpus_per_node(s), "store"
