"""Validate the estimators on Pollux's measured T4 profiles (real data).

Regenerates benchmarks/results/estimators_validation.md:

    .venv/bin/python benchmarks/estimators_validation.py [--data-dir DIR] [--out FILE]

1. Throughput. For each model, a job is shown what it would see on 1, 2 and
   4 GPUs inside one node (placements "1", "2", "4", every per-GPU batch of
   the profile), as progress samples 60 s apart, and the production path
   (`update` + `estimate`) fits its Pollux model. Its throughput is then
   predicted at every measured configuration with 8, 16 or 32 GPUs in total
   (`tested_rows`: every such placement of placements.csv whatever its
   spread, and every such scalability.csv row on its number of nodes), at
   every per-GPU batch measured there, each at its own (k, n), and compared
   with the measurement: mean absolute percentage error (MAPE) of samples/s.
   Three ways to fill in what single-node samples cannot show (the cost of
   synchronising across nodes):

   * cluster default: `ClusterDefault` calibrated on the *other five* models
     (leave-one-model-out), as a cluster with history of other models has;
   * finished-job prior: a finished job of the same model that ran on every
     multi-node configuration whose GPU count is not 8, 16 or 32
     (`prior_rows`), its fit turned into a prior with `prior_from_finished`;
     `assert_disjoint` checks that it shares no configuration with the test;
   * in-sample floor: the model fitted to the tested measurements themselves
     (how well the model family can describe them at all).

   A secondary table scores the same fits on the whole-node configurations
   only (44, 4444, 8 nodes x 4), the first version's test set, and a third
   shows how placement 44 differs from the other 8-GPU placements.

2. Learning curves. For each model and each validation-<batch>.csv, the
   first 30 % of the epochs' (progress, metric) points are given to the
   learning-curve estimator with the final epoch's metric as the target; the
   predicted progress at the target is converted to an epoch with the file's
   progress column (the job's progress rate; not the metric) and compared
   with the first epoch whose best-so-far metric reaches the target.

Data: Pollux (Qiao et al., OSDI'21) artifact, petuum/adaptdl branch
osdi21-artifact, simulator/traces/<model>/ (Apache-2.0); see
/work/shared/data/README.md section 4.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from malleable.estimators import (
    ClusterDefault,
    EstimatorConfig,
    EstimatorState,
    JobSpecs,
    ProgressBatch,
    ThroughputParams,
    estimate,
    prior_from_finished,
    update,
)
from malleable.estimators.learning_curve import CurveStats, add_points, predict_target
from malleable.estimators.throughput import fit_throughput, log_iteration_time, throughput

REPO = Path(__file__).resolve().parents[1]
VENDORED = REPO / "malleable" / "sim" / "data" / "pollux" / "profiles"
SHARED = Path("/work/shared/data/pollux/profiles")
MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
TRAIN_PLACEMENTS = ("1", "2", "4")
TEST_GPUS = (8, 16, 32)
WHOLE_NODE_PLACEMENTS = ("44", "4444")  # and 8 nodes x 4 from scalability.csv
INTERVAL_S = 60.0
SAMPLES_PER_CONFIG = 6


@dataclass
class Profile:
    name: str
    placement: np.ndarray   # (R,) str, "" for scalability rows
    k: np.ndarray           # GPUs
    n: np.ndarray           # nodes
    local: np.ndarray       # per-GPU batch
    step_time: np.ndarray   # s per iteration
    m0: int                 # smallest validated global batch
    curves: dict[int, dict[str, np.ndarray]]


def default_data_dir() -> Path:
    """The vendored profiles (malleable/sim/data/pollux/profiles) if present, else the shared copy."""
    return VENDORED if VENDORED.is_dir() else SHARED


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load(root: Path, name: str) -> Profile:
    """Read placements.csv, scalability.csv and validation-*.csv of one model."""
    rows = []
    for r in _read(root / name / "placements.csv"):
        p = r["placement"].strip()
        rows.append((p, sum(map(int, p)), len(p), float(r["local_bsz"]), float(r["step_time"])))
    for r in _read(root / name / "scalability.csv"):
        rows.append(("", int(r["num_replicas"]), int(r["num_nodes"]), float(r["local_bsz"]),
                     float(r["step_time"])))
    curves = {}
    for path in (root / name).glob("validation-*.csv"):
        bsz = int(path.stem.split("-")[1])
        data = _read(path)
        curves[bsz] = {c: np.array([float(d[c]) for d in data]) for c in data[0]}
    return Profile(name=name, placement=np.array([r[0] for r in rows]),
                   k=np.array([r[1] for r in rows], dtype=np.int64),
                   n=np.array([r[2] for r in rows], dtype=np.int64),
                   local=np.array([r[3] for r in rows]), step_time=np.array([r[4] for r in rows]),
                   m0=min(curves), curves=curves)


def job_batch(k: np.ndarray, n: np.ndarray, m: np.ndarray, step_time: np.ndarray) -> ProgressBatch:
    """The progress samples a job running these configurations in turn would log.

    A checkpoint-restart (120 s without progress) separates two
    configurations the estimator can tell apart; placements it sees as the
    same (k, n, m), e.g. 22 and 13, follow each other without one. (The
    progress samples carry no restart marker, so a restart at an unchanged
    (k, n, m) would enter the fit as one interval three times too slow: an
    artefact of the enumeration, not of the measurements.)
    """
    t, steps, samples = 0.0, 0.0, 0.0
    cols: dict[str, list[float]] = {c: [] for c in ("t", "step", "samples", "gpus", "nodes",
                                                    "batch")}
    prev = None
    for kk, nn, mm, st in zip(k, n, m, step_time, strict=True):
        if (kk, nn, mm) != prev:
            t += 120.0  # a checkpoint-restart between configurations
        prev = (kk, nn, mm)
        for _ in range(SAMPLES_PER_CONFIG):
            t += INTERVAL_S
            steps += INTERVAL_S / st
            samples += INTERVAL_S / st * mm
            for c, v in zip(cols, (t, steps, samples, kk, nn, mm), strict=True):
                cols[c].append(v)
    N = len(cols["t"])
    return ProgressBatch(job=np.zeros(N, dtype=np.int64), **{c: np.array(v) for c, v in
                                                              cols.items()})


def one_job_specs(m0: float) -> JobSpecs:
    one = np.ones(1, dtype=np.int64)
    return JobSpecs(min_gpus=one, max_gpus=one * 64, step=one, init_batch=np.array([float(m0)]))


def fit_job(prof: Profile, sel: np.ndarray, config: EstimatorConfig, prior=None,
            configs_per_cycle: int = 1):
    """Run the production path on the job's samples at the selected rows.

    The samples arrive as the daemon would see them: ``configs_per_cycle``
    configurations' worth of samples per cycle, each cycle warm-started."""
    order = np.lexsort((prof.local[sel], prof.k[sel]))
    k, n = prof.k[sel][order], prof.n[sel][order]
    m = prof.k[sel][order] * prof.local[sel][order]
    batch = job_batch(k, n, m, prof.step_time[sel][order])
    specs = one_job_specs(prof.m0)
    state = EstimatorState.empty(1, config)
    # As the daemon would: one cycle per configuration's samples, warm-started.
    est = None
    chunk = SAMPLES_PER_CONFIG * configs_per_cycle
    for lo in range(0, len(batch), chunk):
        part = ProgressBatch(**{f: getattr(batch, f)[lo:lo + chunk]
                                for f in ("job", "t", "step", "samples", "gpus", "nodes",
                                          "batch")})
        state = update(state, part, specs, config)
        est = estimate(state, specs, prior=prior, config=config)
        state = state.with_fit(est.u)
    return est


def full_fit(prof: Profile, sel: np.ndarray) -> np.ndarray:
    """Least-squares fit (weak prior) of u to the selected measurements, best of 3 starts."""
    K, N = prof.k[sel][None], prof.n[sel][None]
    M = (prof.k[sel] * prof.local[sel])[None].astype(float)
    Y = np.log(prof.step_time[sel])[None]
    best = None
    for g0 in (-2.0, 0.0, 2.0):
        u0 = np.log([[0.01, 0.001, 0.01, 0.001, 0.1, 0.01, 1.0]])
        u0[0, 6] = g0
        fit = fit_throughput(K, N, M, np.ones_like(M), Y, np.zeros(1), u0, np.full((1, 7), 10.0),
                             iterations=300)
        sse = float(np.sum((log_iteration_time(fit.u, K, N, M) - Y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, fit.u)
    return best[1]


def relative_params(u: np.ndarray, m0: float) -> dict[str, float]:
    """A model's parameters relative to tau = T_iter(1 GPU, m0), as `ClusterDefault` states them."""
    p = ThroughputParams.from_u(u[0])
    tau = float(np.exp(log_iteration_time(u, np.array([[1]]), np.array([[1]]),
                                          np.array([[m0]])))[0, 0])
    return {"compute_fixed": float(p.alpha_c) / tau, "sync_intra": float(p.alpha_r) / tau,
            "sync_intra_per_gpu": float(p.beta_r) / tau, "sync_inter": float(p.alpha_n) / tau,
            "sync_inter_per_gpu": float(p.beta_n) / tau, "gamma": float(p.gamma)}


def cluster_default_from(rel: list[dict[str, float]]) -> ClusterDefault:
    """Geometric means of relative parameters (gamma: mean), log-sd from their spread."""
    keys = ("compute_fixed", "sync_intra", "sync_intra_per_gpu", "sync_inter",
            "sync_inter_per_gpu")
    vals = {key: float(np.exp(np.mean(np.log([r[key] for r in rel])))) for key in keys}
    gamma = float(np.clip(np.mean([r["gamma"] for r in rel]), 1.05, 9.5))
    return ClusterDefault(**vals, gamma=gamma)


def train_rows(prof: Profile) -> np.ndarray:
    """(R,) bool: what the job is shown: one node, placements "1", "2", "4", every batch."""
    return np.isin(prof.placement, TRAIN_PLACEMENTS)


def tested_rows(prof: Profile) -> np.ndarray:
    """(R,) bool: every measured configuration with 8, 16 or 32 GPUs in total.

    Every placement of placements.csv with that many GPUs, whatever its spread
    over nodes (8 GPUs: 44, 2222, 224, 233, 134, 143, 1124, ...; 16: 4444), and
    every scalability.csv row with that many replicas on its number of nodes
    (8 on 6 or 8 nodes; 16 on 6, 8, 12 or 16; 32 on 8, 12 or 16), at every
    per-GPU batch measured there.
    """
    return np.isin(prof.k, TEST_GPUS)


def prior_rows(prof: Profile) -> np.ndarray:
    """(R,) bool: the runs of the finished job whose fit becomes the prior.

    Every multi-node configuration whose total GPU count is not 8, 16 or 32:
    the placements of placements.csv on 2 to 4 nodes with 2 to 7 or 9 to 15
    GPUs (11, 22, 13, 112, 444, 1244, ...), and the scalability.csv rows with
    6, 7, 10, 12, 14, 20, 24, 28, 40, 48, 56 or 64 replicas (6 to 16 nodes),
    at every per-GPU batch measured there. None of them is a test
    configuration (`assert_disjoint`).
    """
    return (prof.n > 1) & ~np.isin(prof.k, TEST_GPUS)


def whole_node_rows(prof: Profile) -> np.ndarray:
    """(R,) bool: the tested configurations on whole 4-GPU nodes: 44, 4444, 8 nodes x 4."""
    return (np.isin(prof.placement, WHOLE_NODE_PLACEMENTS)
            | ((prof.placement == "") & (prof.k == 32) & (prof.n == 8)))


def configurations(prof: Profile, sel: np.ndarray) -> set[tuple[int, int, float]]:
    """The (GPUs, nodes, per-GPU batch) the model sees at the selected rows."""
    return set(zip(prof.k[sel].tolist(), prof.n[sel].tolist(), prof.local[sel].tolist(),
                   strict=True))


def assert_disjoint(prof: Profile, train: np.ndarray, prior: np.ndarray,
                    test: np.ndarray) -> None:
    """Check that neither the job's samples nor the prior's job saw a test configuration.

    Disjoint in total GPU count (so also in every (k, n, per-GPU batch) and
    every placement), and the prior's job ran across nodes only.

    Raises:
        AssertionError: naming the model and the shared configurations.
    """
    test_k = set(prof.k[test].tolist())
    for what, sel in (("prior", prior), ("training", train)):
        shared_k = test_k & set(prof.k[sel].tolist())
        shared = configurations(prof, sel) & configurations(prof, test)
        if shared_k or shared:
            raise AssertionError(f"{prof.name}: the {what} configurations overlap the test set: "
                                 f"GPU counts {sorted(shared_k)}, (k, n, local batch) "
                                 f"{sorted(shared)[:5]}")
    if np.any(prof.n[prior] < 2):
        raise AssertionError(f"{prof.name}: the prior's finished job has single-node rows")
    if not np.all(np.isin(prof.k[test], TEST_GPUS)):
        raise AssertionError(f"{prof.name}: test rows outside {TEST_GPUS} GPUs")


@dataclass
class ModelFits:
    """The production path's fits of one model (u: (1, 7) parameter vectors).

    Attributes:
        default: the job fitted on its samples with the cluster default prior.
        prior: the same job with the prior from the finished job.
        finished: the finished job's own fit (the source of that prior).
        prior_rows: (R,) bool, the finished job's configurations.
    """

    default: np.ndarray
    prior: np.ndarray
    finished: np.ndarray
    prior_rows: np.ndarray


def fit_model(prof: Profile, cluster: ClusterDefault) -> ModelFits:
    """Fit one model's job through `update` + `estimate`, with and without the prior.

    The job sees `train_rows`; the finished job of the same model ran on
    `prior_rows` and its fitted parameters become the prior through
    `prior_from_finished`, with the finished job's posterior standard
    deviations (one finished job: no spread between jobs; floor 0.3).
    `assert_disjoint` checks the three row sets first.
    """
    train, prior_sel, test = train_rows(prof), prior_rows(prof), tested_rows(prof)
    assert_disjoint(prof, train, prior_sel, test)
    config = EstimatorConfig(cluster=cluster)
    strict = fit_job(prof, train, config)
    # The finished job's samples come in an arbitrary order (an enumeration of
    # placements): it remembers all of them with equal weight (no recency), so
    # that its prior summarises all of it.
    finished = fit_job(prof, prior_sel,
                       replace(config, max_configs=max(int(prior_sel.sum()), 1),
                               half_life_s=1e12),
                       configs_per_cycle=25)
    prior = prior_from_finished(finished.params, np.zeros(1, np.int64), np.zeros(1, np.int64),
                                min_log_sd=0.3, log_sd=finished.log_sd)
    with_prior = fit_job(prof, train, config, prior=prior)
    return ModelFits(default=strict.u, prior=with_prior.u, finished=finished.u,
                     prior_rows=prior_sel)


def ape(u: np.ndarray, prof: Profile, sel: np.ndarray) -> np.ndarray:
    """Absolute percentage errors (%) of predicted samples/s at the selected rows.

    Each row is predicted at its own placement: its GPUs k and nodes n.
    """
    params = ThroughputParams.from_u(u[0])
    m = prof.k[sel] * prof.local[sel]
    pred = throughput(params, prof.k[sel], prof.n[sel], m)
    meas = m / prof.step_time[sel]
    return np.abs(pred - meas) / meas * 100.0


PROTOCOLS = ("cluster default", "prior: finished job", "in-sample floor")


def model_errors(prof: Profile, fits: ModelFits, sel: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row errors (%) at the selected rows for each protocol, and their k, n, placement."""
    return {"cluster default": ape(fits.default, prof, sel),
            "prior: finished job": ape(fits.prior, prof, sel),
            "in-sample floor": ape(full_fit(prof, sel), prof, sel),
            "k": prof.k[sel], "n": prof.n[sel], "placement": prof.placement[sel]}


def anomaly_44(prof: Profile) -> dict[str, float]:
    """Placement 44 against the other 8-GPU placements and 4444, at equal per-GPU batch.

    Returns the median over per-GPU batches of step time(44) / median step time
    of the other 8-GPU placements of placements.csv, its range, its value at
    the smallest per-GPU batch, the number of batches, and at how many of them
    44 is slower than 4444 (16 GPUs).
    """
    ratios, slower = [], 0
    is44 = prof.placement == "44"
    others = (prof.k == 8) & (prof.placement != "") & ~is44
    for lb in np.unique(prof.local[is44]):
        t44 = float(prof.step_time[is44 & (prof.local == lb)][0])
        oth = prof.step_time[others & (prof.local == lb)]
        if oth.size:
            ratios.append(t44 / float(np.median(oth)))
        t16 = prof.step_time[(prof.placement == "4444") & (prof.local == lb)]
        slower += int(t16.size > 0 and t44 > float(t16[0]))
    r = np.array(ratios)
    return {"median": float(np.median(r)), "lo": float(r.min()), "hi": float(r.max()),
            "smallest": float(r[0]),
            "batches": r.size, "slower_than_16": slower,
            "placements": len(set(prof.placement[others].tolist()))}


def _table(errors: dict[str, dict[str, np.ndarray]]) -> tuple[list[str], dict]:
    """Per-model MAPE rows, the pooled total and the mean of the models."""
    lines = ["| model | points | " + " | ".join(PROTOCOLS) + " |",
             "|---|---|" + "---|" * len(PROTOCOLS)]
    pooled = {p: [] for p in PROTOCOLS}
    for name in MODELS:
        e = errors[name]
        lines.append(f"| {name} | {e['k'].size} | "
                     + " | ".join(f"{np.mean(e[p]):.1f} %" for p in PROTOCOLS) + " |")
        for p in PROTOCOLS:
            pooled[p].append(e[p])
    tot = {p: float(np.mean(np.concatenate(v))) for p, v in pooled.items()}
    mean_models = {p: float(np.mean([np.mean(x) for x in v])) for p, v in pooled.items()}
    lines.append(f"| **total (all points)** | {sum(errors[n]['k'].size for n in MODELS)} | "
                 + " | ".join(f"**{tot[p]:.1f} %**" for p in PROTOCOLS) + " |")
    lines.append("| mean of the models | | "
                 + " | ".join(f"{mean_models[p]:.1f} %" for p in PROTOCOLS) + " |")
    return lines, {"total": tot, "models": mean_models}


def _by_group(errors: dict[str, dict[str, np.ndarray]],
              groups: list[tuple[str, Callable[[dict], np.ndarray]]]) -> list[str]:
    """MAPE pooled over the models for groups of rows (label, mask function of an error dict)."""
    lines = ["| configurations | points | " + " | ".join(PROTOCOLS[:2]) + " |",
             "|---|---|---|---|"]
    for label, pick in groups:
        cells, count = [], 0
        for p in PROTOCOLS[:2]:
            vals = np.concatenate([errors[n][p][pick(errors[n])] for n in MODELS])
            cells.append(f"{np.mean(vals):.1f} %")
            count = vals.size
        lines.append(f"| {label} | {count} | " + " | ".join(cells) + " |")
    return lines


def _span(values: np.ndarray) -> str:
    """Integers as runs: [2, 3, 4, 5, 9, 10] -> "2 to 5, 9, 10"."""
    v = sorted(int(x) for x in values)
    runs, start = [], 0
    for i in range(1, len(v) + 1):
        if i == len(v) or v[i] != v[i - 1] + 1:
            a, b = v[start], v[i - 1]
            runs.append(f"{a} to {b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))))
            start = i
    return ", ".join(runs)


def throughput_section(root: Path) -> tuple[list[str], dict]:
    profs = {name: load(root, name) for name in MODELS}
    full = {name: full_fit(p, np.ones(p.k.shape[0], bool)) for name, p in profs.items()}
    rel = {name: relative_params(full[name], profs[name].m0) for name in MODELS}
    overall = cluster_default_from(list(rel.values()))
    primary, whole, anomaly, counts, own = {}, {}, {}, {}, {}
    for name, prof in profs.items():
        loo = cluster_default_from([rel[o] for o in MODELS if o != name])
        fits = fit_model(prof, loo)
        primary[name] = model_errors(prof, fits, tested_rows(prof))
        whole[name] = model_errors(prof, fits, whole_node_rows(prof))
        own[name] = (ape(fits.default, prof, train_rows(prof)),
                     ape(fits.prior, prof, train_rows(prof)))
        anomaly[name] = anomaly_44(prof)
        counts[name] = (int(train_rows(prof).sum()), int(fits.prior_rows.sum()),
                        int(tested_rows(prof).sum()))

    prior_any = {name: prior_rows(p) for name, p in profs.items()}
    place = [(p.k[s & (p.placement != "")], p.n[s & (p.placement != "")])
             for p, s in zip(profs.values(), prior_any.values(), strict=True)]
    scal = [(p.k[s & (p.placement == "")], p.n[s & (p.placement == "")])
            for p, s in zip(profs.values(), prior_any.values(), strict=True)]
    place_k = np.unique(np.concatenate([k for k, _ in place]))
    place_n = np.unique(np.concatenate([n for _, n in place]))
    scal_k = np.unique(np.concatenate([k for k, _ in scal]))
    scal_n = np.unique(np.concatenate([n for _, n in scal]))
    tested = [(p, tested_rows(p)) for p in profs.values()]
    named = {kk: sorted({str(x) for p, t in tested
                         for x in p.placement[t & (p.k == kk) & (p.placement != "")]},
                        key=lambda x: (len(x), x))
             for kk in TEST_GPUS}
    p8, p16, p32 = (named[kk] for kk in TEST_GPUS)
    scal_test = {kk: np.unique(np.concatenate([p.n[t & (p.k == kk) & (p.placement == "")]
                                               for p, t in tested])) for kk in TEST_GPUS}
    lines = ["## 1. Throughput: fit on 1, 2, 4 GPUs (one node), predict 8, 16, 32 GPUs", ""]
    lines += [
        "The job's samples: placements 1, 2 and 4 (one node) at every per-GPU batch, "
        "through `update` + `estimate`. The test: **every** measured configuration with 8, "
        "16 or 32 GPUs in total, each predicted at its own placement (its GPUs k and "
        f"nodes n): the placements of placements.csv with 8 GPUs ({', '.join(p8)}; "
        f"{len(p8)}), with 16 ({', '.join(p16)}) and with 32 ({', '.join(p32) or 'none'}), "
        "and the scalability.csv rows with "
        + "; ".join(f"{kk} replicas on {_span(nn)} nodes" for kk, nn in scal_test.items())
        + ", at every per-GPU batch measured there. Error: mean absolute percentage error "
        "(MAPE) of samples/s.",
        "",
        "Columns: what fills in what single-node samples cannot show (cross-node "
        "synchronisation):",
        "",
        "* **cluster default**: `ClusterDefault` calibrated on the other five models "
        "(leave-one-model-out);",
        "* **prior: finished job**: a finished job of the same model that ran on every "
        "multi-node configuration whose total GPU count is *not* 8, 16 or 32: the "
        f"placements.csv placements on {_span(place_n)} nodes with {_span(place_k)} GPUs, "
        f"and the scalability.csv rows with {_span(scal_k)} replicas on {_span(scal_n)} "
        "nodes, at every per-GPU batch; its fit (the production path, no recency) "
        "becomes the prior through `prior_from_finished`, with the finished job's "
        "posterior standard deviations (floor 0.3 in log). The script asserts that these "
        "configurations and the job's own samples share no GPU count, and so no (k, n, "
        "per-GPU batch), with the test set;",
        "* **in-sample floor**: the model fitted to the tested measurements themselves "
        "(how well the model family can describe them at all).",
        "",
        "Rows per model (job's samples / finished job / tested): "
        + ", ".join(f"{n} {c[0]} / {c[1]} / {c[2]}" for n, c in counts.items()) + ".",
        "",
        "### 1a. Primary: all configurations with 8, 16 and 32 GPUs",
        "",
    ]
    tab, tp = _table(primary)
    lines += tab
    lines += ["", "By configuration (all models pooled):", ""]
    lines += _by_group(primary, [
        ("8 GPUs, all", lambda e: e["k"] == 8),
        ("8 GPUs, placement 44 only", lambda e: (e["k"] == 8) & (e["placement"] == "44")),
        ("8 GPUs, the 13 other placements", lambda e: (e["k"] == 8) & (e["placement"] != "")
         & (e["placement"] != "44")),
        ("8 GPUs, scalability.csv (6 or 8 nodes)", lambda e: (e["k"] == 8)
         & (e["placement"] == "")),
        ("16 GPUs, all", lambda e: e["k"] == 16),
        ("16 GPUs, 4444", lambda e: e["placement"] == "4444"),
        ("16 GPUs, scalability.csv (6 to 16 nodes)", lambda e: (e["k"] == 16)
         & (e["placement"] == "")),
        ("32 GPUs (8, 12, 16 nodes)", lambda e: e["k"] == 32),
    ])
    lines += ["", "The same jobs on their own samples (placements 1, 2, 4): MAPE of the "
              "fitted model at the configurations the job ran on (a prior must not overrule "
              "them):", "",
              "| model | cluster default | prior: finished job |", "|---|---|---|"]
    for name in MODELS:
        lines.append(f"| {name} | {np.mean(own[name][0]):.1f} % | "
                     f"{np.mean(own[name][1]):.1f} % |")
    lines += ["", "### 1b. Secondary: whole nodes only (44, 4444, 8 nodes x 4), the old view",
              "", "The same fitted jobs, scored only on the configurations the first version "
              "of this script tested (in-sample floor refitted to these points).", ""]
    tab, tw = _table(whole)
    lines += tab
    lines += ["", "By GPU count (all models pooled):", ""]
    lines += _by_group(whole, [("8 GPUs (44)", lambda e: e["k"] == 8),
                               ("16 GPUs (4444)", lambda e: e["k"] == 16),
                               ("32 GPUs (8 x 4)", lambda e: e["k"] == 32)])
    lines += ["", "### 1c. Placement 44 in the measurements", "",
              "Step time of 44 over the median step time of the other 8-GPU placements "
              "of placements.csv at the same per-GPU batch (median over the batches, and "
              "range), and at how many batches 44 (8 GPUs) is slower than 4444 (16 GPUs):",
              "",
              "| model | other 8-GPU placements | batches | 44 / median of the others | "
              "range | at the smallest batch | 44 slower than 4444 |",
              "|---|---|---|---|---|---|---|"]
    for name in MODELS:
        a = anomaly[name]
        lines.append(f"| {name} | {a['placements']} | {a['batches']} | {a['median']:.2f} | "
                     f"{a['lo']:.2f} .. {a['hi']:.2f} | {a['smallest']:.2f} | "
                     f"{a['slower_than_16']} of {a['batches']} |")
    lines += ["", "### 1d. Model parameters", ""]
    lines.append("Cluster default calibrated on all six models (the values in "
                 "`ClusterDefault`, rounded there), relative to the 1-GPU iteration time at m0:")
    lines.append("")
    lines.append("| compute_fixed | sync_intra | sync_intra_per_gpu | sync_inter | "
                 "sync_inter_per_gpu | gamma |")
    lines.append("|---|---|---|---|---|---|")
    lines.append(f"| {overall.compute_fixed:.3f} | {overall.sync_intra:.3f} | "
                 f"{overall.sync_intra_per_gpu:.3f} | {overall.sync_inter:.3f} | "
                 f"{overall.sync_inter_per_gpu:.4f} | {overall.gamma:.2f} |")
    lines.append("")
    lines.append("Per model (full fit of every placement and scalability row):")
    lines.append("")
    lines.append("| model | m0 | compute_fixed | sync_intra | sync_inter | gamma |")
    lines.append("|---|---|---|---|---|---|")
    for name in MODELS:
        r = rel[name]
        lines.append(f"| {name} | {profs[name].m0} | {r['compute_fixed']:.3f} | "
                     f"{r['sync_intra']:.3f} | {r['sync_inter']:.3f} | {r['gamma']:.2f} |")
    return lines, {"primary": tp, "whole": tw}


def curve_section(root: Path) -> tuple[list[str], dict]:
    config = EstimatorConfig()
    alphas = np.asarray(config.curve_exponents)
    lines = ["## 2. Learning curves: fit on the first 30 % of epochs, predict the epoch "
             "of the final metric", ""]
    lines.append("| model | batch | epochs | fitted on | target | true epoch | predicted | "
                 "68 % range | error | within 95 % range |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for name in MODELS:
        prof = load(root, name)
        errs, cover, unfit = [], [], 0
        for bsz in sorted(prof.curves):
            c = prof.curves[bsz]
            p = c["progress"] * prof.m0            # samples at m0
            y = c["metric"]
            E = y.shape[0]
            direction = 1 if y[-1] > y[0] else -1
            target = y[-1]
            best = np.maximum.accumulate(y) if direction > 0 else np.minimum.accumulate(y)
            reached = best >= target if direction > 0 else best <= target
            true_epoch = int(np.argmax(reached)) + 1
            ntr = int(np.ceil(0.3 * E))
            stats = add_points(CurveStats.empty(1, alphas.size), np.zeros(ntr, np.int64), p[:ntr],
                               y[:ntr], alphas)
            pred = predict_target(stats, alphas, np.array([target]), np.array([direction]),
                                  p[ntr - 1:ntr], min_points=config.curve_min_points)
            row = f"| {name} | {bsz} | {E} | {ntr} | {target:.4g} | {true_epoch} | "
            if not pred.fitted[0]:
                unfit += 1
                lines.append(row + f"not fitted ({ntr} point(s) < {config.curve_min_points}) "
                             "| | | |")
                continue
            if pred.reached[0]:
                lines.append(row + "reached already | | | |")
                continue
            if not (pred.p_reach[0] >= 0.5 and np.isfinite(pred.progress[0])):
                unfit += 1
                lines.append(row + f"unreachable (asymptote {pred.asymptote[0]:.4g}, "
                             f"P(reach) {pred.p_reach[0]:.2f}) | | | |")
                continue
            epochs = np.arange(1, E + 1, dtype=float)
            rate = (p[-1] - p[0]) / max(E - 1, 1)

            def to_epoch(v, p=p, epochs=epochs, rate=rate, E=E):
                return float(np.interp(v, p, epochs)) if v <= p[-1] else E + (v - p[-1]) / rate
            est = to_epoch(pred.progress[0])
            spread = np.exp(pred.log_std[0])
            lo = to_epoch(pred.progress[0] / spread)
            hi = to_epoch(pred.progress[0] * spread)
            lo2 = to_epoch(pred.progress[0] / spread ** 2)
            hi2 = to_epoch(pred.progress[0] * spread ** 2)
            err = abs(est - true_epoch) / true_epoch * 100.0
            inside = lo2 <= true_epoch <= hi2
            errs.append(err)
            cover.append(inside)
            lines.append(row + f"{est:.1f} | {lo:.1f} .. {hi:.1f} | {err:.0f} % | "
                         f"{'yes' if inside else 'no'} |")
        summary[name] = (float(np.mean(errs)) if errs else float("nan"), len(errs), unfit,
                         int(np.sum(cover)))
    lines.append("")
    lines.append("Per model (error = |predicted - true| / true epoch, mean over the batch sizes "
                 "that could be predicted):")
    lines.append("")
    lines.append("| model | mean error | predicted | not fitted / unreachable | true epoch "
                 "within the 95 % range |")
    lines.append("|---|---|---|---|---|")
    for name, (err, n_ok, n_bad, n_cov) in summary.items():
        lines.append(f"| {name} | {'n/a' if np.isnan(err) else f'{err:.0f} %'} | {n_ok} | "
                     f"{n_bad} | {n_cov} of {n_ok} |")
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = default_data_dir()
    ap.add_argument("--data-dir", type=Path, default=default,
                    help=f"Pollux profiles directory (default {default})")
    ap.add_argument("--out", type=Path,
                    default=REPO / "benchmarks" / "results" / "estimators_validation.md")
    args = ap.parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"error: --data-dir {args.data_dir} is not a directory", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    tp_lines, tp = throughput_section(args.data_dir)
    lc_lines, _ = curve_section(args.data_dir)
    elapsed = time.perf_counter() - t0
    head = [
        "# Estimators: validation on Pollux's T4 profiles",
        "",
        "Command: `.venv/bin/python benchmarks/estimators_validation.py` "
        f"(data: `{args.data_dir}`; {elapsed:.1f} s).",
        "",
        "Generated by the script; the discussion at the end is written by hand in the "
        "script's `DISCUSSION`.",
        "",
    ]
    text = "\n".join(head + tp_lines + [""] + lc_lines + [""] + DISCUSSION.strip().splitlines()
                     + [""])
    args.out.write_text(text)
    print(text)
    for view in ("primary", "whole"):
        print(f"total MAPE ({view}): "
              + ", ".join(f"{k} {v:.1f} %" for k, v in tp[view]["total"].items()))
    return 0


DISCUSSION = """
## Discussion

Everything above runs the production path: the job's progress samples (60 s
apart, one estimator cycle per configuration, warm-started) go through
`update` and `estimate`; nothing is fitted by a separate script.

**Throughput: the acceptance line (total MAPE < 15 %) is met with a prior
from a finished job of the same model, and not without one.** Over all 1156
configurations with 8, 16 and 32 GPUs (section 1a) the total is 12.0 %
(per model 6.6 % to 8.7 % for bert, cifar10, deepspeech2 and imagenet,
14.4 % for yolov3, 20.9 % for ncf); with only the cluster default it is
52.9 %; the model fitted to the tested points themselves has 7.2 %. On the
configurations the first version of this script tested (section 1b: 44,
4444, 8 x 4; 137 points) it is 16.0 %, above 15 %: 51 of its 137 points are placement 44.

1. *What is tested.* 8 GPUs are 812 of the 1156 points: all 14 placements
   of placements.csv with 8 GPUs and the scalability.csv rows with 8
   replicas on 6 or 8 nodes. Those 98 scalability rows are included because
   they have 8 GPUs in total; without them the total is 12.1 %, and without
   the 51 points of placement 44 it is 11.5 %.
2. *Placement 44 is an outlier in the measurements* (section 1c). At equal
   per-GPU batch, 44 takes 1.15 to 1.65 times (median per model) as long as
   the median of the other 13 placements with 8 GPUs, up to 1.79 times, and
   at 40 of its 51 batches longer than 4444 with twice the GPUs. The gap is
   largest where synchronisation dominates (small per-GPU batches: 1.2 to
   1.7 times) and vanishes where compute does (0.94 to 1.03 at the largest
   batches of cifar10, deepspeech2 and imagenet). A ring all-reduce moves
   the same bytes over each node's link whether 2 or 4 nodes take part, so
   44 should not be slower than 2222 or 4444; Pollux's data have one
   measurement per placement and batch, and we do not know the cause. The
   model's synchronisation time depends on k and on whether the job spans
   nodes, not on the spread, so every 8-GPU placement on more than one node
   gets the same prediction: it can match 44 or the other 13, not both.
   With the prior, 44 is predicted with 23.9 % error, the other 13
   placements with 11.7 %, the 8-replica scalability rows with 11.0 %.
3. *The prior and the test share nothing.* The finished job ran on every
   multi-node configuration whose GPU count is not 8, 16 or 32 (580 to 1706
   rows per model: 2 to 4 nodes with 2 to 7 or 9 to 15 GPUs, and 6 to 16
   nodes with 6, 7, 10, 12, 14, 20, 24, 28, 40, 48, 56 or 64 replicas);
   `assert_disjoint` stops the script if it shares a GPU count, and so a
   (k, n, per-GPU batch), with the tested configurations.
4. *Where the error remains: ncf and yolov3* (throughput 18 % to 27 % and
   8 % to 12 % too low, at every size). Their compute and synchronisation
   add up (gamma 1.0 and 1.1 in the full fit), and a job that only ran
   across nodes fixes their sum, not the split: the finished job puts part
   of the compute into the cross-node synchronisation (ncf: 3.1 tau against
   2.0 in the full fit), and the new job, which measures its compute on one
   node, adds it again. The other four models overlap the two (gamma 2.1 to
   3.1), where the split is identifiable, and are within 9 %. A finished job
   that had also run on one node (as a malleable job that starts small
   does) would fix the split; that is not the prior defined here (runs
   across nodes only), so no number is given for it.
5. *Two fixes made while revising this validation* (not chosen for their
   score; the total moved 11.9 % -> 14.4 % -> 12.0 %, the whole-node view
   14.0 % -> 14.5 % -> 16.0 %):
   * `prior_from_finished` now carries the finished job's posterior
     uncertainty (`Estimates.log_sd`, law of total variance;
     docs/estimators.md section 3). Before, a parameter the finished job
     never identified was passed on as known within the 0.3 floor: for ncf
     it overruled the job's own samples, whose 1-, 2- and 4-GPU times were
     then predicted about 10 times too short (836 % error on the job's own
     configurations; now 8.2 %, the table above section 1b).
   * The script's finished job ran many placements that the estimator sees
     as the same (k, n, m), e.g. 22 and 13; a checkpoint-restart pause
     between two of them entered the fit as one interval three times too
     slow. It now runs them back to back (`job_batch`). A unit test with
     step times from a known model found this: its finished job was about
     5 % off on exact data.
6. *The cluster default* (52.9 %): single-node samples say nothing about
   cross-node synchronisation, which is 0.3 to 2.0 times the 1-GPU step
   across the six models (`sync_inter`, section 1d); a default calibrated
   on five models misses the sixth by up to a factor of 4 (imagenet 68 %,
   ncf 105 %, yolov3 59 %). A job in malleable runs across nodes once a
   policy gives it more GPUs; from then on its own cross-node samples
   replace the prior.

**Learning curves** (no threshold in the acceptance line; reported as is):

* bert trains for 2 epochs: 30 % of them is not one point, so there is no
  curve to fit. The estimator flags ``CURVE_TOO_SHORT`` and uses the history
  of finished jobs (or the default) instead.
* imagenet (ResNet-50) has step decays of the learning rate at epochs 30 and
  60. The first 27 epochs level off at 0.51 to 0.61 top-1 accuracy, below the
  0.75 target: the power law's asymptote is below the target and the
  estimator says so (``TARGET_UNREACHABLE``) rather than inventing a
  crossing. No curve fitted to the pre-decay epochs can foresee a decay.
* deepspeech2's word error rate keeps falling slowly for 50 to 80 epochs; the
  early curve looks saturated, so for five of the six batch sizes the fit
  predicts the target too early (25 to 42 epochs against 51 to 77) with
  ranges that are too narrow (1 of 6 contains the truth): over-confident
  where the regime changes later.
* cifar10 (mean error 70 %, one batch size at 272 %), ncf (26 %) and yolov3
  (22 %, true epoch inside the 95 % range for 7 of 7) are predicted with
  ranges that mostly contain the truth.

So curve-based remaining work is used where a curve fits and flagged where
it does not; the point estimate is the posterior median and the range is
wide when the data allow many exponents.
"""

if __name__ == "__main__":
    sys.exit(main())
