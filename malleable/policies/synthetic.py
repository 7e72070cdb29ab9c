"""Synthetic speedup tables and job sets with known curves and known work.

For tests, benchmarks and examples: a `SpeedupTable` built from a per-job
speedup curve (k^p, or Amdahl's law) and a one-GPU rate, so that the truth
is known exactly. The production table comes from the estimators.
"""

from __future__ import annotations

import numpy as np

from malleable.estimators.table import SpeedupTable, candidate_grid, feasible_mask
from malleable.policies.base import Capacity, JobSet
from malleable.policies.feasibility import Grid, Packer, order_from_keys, realize


def power_law(k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(J, K) speedup k^p (0 at k = 0); p: (J,) exponents in (0, 1].

    Source: the heSRPT speedup model (Berg et al., SIGMETRICS'20).
    """
    k = np.asarray(k, dtype=np.float64)[None, :]
    p = np.asarray(p, dtype=np.float64)[:, None]
    return np.where(k > 0, np.power(np.maximum(k, 1e-300), p), 0.0)


def amdahl(k: np.ndarray, serial: np.ndarray) -> np.ndarray:
    """(J, K) speedup 1 / (f + (1 - f) / k) (0 at k = 0); serial: (J,) fractions f in [0, 1].

    Source: Amdahl, AFIPS 1967.
    """
    k = np.asarray(k, dtype=np.float64)[None, :]
    f = np.asarray(serial, dtype=np.float64)[:, None]
    with np.errstate(divide="ignore"):
        s = 1.0 / (f + (1.0 - f) / np.where(k > 0, k, 1.0))
    return np.where(k > 0, s, 0.0)


def table_from_speedup(k: np.ndarray, speedup: np.ndarray, rate1: np.ndarray,
                       remaining_work: np.ndarray, min_gpus: np.ndarray, max_gpus: np.ndarray,
                       step: np.ndarray, gpus_per_node: int, *,
                       remaining_std: np.ndarray | None = None,
                       batch_per_gpu: int = 32) -> SpeedupTable:
    """A `SpeedupTable` with goodput = rate1 x speedup(k).

    Args:
        k: (K,) grid, k[0] == 0.
        speedup: (J, K) speedup over one GPU (0 at k = 0).
        rate1: (J,) goodput at one GPU, work units per second (> 0).
        remaining_work: (J,) work left, work units.
        min_gpus, max_gpus, step, gpus_per_node: the spec, for the feasible mask.
        remaining_std: (J,) standard deviation of the remaining work (default 0).
        batch_per_gpu: the batch size recommended per GPU (batch = k x this).

    Returns:
        The table (batch sizes k x batch_per_gpu, from_prior all False).
    """
    k = np.asarray(k, dtype=np.int64)
    J = len(rate1)
    goodput = np.asarray(rate1, dtype=np.float64)[:, None] * np.asarray(speedup, dtype=np.float64)
    return SpeedupTable(
        k=k, feasible=feasible_mask(k, min_gpus, max_gpus, step, gpus_per_node),
        goodput=goodput, batch=np.broadcast_to(k[None, :] * batch_per_gpu, (J, len(k))).copy(),
        remaining_work=np.asarray(remaining_work, dtype=np.float64),
        remaining_std=(np.zeros(J) if remaining_std is None
                       else np.asarray(remaining_std, dtype=np.float64)))


def make_jobset(capacity: Capacity, speedup_fn, params: np.ndarray, rate1: np.ndarray,
                remaining_work: np.ndarray, *, min_gpus=None, max_gpus=None, step=None,
                current=None, attained=None, age=None, restart_cost=None, since_change=None,
                weight=None, requested=None, restarts=None, remaining_std=None,
                ids=None) -> JobSet:
    """A `JobSet` on the capacity's candidate grid with a known speedup curve.

    Args:
        capacity: sets g and the grid's top (total free GPUs).
        speedup_fn: `power_law` or `amdahl` (called as speedup_fn(k, params)).
        params: (J,) the curve parameter per job (p, or the serial fraction).
        rate1, remaining_work: (J,) as in `table_from_speedup`.
        Other fields: as in `JobSet`; defaults are min 1, max = all GPUs, step 1,
        nothing running, zero attained service and age, restart cost 30 s,
        never changed.
    """
    J = len(rate1)
    total = capacity.total
    min_gpus = np.ones(J, np.int64) if min_gpus is None else np.asarray(min_gpus, np.int64)
    max_gpus = (np.full(J, max(total, 1), np.int64) if max_gpus is None
                else np.asarray(max_gpus, np.int64))
    step = np.ones(J, np.int64) if step is None else np.asarray(step, np.int64)
    k = candidate_grid(max_gpus, capacity.gpus_per_node, total)
    if len(k) == 1:  # no GPUs at all: keep a grid with one count so goodput is defined
        k = np.array([0, 1], dtype=np.int64)
    table = table_from_speedup(k, speedup_fn(k, params), rate1, remaining_work, min_gpus,
                               max_gpus, step, capacity.gpus_per_node,
                               remaining_std=remaining_std)
    z = np.zeros(J)
    return JobSet(
        ids=np.array([str(i) for i in range(J)] if ids is None else ids, dtype=object),
        min_gpus=min_gpus, max_gpus=max_gpus, step=step,
        current=np.zeros(J, np.int64) if current is None else current, table=table,
        attained=z if attained is None else attained, age=z if age is None else age,
        restart_cost=np.full(J, 30.0) if restart_cost is None else restart_cost,
        since_change=np.full(J, np.inf) if since_change is None else since_change,
        weight=weight, requested=requested, restarts=restarts)


def random_instance(rng: np.random.Generator, num_jobs: int, nodes: int, gpus_per_node: int, *,
                    partial: bool = True, running: bool = True,
                    max_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                    ) -> tuple[JobSet, Capacity]:
    """A random but realistic instance: Amdahl or k^p curves, heavy-tailed work.

    Jobs: min 1..4 (or a whole node), max from ``max_choices`` (at least min),
    step 1 or 2 (or g); one-GPU rate 1..100 work units/s; remaining work
    log-normal (median 1 GPU-hour of work); attained service and age up to a
    day; restart cost 10..120 s. Capacity: ``nodes`` nodes, a few partially
    taken by rigid jobs if ``partial``. If ``running``, about half the jobs
    hold a feasible, packed allocation as ``current`` (made by placing random
    sizes with the `Packer`).
    """
    g = gpus_per_node
    free = np.full(nodes, g, dtype=np.int64)
    if partial and nodes:
        taken = rng.random(nodes) < 0.25
        free[taken] = rng.integers(0, g + 1, size=int(taken.sum()))
    cap = Capacity(g, free)
    J = num_jobs
    min_gpus = rng.choice([1, 1, 1, 2, 4], size=J)
    whole = rng.random(J) < 0.1
    min_gpus = np.where(whole, g, min_gpus)
    max_gpus = np.maximum(rng.choice(np.asarray(max_choices), size=J), min_gpus)
    step = np.where(rng.random(J) < 0.7, 1, np.where(rng.random(J) < 0.5, 2, g))
    curve = rng.random(J) < 0.5
    p = rng.uniform(0.3, 0.98, size=J)
    f = rng.uniform(0.0, 0.2, size=J)
    rate1 = rng.uniform(1.0, 100.0, size=J)
    work = rate1 * 3600.0 * rng.lognormal(0.0, 1.5, size=J)
    attained = rng.uniform(0, 86400.0, size=J) * (rng.random(J) < 0.7)
    age = attained / np.maximum(max_gpus, 1) + rng.uniform(0, 86400.0, size=J)
    jobs = make_jobset(cap, power_law, p, rate1, work, min_gpus=min_gpus, max_gpus=max_gpus,
                       step=step, attained=attained, age=age,
                       restart_cost=rng.uniform(10, 120, size=J),
                       since_change=np.where(rng.random(J) < 0.2, np.inf,
                                             rng.uniform(0, 3600, size=J)),
                       remaining_std=work * rng.uniform(0, 0.5, size=J))
    # Mix the two curve families: rebuild goodput for the Amdahl jobs.
    k = jobs.table.k
    sp = np.where(curve[:, None], power_law(k, p), amdahl(k, f))
    table = table_from_speedup(k, sp, rate1, work, min_gpus, max_gpus, step, g,
                               remaining_std=jobs.table.remaining_std)
    current = np.zeros(J, dtype=np.int64)
    if running and J:
        base = JobSet(ids=jobs.ids, min_gpus=min_gpus, max_gpus=max_gpus, step=step,
                      current=current, table=table, attained=attained, age=age,
                      restart_cost=jobs.restart_cost, since_change=jobs.since_change)
        wish = np.where(rng.random(J) < 0.5, rng.uniform(0, 1, size=J) * max_gpus, 0.0)
        order = order_from_keys(rng.random(J))
        current = realize(base, cap, wish, order, grid=Grid.build(base, cap),
                          packer=Packer(g, free), hamilton=False)
    return JobSet(ids=jobs.ids, min_gpus=min_gpus, max_gpus=max_gpus, step=step,
                  current=current, table=table, attained=attained, age=age,
                  restart_cost=jobs.restart_cost, since_change=jobs.since_change,
                  restarts=rng.integers(0, 3, size=J)), cap
