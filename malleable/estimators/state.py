"""Per-job estimator state: recency-weighted sufficient statistics, updated incrementally.

For J jobs (rows) the state keeps, without storing samples:

* a table of up to C configurations (k, n, m) per job with the recency
  weight W of the intervals observed there and the weighted sums of their
  log iteration time y and y^2 (so the weighted mean and scatter). All of a
  job's weights decay by ``2^(-dt/half_life)`` as its newer samples arrive;
  when the table is full, a new configuration replaces the one with the
  least weight;
* exponential averages of grad_sqr and ref_batch * grad_var (the gradient
  noise scale phi is their ratio, as adaptdl averages them), whose recency is
  training progress, not wall time: a report weighs the steps at the initial
  batch m0 (samples / m0) it covers (`update`,
  `EstimatorConfig.gns_half_life_steps`);
* the attained progress (samples at m0: samples weighted by E(m));
* learning-curve statistics (`malleable.estimators.learning_curve`);
* the last sample (to difference across batches) and the last fit (to
  warm-start the next one).

`update` costs O(new samples + J x C); it sorts only when the batch is not
already ordered by (job, time).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from malleable.estimators.efficiency import efficiency
from malleable.estimators.inputs import JobSpecs, ProgressBatch
from malleable.estimators.learning_curve import CurveStats, add_points
from malleable.estimators.params import NUM_PARAMS, EstimatorConfig

_LAST = ("t", "step", "samples", "k", "n", "m")


@dataclass(frozen=True)
class EstimatorState:
    """Everything the estimators remember about J jobs (row j = job j).

    Attributes:
        last: (J, 7) float64, the job's last usable sample: t, step, samples,
            k, n, m, run (NaN: none yet).
        t_ref: (J,) time (s) the recency weights are relative to (NaN: none).
        cfg_k, cfg_n: (J, C) int64 GPUs and nodes of each remembered
            configuration (0: empty slot).
        cfg_m: (J, C) float64 global batch.
        cfg_w: (J, C) recency weight (sum over its intervals).
        cfg_s1, cfg_s2: (J, C) weighted sums of log iteration time and its square.
        intervals: (J,) int64 usable throughput intervals seen.
        rejected: (J,) int64 samples or intervals dropped as unusable.
        gns_w, gns_sqr, gns_var: (J,) exponential averages over training
            progress (`update`) of 1, grad_sqr and ref_batch * grad_var, not
            normalised (gns_w <= 1 is the sum of the weights).
        progress: (J,) attained progress, samples at m0.
        curve: learning-curve statistics (`CurveStats`).
        u: (J, 7) the last fitted throughput parameters (NaN: none), warm start.
    """

    last: np.ndarray
    t_ref: np.ndarray
    cfg_k: np.ndarray
    cfg_n: np.ndarray
    cfg_m: np.ndarray
    cfg_w: np.ndarray
    cfg_s1: np.ndarray
    cfg_s2: np.ndarray
    intervals: np.ndarray
    rejected: np.ndarray
    gns_w: np.ndarray
    gns_sqr: np.ndarray
    gns_var: np.ndarray
    progress: np.ndarray
    curve: CurveStats
    u: np.ndarray

    @classmethod
    def empty(cls, num_jobs: int, config: EstimatorConfig | None = None) -> EstimatorState:
        """State for ``num_jobs`` jobs with nothing observed yet."""
        config = config or EstimatorConfig()
        J, C, G = int(num_jobs), config.max_configs, len(config.curve_exponents)
        z = np.zeros(J)
        return cls(last=np.full((J, 7), np.nan), t_ref=np.full(J, np.nan),
                   cfg_k=np.zeros((J, C), np.int64), cfg_n=np.zeros((J, C), np.int64),
                   cfg_m=np.zeros((J, C)), cfg_w=np.zeros((J, C)), cfg_s1=np.zeros((J, C)),
                   cfg_s2=np.zeros((J, C)), intervals=np.zeros(J, np.int64),
                   rejected=np.zeros(J, np.int64), gns_w=z.copy(), gns_sqr=z.copy(),
                   gns_var=z.copy(), progress=z.copy(), curve=CurveStats.empty(J, G),
                   u=np.full((J, NUM_PARAMS), np.nan))

    @property
    def num_jobs(self) -> int:
        return int(self.t_ref.shape[0])

    def take(self, rows: np.ndarray) -> EstimatorState:
        """The state of jobs ``rows`` (in that order): drop finished jobs, reorder.

        Args:
            rows: (J',) int indices into this state's rows.
        """
        rows = np.asarray(rows, dtype=np.int64)
        vals = {}
        for f in fields(self):
            v = getattr(self, f.name)
            vals[f.name] = CurveStats(*(a[rows] for a in v)) if f.name == "curve" else v[rows]
        return EstimatorState(**vals)

    @staticmethod
    def concat(states: list[EstimatorState]) -> EstimatorState:
        """Stack the rows of several states (e.g. the old jobs and new empty ones)."""
        vals = {}
        for f in fields(EstimatorState):
            parts = [getattr(s, f.name) for s in states]
            if f.name == "curve":
                vals[f.name] = CurveStats(*(np.concatenate(a) for a in zip(*parts, strict=True)))
            else:
                vals[f.name] = np.concatenate(parts)
        return EstimatorState(**vals)

    def noise_scale(self) -> np.ndarray:
        """(J,) gradient noise scale phi (samples), NaN where no gradient statistics."""
        with np.errstate(divide="ignore", invalid="ignore"):
            phi = self.gns_var / self.gns_sqr
        return np.where((self.gns_w > 0) & (self.gns_sqr > 0) & np.isfinite(phi) & (phi >= 0),
                        phi, np.nan)

    def with_fit(self, u: np.ndarray) -> EstimatorState:
        """This state with ``u`` (J, 7) remembered as the next fit's starting point."""
        return replace(self, u=np.asarray(u, dtype=np.float64).copy())


def _segments(*keys: np.ndarray) -> np.ndarray:
    """Start indices of runs of equal consecutive keys."""
    n = keys[0].shape[0]
    change = np.zeros(n, dtype=bool)
    change[0] = n > 0
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


@np.errstate(all="ignore")  # non-finite intermediate values are masked
def update(state: EstimatorState, batch: ProgressBatch, specs: JobSpecs,
           config: EstimatorConfig | None = None) -> EstimatorState:
    """Fold a batch of new progress samples into the state (returns a new state).

    Recency: throughput intervals are weighted by wall time (``half_life_s``
    seconds before the job's newest sample); gradient statistics by training
    progress: a sample that adds ``du`` steps at m0 (samples / m0) to the
    previous one stands for those steps, and weighs ``2^(-a/h) (1 - 2^(-du/h))``,
    ``a`` its steps at m0 before the job's newest sample and ``h`` =
    ``gns_half_life_steps`` (AdaptDL's per-step exponential average,
    ``adaptdl/torch/gradient_noise_scale.py``, summed over the steps a report
    covers). So phi does not depend on the times of the samples: the same job
    reported twice as often, or 40x time-compressed, gives the same phi.

    Args:
        state: the current state of J jobs.
        batch: new samples (`ProgressBatch`); ``batch.job`` rows in [0, J).
        specs: the J jobs' specs (m0 and grad_ref_batch are used here).
        config: settings (half-lives, table size).

    Returns:
        The new `EstimatorState`. Unusable samples (NaN or infinite fields,
        GPUs < 1, nodes < 1 or > GPUs, batch <= 0, negative counters, rows out
        of range) and unusable intervals (time not increasing, zero or
        negative samples per second at an unchanged configuration) are
        dropped and counted in ``rejected``; they never raise.

    Raises:
        ValueError: ``specs`` has a different number of jobs than ``state``.
    """
    config = config or EstimatorConfig()
    J = state.num_jobs
    if len(specs) != J:
        raise ValueError(f"specs has {len(specs)} jobs, state has {J}")
    rejected = state.rejected.copy()
    job = batch.job
    t, smp, gpu, nod, bat = batch.t, batch.samples, batch.gpus, batch.nodes, batch.batch
    with np.errstate(invalid="ignore", over="ignore"):
        sane = (np.isfinite(t + batch.step + smp + gpu + nod + bat) & (job >= 0) & (job < J)
                & (batch.step >= 0) & (smp >= 0) & (gpu >= 1) & (nod >= 1) & (nod <= gpu)
                & (bat > 0))
    all_sane = bool(sane.all())
    if not all_sane:
        bad_rows = job[~sane]
        np.add.at(rejected, bad_rows[(bad_rows >= 0) & (bad_rows < J)], 1)
    idx = None if all_sane else np.flatnonzero(sane)
    jb = job if idx is None else job[idx]
    if jb.size == 0:
        return replace(state, rejected=rejected)
    tb = t if idx is None else t[idx]
    djob = np.diff(jb)
    if (djob < 0).any() or ((np.diff(tb) < 0) & (djob == 0)).any():
        order = np.lexsort((tb, jb))
        idx = order if idx is None else idx[order]
        jb = job[idx]
    run = batch.restart
    if idx is not None:
        t, smp, gpu, nod, bat = t[idx], smp[idx], gpu[idx], nod[idx], bat[idx]
        gsqr, gvar, met, run = (batch.grad_sqr[idx], batch.grad_var[idx], batch.metric[idx],
                                run[idx])
    else:
        gsqr, gvar, met = batch.grad_sqr, batch.grad_var, batch.metric
    gpu, nod = np.floor(gpu), np.floor(nod)
    N = jb.shape[0]
    first = np.ones(N, dtype=bool)
    first[1:] = jb[1:] != jb[:-1]
    starts = np.flatnonzero(first)
    rows = jb[starts]                                     # jobs present in this batch
    counts = np.diff(np.append(starts, N))
    seg_end = starts + counts - 1
    last_rows = state.last[rows]

    def previous(col: np.ndarray, i: int) -> np.ndarray:
        out = np.empty_like(col)
        out[1:] = col[:-1]
        out[starts] = last_rows[:, i]
        return out

    # --- recency reference time per job, and decay of the old statistics.
    t_new = t[seg_end]
    t_ref = state.t_ref.copy()
    old_ref = t_ref[rows]
    known_ref = np.isfinite(old_ref)
    new_ref = np.where(known_ref, np.maximum(old_ref, t_new), t_new)
    t_ref[rows] = new_ref
    gap = np.where(known_ref, new_ref - old_ref, 0.0)
    decay = np.exp2(-gap / config.half_life_s)
    age = np.repeat(new_ref, counts) - t                  # seconds before the newest sample

    # --- samples each sample adds to the previous one (progress, gradient statistics).
    prev_smp = previous(smp, 2)
    dsamples = smp - np.where(np.isfinite(prev_smp), prev_smp, 0.0)
    m0 = specs.init_batch[jb]
    m0 = np.where(m0 > 0, m0, bat)                        # unusable m0: the sample's batch

    # --- gradient noise statistics (ratio of exponential averages, as adaptdl), their
    # recency in training progress (steps at m0), not wall time.
    with np.errstate(invalid="ignore"):
        gok = (gsqr > 0) & (gvar >= 0) & np.isfinite(gsqr + gvar)
    du = np.maximum(dsamples, 0.0) / m0                   # steps at m0 this sample covers
    theta, cover = _gns_decay(du, config.gns_half_life_steps)
    ref_b = specs.grad_ref_batch[jb]
    ref_b = np.where(ref_b > 0, ref_b, bat)               # NaN (not > 0): the sample's batch
    c = np.where(gok, cover, 0.0)
    # phi as of each sample (running averages within the job), so that progress
    # does not depend on how samples are split into batches.
    ema = _segment_ema(theta, np.stack([c, c * np.where(gok, gsqr, 0.0),
                                        c * np.where(gok, gvar * ref_b, 0.0)], axis=1),
                       starts, counts, np.stack([state.gns_w[rows], state.gns_sqr[rows],
                                         state.gns_var[rows]], axis=1))
    gns_w, gns_sqr, gns_var = state.gns_w.copy(), state.gns_sqr.copy(), state.gns_var.copy()
    gns_w[rows], gns_sqr[rows], gns_var[rows] = ema[seg_end].T
    with np.errstate(divide="ignore", invalid="ignore"):
        phi_at = np.where(ema[:, 1] > 0, ema[:, 2] / ema[:, 1], np.nan)

    # --- progress (samples at m0): every consecutive pair, E at the newer sample's batch.
    eff = efficiency(bat, m0, phi_at)
    prog_at = _segment_cumsum(dsamples * eff, starts, counts, state.progress[rows])
    progress = state.progress.copy()
    progress[rows] = prog_at[seg_end]

    # --- learning curve points.
    has_m = np.isfinite(met)
    curve = state.curve
    if has_m.any():
        curve = add_points(curve, jb[has_m], prog_at[has_m], met[has_m],
                           np.asarray(config.curve_exponents, dtype=np.float64))

    # --- throughput intervals: same configuration as the previous sample.
    dt = t - previous(t, 0)
    prev_run = previous(run, 6)
    same_run = (run == prev_run) | (np.isnan(run) & np.isnan(prev_run))
    interval = ((gpu == previous(gpu, 3)) & (nod == previous(nod, 4)) & (bat == previous(bat, 5))
                & same_run)
    good = interval & (dt > 0) & (dsamples > 0)
    bad_iv = interval & ~good
    if bad_iv.any():
        np.add.at(rejected, jb[bad_iv], 1)
    intervals = state.intervals.copy()
    intervals[rows] += np.add.reduceat(good.astype(np.int64), starts)
    cfg = _fold_configs(state, jb[good], gpu[good], nod[good], bat[good], dt[good],
                        dsamples[good], age[good], rows, decay, config)

    last = state.last.copy()
    last[rows] = np.stack([t[seg_end], (batch.step if idx is None else batch.step[idx])[seg_end],
                           smp[seg_end], gpu[seg_end], nod[seg_end], bat[seg_end],
                           run[seg_end]], axis=1)
    return replace(state, last=last, t_ref=t_ref, intervals=intervals, rejected=rejected,
                   gns_w=gns_w, gns_sqr=gns_sqr, gns_var=gns_var, progress=progress,
                   curve=curve, **cfg)


#: Weight of a report that covers no new samples (a ``started`` or
#: ``checkpointed`` line, a line after lost work): it decides phi only while the
#: job has reported nothing else.
_MIN_COVER = 1e-6


def _gns_decay(du: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Decay of the older statistics and weight of a report that covers ``du`` steps.

    A report stands for the ``du`` steps at m0 it ends: the average of earlier
    reports decays by ``theta = 2^(-du/h)`` and the report's statistics enter
    with weight ``1 - theta`` (`_MIN_COVER` if it covers none). Over the steps
    it covers this is AdaptDL's per-step exponential average (``theta = 0.999
    ** scale`` per step, ``scale`` = batch / m0; petuum/adaptdl
    ``adaptdl/torch/gradient_noise_scale.py``, ``_update_avg``), whose 0.999 is
    ``h`` = ln 2 / -ln 0.999 = 692.8 steps: reporting every step, or once per
    ``du`` steps with the same values, or any split of the reports, gives the
    same average. Time does not enter.

    Args:
        du: (N,) float64 steps at m0 (samples / m0) each report covers, >= 0.
        h: half-life, steps at m0, > 0.

    Returns:
        ``(theta, cover)``, each (N,) float64 in (0, 1].
    """
    theta = np.exp2(-du / h)
    cover = -np.expm1(-du * (np.log(2.0) / h))            # 1 - theta, exact for small du
    return theta, np.where(du > 0, cover, _MIN_COVER)


def _segment_ema(theta: np.ndarray, add: np.ndarray, starts: np.ndarray,
                 counts: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Running ``x_i = theta_i * x_(i-1) + add_i`` within each segment, from ``base``.

    A parallel prefix scan (Hillis and Steele, CACM 1986) over the pairs
    (theta, add), in ceil(log2 of the longest segment) vectorized passes (one
    for a daemon cycle's one or two lines per job); the scan multiplies only by
    factors in [0, 1] and adds non-negative terms, so no old value is scaled up
    (a running sum relative to the newest sample would cancel across segments).

    Args:
        theta: (N,) float64 decay factors in [0, 1].
        add: (N, F) float64 terms added at each element.
        starts: (S,) int start index of each segment (sorted, starts[0] = 0).
        counts: (S,) int length of each segment (they tile 0..N-1).
        base: (S, F) float64 value before each segment.

    Returns:
        (N, F) float64 running values.
    """
    a = theta.copy()
    x = add.copy()
    x[starts] += theta[starts, None] * base
    a[starts] = 0.0                                       # nothing crosses a segment start
    d = 1
    longest = int(counts.max()) if counts.size else 0
    while d < longest:                                    # a segment start stops every sum
        x[d:] += a[d:, None] * x[:-d]                     # the product is taken first
        a[d:] *= a[:-d]                                   # (numpy buffers the overlap)
        d *= 2
    return x


def _segment_cumsum(v: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                    base: np.ndarray) -> np.ndarray:
    """Running sum of ``v`` within each segment, starting from ``base`` per segment."""
    csum = np.cumsum(v)
    return np.repeat(base - (csum[starts] - v[starts]), counts) + csum


def _fold_configs(state: EstimatorState, jg: np.ndarray, k: np.ndarray, n: np.ndarray,
                  m: np.ndarray, dt: np.ndarray, dsamples: np.ndarray, age: np.ndarray,
                  rows: np.ndarray, decay: np.ndarray, config: EstimatorConfig) -> dict:
    """Decay the configuration tables of ``rows`` and add the good intervals."""
    J, C = state.cfg_w.shape
    cfg_k, cfg_n, cfg_m = state.cfg_k.copy(), state.cfg_n.copy(), state.cfg_m.copy()
    cfg_w = state.cfg_w.copy()
    cfg_s1, cfg_s2 = state.cfg_s1.copy(), state.cfg_s2.copy()
    cfg_w[rows] *= decay[:, None]
    cfg_s1[rows] *= decay[:, None]
    cfg_s2[rows] *= decay[:, None]
    out = dict(cfg_k=cfg_k, cfg_n=cfg_n, cfg_m=cfg_m, cfg_w=cfg_w, cfg_s1=cfg_s1, cfg_s2=cfg_s2)
    if jg.size == 0:
        return out
    y = np.log(m * dt / dsamples)                 # log seconds per iteration of m samples
    w = np.exp2(-age / config.half_life_s)
    # Runs of equal (job, k, n, m), then merge runs with equal keys (A -> B -> A).
    st = _segments(jg, k, n, m)
    gj, gk, gn, gm = jg[st], k[st], n[st], m[st]
    W = np.add.reduceat(w, st)
    S1 = np.add.reduceat(w * y, st)
    S2 = np.add.reduceat(w * y * y, st)
    order = np.lexsort((gm, gn, gk, gj))
    gj, gk, gn, gm, W, S1, S2 = (a[order] for a in (gj, gk, gn, gm, W, S1, S2))
    st2 = _segments(gj, gk, gn, gm)
    gj, gk, gn, gm = gj[st2], gk[st2], gn[st2], gm[st2]
    W, S1, S2 = (np.add.reduceat(a, st2) for a in (W, S1, S2))
    # Match each group to an existing slot of its job.
    eq = ((cfg_k[gj] == gk[:, None]) & (cfg_n[gj] == gn[:, None]) & (cfg_m[gj] == gm[:, None])
          & (cfg_k[gj] > 0))
    has = eq.any(axis=1)
    slot = np.argmax(eq, axis=1)
    mj, ms = gj[has], slot[has]
    cfg_w[mj, ms] += W[has]
    cfg_s1[mj, ms] += S1[has]
    cfg_s2[mj, ms] += S2[has]
    new = ~has
    if new.any():
        # Replaceable slots per job: empty ones first; then, among the GPU counts
        # (k, n) with the most slots, the least weight (so that a job with many
        # batch sizes keeps every k it has run on); never a slot just matched.
        # New configurations of a job, round-robin over its GPU counts, so that
        # more new ones than slots keep every k (then the most weight).
        newi = np.flatnonzero(new)
        kn_start = _segments(gj[newi], gk[newi], gn[newi])
        kn_rank = np.arange(newi.size) - np.repeat(kn_start, np.diff(np.append(kn_start, newi.size)))
        newi = newi[np.lexsort((-W[newi], kn_rank, gj[newi]))]
        nj = gj[newi]
        ujobs, first_idx = np.unique(nj, return_index=True)
        rank = np.arange(nj.size) - np.repeat(first_idx, np.diff(np.append(first_idx, nj.size)))
        ku, nu, wu = cfg_k[ujobs], cfg_n[ujobs], cfg_w[ujobs]
        prio = np.where(ku > 0, wu, -1.0)
        # Counting slots per (k, n) costs C x C per job: only for jobs whose
        # new configurations do not all fit into empty slots.
        n_new = np.diff(np.append(first_idx, nj.size))
        crowded = np.flatnonzero(n_new > np.sum(ku == 0, axis=1))
        if crowded.size:
            kc, nc, wc = ku[crowded], nu[crowded], wu[crowded]
            same = (kc[:, :, None] == kc[:, None, :]) & (nc[:, :, None] == nc[:, None, :])
            crowd = same.sum(axis=2)
            wmax = np.max(wc, axis=1, keepdims=True) + 1.0
            prio[crowded] = np.where(kc > 0, (C + 1 - crowd) * wmax + wc, -1.0)
        matched_u = np.zeros(ku.shape, dtype=bool)
        pos_m = np.searchsorted(ujobs, mj)
        hit = (pos_m < ujobs.size) & (ujobs[np.minimum(pos_m, ujobs.size - 1)] == mj)
        matched_u[pos_m[hit], ms[hit]] = True
        prio = np.where(matched_u, np.inf, prio)
        order_slots = np.argsort(prio, axis=1, kind="stable")
        pos = np.searchsorted(ujobs, nj)
        fits = rank < C
        tgt_slot = order_slots[pos[fits], rank[fits]]
        tj = nj[fits]
        usable = prio[pos[fits], tgt_slot] < np.inf
        tj, tgt_slot = tj[usable], tgt_slot[usable]
        sel = newi[fits][usable]
        cfg_k[tj, tgt_slot] = gk[sel].astype(np.int64)
        cfg_n[tj, tgt_slot] = gn[sel].astype(np.int64)
        cfg_m[tj, tgt_slot] = gm[sel]
        cfg_w[tj, tgt_slot] = W[sel]
        cfg_s1[tj, tgt_slot] = S1[sel]
        cfg_s2[tj, tgt_slot] = S2[sel]
    return out
