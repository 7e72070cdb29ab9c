"""Validate the estimators on Pollux's measured T4 profiles (real data).

Regenerates benchmarks/results/estimators_validation.md:

    .venv/bin/python benchmarks/estimators_validation.py [--data-dir DIR] [--out FILE]

1. Throughput. For each model, a job is shown what it would see on 1, 2 and
   4 GPUs inside one node (placements "1", "2", "4", every per-GPU batch of
   the profile), as progress samples 60 s apart, and the production path
   (`update` + `estimate`) fits its Pollux model. Its throughput is then
   predicted at 8 GPUs (2 nodes, placement "44"), 16 (4 nodes, "4444") and 32
   (8 nodes x 4, scalability.csv) at every per-GPU batch measured there, and
   compared with the measurement: mean absolute percentage error (MAPE) of
   samples/s. Three priors for what single-node samples cannot show (the
   cost of synchronising across nodes):

   * cluster default: `ClusterDefault` calibrated on the *other five* models
     (leave-one-model-out), as a cluster with history of other models has;
   * finished-job prior: a finished job of the same model that ran on 2-4
     nodes in placements other than the tested ones ("11", "22", "444",
     "1124", ...; not "44", "4444", no scalability.csv rows), its fit turned
     into a prior with `prior_from_finished`;
   * in-sample floor: the model fitted to the tested measurements themselves
     (how well the model family can describe them at all).

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
TEST = {8: "44", 16: "4444"}          # 32 GPUs: scalability.csv, 8 nodes x 4
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
    """The progress samples a job running these configurations in turn would log."""
    t, steps, samples = 0.0, 0.0, 0.0
    cols: dict[str, list[float]] = {c: [] for c in ("t", "step", "samples", "gpus", "nodes",
                                                    "batch")}
    for kk, nn, mm, st in zip(k, n, m, step_time, strict=True):
        t += 120.0  # a checkpoint-restart between configurations
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


def test_mask(prof: Profile) -> np.ndarray:
    return (np.isin(prof.placement, list(TEST.values()))
            | ((prof.placement == "") & (prof.k == 32) & (prof.n == 8)))


def finished_jobs(prof: Profile, test: np.ndarray) -> dict[str, np.ndarray]:
    """Rows a finished job of the same model would have run on, disjoint from the test.

    * whole nodes: what malleable's grid gives a job on 4-GPU nodes, other than
      8, 16 and 32 GPUs: 12 (placement 444), 24, 48 and 64 GPUs (scalability.csv,
      4 per node);
    * other placements: every multi-node placement of placements.csv except 44
      and 4444 (2 to 15 GPUs, any spread), as an unmanaged job might get.
    """
    packed = (prof.placement == "") & (prof.k == 4 * prof.n)
    whole = ((prof.placement == "444") | packed) & ~test
    spread = (prof.placement != "") & (prof.n > 1) & ~test
    return {"prior: finished job at whole nodes": whole,
            "prior: finished job, other placements": spread}


def mape(u: np.ndarray, prof: Profile, sel: np.ndarray) -> np.ndarray:
    """Absolute percentage errors of predicted samples/s at the selected rows."""
    params = ThroughputParams.from_u(u[0])
    m = prof.k[sel] * prof.local[sel]
    pred = throughput(params, prof.k[sel], prof.n[sel], m)
    meas = m / prof.step_time[sel]
    return np.abs(pred - meas) / meas * 100.0


def throughput_section(root: Path) -> tuple[list[str], dict]:
    profs = {name: load(root, name) for name in MODELS}
    full = {name: full_fit(p, np.ones(p.k.shape[0], bool)) for name, p in profs.items()}
    rel = {name: relative_params(full[name], profs[name].m0) for name in MODELS}
    overall = cluster_default_from(list(rel.values()))
    errors: dict[str, dict[str, np.ndarray]] = {}
    for name, prof in profs.items():
        train = np.isin(prof.placement, TRAIN_PLACEMENTS)
        test = test_mask(prof)
        loo = cluster_default_from([rel[o] for o in MODELS if o != name])
        cfg_loo = EstimatorConfig(cluster=loo)
        strict = fit_job(prof, train, cfg_loo)
        floor = full_fit(prof, test)
        errors[name] = {"cluster default": mape(strict.u, prof, test)}
        for label, sel in finished_jobs(prof, test).items():
            # The finished job's samples come in an arbitrary order (an enumeration
            # of placements): it remembers all of them with equal weight (no
            # recency), so that its prior summarises all of it.
            finished = fit_job(prof, sel, replace(cfg_loo, max_configs=1024, half_life_s=1e12),
                               configs_per_cycle=25)
            prior = prior_from_finished(finished.params, np.zeros(1, np.int64),
                                        np.zeros(1, np.int64), min_log_sd=0.3)
            with_prior = fit_job(prof, train, cfg_loo, prior=prior)
            errors[name][label] = mape(with_prior.u, prof, test)
        errors[name]["in-sample floor"] = mape(floor, prof, test)
        errors[name]["k"] = prof.k[test]
    lines = ["## 1. Throughput: fit on 1, 2, 4 GPUs (one node), predict 8, 16, 32 GPUs", ""]
    protocols = tuple(p for p in errors[MODELS[0]] if p != "k")
    lines.append("MAPE of samples/s over every per-GPU batch measured at the tested sizes "
                 "(8 = placement 44, 16 = 4444, 32 = 8 nodes x 4 from scalability.csv). "
                 "Columns: the prior that fills in what single-node samples cannot show.")
    lines.append("")
    lines.append("| model | points | " + " | ".join(protocols) + " |")
    lines.append("|---|---|" + "---|" * len(protocols))
    pooled = {p: [] for p in protocols}
    for name in MODELS:
        e = errors[name]
        lines.append(f"| {name} | {e['k'].size} | "
                     + " | ".join(f"{np.mean(e[p]):.1f} %" for p in protocols) + " |")
        for p in protocols:
            pooled[p].append(e[p])
    tot = {p: float(np.mean(np.concatenate(v))) for p, v in pooled.items()}
    mean_models = {p: float(np.mean([np.mean(x) for x in v])) for p, v in pooled.items()}
    lines.append("| **total (all points)** | "
                 f"{sum(errors[n]['k'].size for n in MODELS)} | "
                 + " | ".join(f"**{tot[p]:.1f} %**" for p in protocols) + " |")
    lines.append("| mean of the models | | "
                 + " | ".join(f"{mean_models[p]:.1f} %" for p in protocols) + " |")
    lines.append("")
    lines.append("By GPU count (all models pooled):")
    lines.append("")
    lines.append("| GPUs | " + " | ".join(protocols) + " |")
    lines.append("|---|" + "---|" * len(protocols))
    for kk in (8, 16, 32):
        cells = []
        for p in protocols:
            vals = np.concatenate([errors[n][p][errors[n]["k"] == kk] for n in MODELS])
            cells.append(f"{np.mean(vals):.1f} %")
        lines.append(f"| {kk} | " + " | ".join(cells) + " |")
    lines.append("")
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
    return lines, {"total": tot, "models": mean_models}


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
    default = VENDORED if VENDORED.is_dir() else SHARED
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
    print("total MAPE: " + ", ".join(f"{k} {v:.1f} %" for k, v in tp["total"].items()))
    return 0


DISCUSSION = """
## Discussion

Everything above runs the production path: the job's progress samples (60 s
apart, one estimator cycle per configuration, warm-started) go through
`update` and `estimate`; nothing is fitted by a separate script.

**Throughput: the acceptance line (total MAPE < 15 %) is not met.** Best total:
17.2 % with a prior from a finished job of the same model at malleable's
whole-node sizes; 19.5 % with a prior from a finished job that ran on other
placements; 72.5 % with only the cluster default. Why:

1. Samples on 1, 2 and 4 GPUs of one node say nothing about synchronising
   across nodes, and at 8 to 32 GPUs that cost is 1.2 to 2.0 times the 1-GPU
   step for five of the six models (0.3 for imagenet; `sync_inter` in the
   table above). It has to come from a prior. The cluster default,
   calibrated on the other five models (about 1.2), misses it by up to a
   factor of 4, hence 15 % to 146 % per model.
2. A prior from finished jobs of the same model (the design's answer, through
   `prior_from_finished`) brings the error to 17 % to 20 % in total, 8 % to
   26 % per model. Which placements that finished job happened to see moves
   the total by a few points (between about 14 % and 20 % over the variants
   tried while developing); the two reported here are the ones with a
   reason: whole nodes (what malleable runs) and everything except the test
   placements. No variant was chosen for its score.
3. The measurements set a floor: the Pollux model fitted to the 137 tested
   points themselves has 9.6 % MAPE. The profiles are single measurements with
   10 % to 20 % scatter between neighbouring batch sizes, and on two nodes
   every model is slower than on four (bert: 2.49 s per step at 8 GPUs on 2
   nodes, 1.80 s at 16 GPUs on 4 nodes, 1.83 s at 32 GPUs on 8 nodes). The
   model's ``alpha_n + beta_n (k - 2)`` cannot make 8 GPUs slower than 16, so
   the 8-GPU points carry most of the error (31 % with the whole-node prior
   against 7.6 % at 16 and 10.6 % at 32 GPUs).

A job in malleable runs on the larger sizes once a policy gives them to it;
from then on its own cross-node samples replace the prior (the recency-
weighted fit uses every configuration the job has run on).

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
