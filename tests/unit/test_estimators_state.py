"""Folding progress samples into the estimator state: intervals, recency, progress, GNS."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.estimators import (
    EstimatorConfig,
    EstimatorState,
    JobSpecs,
    ProgressBatch,
    ThroughputParams,
    iteration_time,
    update,
)


def specs_for(J: int, m0: float = 64.0, **kw) -> JobSpecs:
    """Specs for J identical jobs (1..64 GPUs, step 1), overridable per field."""
    base = dict(min_gpus=np.ones(J, np.int64), max_gpus=np.full(J, 64, np.int64),
                step=np.ones(J, np.int64), init_batch=np.full(J, m0))
    base.update(kw)
    return JobSpecs(**base)


def job_samples(job: int, schedule, params: ThroughputParams | None = None, rate=None,
                t0: float = 0.0, interval: float = 60.0, noise: float = 0.0, rng=None,
                grad=None, metric=None, samples0: float = 0.0, steps0: float = 0.0) -> dict:
    """Progress samples of one job that runs ``schedule`` = [(k, n, m, count), ...] in turn.

    The iteration time comes from ``params`` (Pollux model) or from ``rate(k, n, m)``
    in samples/s; ``noise`` is the sd of log-normal noise on each interval's time.
    ``grad`` = (grad_sqr, grad_var) on every sample; ``metric(samples)`` on every sample.
    Returns dict of lists (ProgressBatch fields).
    """
    rng = rng or np.random.default_rng(0)
    out = {f: [] for f in ("job", "t", "step", "samples", "gpus", "nodes", "batch", "metric",
                           "grad_sqr", "grad_var")}
    t, steps, samples = t0, steps0, samples0
    for k, n, m, count in schedule:
        if params is not None:
            T = float(iteration_time(params, np.array([k]), np.array([n]), np.array([m]))[0])
        else:
            T = m / rate(k, n, m)
        for _ in range(count):
            dt = interval
            Ti = T * float(np.exp(noise * rng.standard_normal())) if noise else T
            t += dt
            steps += dt / Ti
            samples += dt / Ti * m
            vals = (job, t, steps, samples, k, n, m,
                    metric(samples) if metric else np.nan,
                    grad[0] if grad else np.nan, grad[1] if grad else np.nan)
            for f, v in zip(out, vals, strict=True):
                out[f].append(v)
    return out


def batch_of(*parts: dict) -> ProgressBatch:
    merged = {f: sum((p[f] for p in parts), []) for f in parts[0]}
    return ProgressBatch(**{f: np.asarray(v, dtype=np.int64 if f == "job" else np.float64)
                            for f, v in merged.items()})


def test_interval_throughput_is_delta_samples_over_delta_t():
    # 100 samples/s at (k=2, n=1, m=64): iteration time 0.64 s.
    b = batch_of(job_samples(0, [(2, 1, 64, 5)], rate=lambda k, n, m: 100.0))
    st = update(EstimatorState.empty(1), b, specs_for(1))
    used = st.cfg_w[0] > 0
    assert used.sum() == 1 and st.cfg_k[0, used][0] == 2 and st.cfg_m[0, used][0] == 64
    assert st.intervals[0] == 4                       # 5 samples, 4 intervals (no sample before)
    y = st.cfg_s1[0, used][0] / st.cfg_w[0, used][0]
    assert np.exp(y) == pytest.approx(0.64)
    assert st.rejected[0] == 0


def test_interval_across_a_configuration_change_is_not_a_throughput_sample():
    b = batch_of(job_samples(0, [(1, 1, 64, 3), (4, 1, 256, 3)], rate=lambda k, n, m: 50.0 * k))
    st = update(EstimatorState.empty(1), b, specs_for(1))
    assert st.intervals[0] == 4                       # 2 + 2; the change itself is skipped
    assert sorted(st.cfg_k[0][st.cfg_w[0] > 0].tolist()) == [1, 4]


def test_incremental_update_equals_one_update():
    cfg = EstimatorConfig(half_life_s=300.0, gns_half_life_steps=100.0)
    rng = np.random.default_rng(3)
    parts = [job_samples(j, [(1, 1, 32, 10), (2, 1, 64, 10), (8, 2, 256, 10)],
                         rate=lambda k, n, m: 30.0 * k ** 0.8, noise=0.05, rng=rng,
                         grad=(2.0, 5.0), metric=lambda s: 1 - 1 / (1 + s / 1e4))
             for j in range(3)]
    whole = batch_of(*parts)
    one = update(EstimatorState.empty(3, cfg), whole, specs_for(3, 32.0), cfg)
    # Same samples in two batches, split at an arbitrary index.
    order = np.lexsort((whole.t, whole.job))
    cut = len(order) // 2 + 7

    def sub(ix):
        return ProgressBatch(**{f: getattr(whole, f)[ix] for f in
                                ("job", "t", "step", "samples", "gpus", "nodes", "batch",
                                 "metric", "grad_sqr", "grad_var")})
    two = update(EstimatorState.empty(3, cfg), sub(order[:cut]), specs_for(3, 32.0), cfg)
    two = update(two, sub(order[cut:]), specs_for(3, 32.0), cfg)
    for name in ("cfg_w", "cfg_s1", "cfg_s2", "gns_w", "gns_sqr", "gns_var", "progress"):
        a = np.sort(getattr(one, name), axis=-1) if name.startswith("cfg") else getattr(one, name)
        b = np.sort(getattr(two, name), axis=-1) if name.startswith("cfg") else getattr(two, name)
        np.testing.assert_allclose(a, b, rtol=1e-9, err_msg=name)
    # The curve's per-batch sums are float32 (add_points): equal to 1e-6.
    np.testing.assert_allclose(one.curve.sxy, two.curve.sxy, rtol=1e-6)
    assert one.intervals.tolist() == two.intervals.tolist()


def test_unsorted_batch_is_sorted_first():
    parts = [job_samples(j, [(1, 1, 32, 6)], rate=lambda k, n, m, j=j: 40.0 + j) for j in range(2)]
    b = batch_of(*parts)
    perm = np.random.default_rng(1).permutation(len(b))
    shuffled = ProgressBatch(**{f: getattr(b, f)[perm] for f in ("job", "t", "step", "samples",
                                                                 "gpus", "nodes", "batch")})
    a = update(EstimatorState.empty(2), b, specs_for(2))
    s = update(EstimatorState.empty(2), shuffled, specs_for(2))
    np.testing.assert_allclose(a.cfg_s1, s.cfg_s1)
    np.testing.assert_allclose(a.progress, s.progress)


def test_recency_weights_halve_per_half_life():
    cfg = EstimatorConfig(half_life_s=600.0)
    b = batch_of(job_samples(0, [(1, 1, 32, 2)], rate=lambda k, n, m: 10.0, interval=600.0))
    st = update(EstimatorState.empty(1, cfg), b, specs_for(1), cfg)
    w0 = st.cfg_w[0].sum()                                    # one interval, weight 1
    later = batch_of(job_samples(0, [(2, 1, 64, 1)], rate=lambda k, n, m: 10.0, t0=1800.0,
                                 interval=600.0, samples0=st.last[0, 2], steps0=st.last[0, 1]))
    st2 = update(st, later, specs_for(1), cfg)
    assert w0 == pytest.approx(1.0)
    k1 = st2.cfg_k[0] == 1
    assert st2.cfg_w[0, k1].sum() == pytest.approx(0.5 ** ((2400 - 1200) / 600))


def test_progress_counts_samples_weighted_by_statistical_efficiency():
    # grad_var refers to m0 = 32 (adaptdl convention): phi = 32 * 6 / 2 = 96.
    spec = specs_for(2, 32.0, grad_ref_batch=np.full(2, 32.0))
    a = job_samples(0, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0, grad=(2.0, 6.0))
    b = job_samples(1, [(4, 1, 128, 5)], rate=lambda k, n, m: 100.0, grad=(2.0, 6.0))
    st = update(EstimatorState.empty(2), batch_of(a, b), spec)
    assert st.noise_scale() == pytest.approx([96.0, 96.0])
    assert st.progress[0] == pytest.approx(a["samples"][-1])
    e = (96.0 + 32.0) / (96.0 + 128.0)
    assert st.progress[1] == pytest.approx(b["samples"][-1] * e)


def test_grad_var_at_the_samples_own_batch_by_default():
    b = batch_of(job_samples(0, [(2, 1, 128, 4)], rate=lambda k, n, m: 100.0, grad=(4.0, 1.0)))
    st = update(EstimatorState.empty(1), b, specs_for(1, 32.0))
    assert st.noise_scale()[0] == pytest.approx(128 * 1.0 / 4.0)


def test_full_table_keeps_every_gpu_count():
    # 3 GPU counts x 20 batch sizes = 60 configurations into 8 slots.
    cfg = EstimatorConfig(max_configs=8)
    sched = [(k, 1, float(k * b), 2) for k in (1, 2, 4) for b in range(16, 36)]
    st = update(EstimatorState.empty(1, cfg), batch_of(job_samples(0, sched,
                rate=lambda k, n, m: 10.0 * k)), specs_for(1, 16.0), cfg)
    kept = st.cfg_k[0][st.cfg_w[0] > 0]
    assert len(kept) == 8 and set(kept.tolist()) == {1, 2, 4}


def test_take_and_concat_follow_rows():
    b = batch_of(*[job_samples(j, [(1, 1, 32, 4)], rate=lambda k, n, m, j=j: 10.0 * (j + 1))
                   for j in range(3)])
    st = update(EstimatorState.empty(3), b, specs_for(3, 32.0))
    sub = st.take(np.array([2, 0]))
    np.testing.assert_allclose(sub.progress, st.progress[[2, 0]])
    both = EstimatorState.concat([sub, EstimatorState.empty(2)])
    assert both.num_jobs == 4 and both.progress[2:].tolist() == [0.0, 0.0]
    assert both.curve.sx.shape[0] == 4


def test_from_records_parses_progress_lines_and_skips_other_events():
    recs = [{"v": 1, "t": 10, "event": "progress", "step": 1, "samples": 32, "gpus": 1,
             "nodes": 1, "batch": 32},
            {"v": 1, "t": 11, "event": "checkpointed"},
            {"v": 1, "t": 20, "event": "progress", "step": 2, "samples": "64", "gpus": 1,
             "nodes": 1, "batch": 32, "metric": "oops", "grad_sqr": 1.5}]
    b = ProgressBatch.from_records([4, 4, 4], recs)
    assert len(b) == 2 and b.job.tolist() == [4, 4]
    assert b.samples.tolist() == [32.0, 64.0]
    assert np.isnan(b.metric[1]) and b.grad_sqr[1] == 1.5 and np.isnan(b.grad_var[0])


def test_database_names_and_missing_nodes():
    recs = [{"time": 5.0, "step": 1, "samples": 64, "gpus": 8, "nodes": None, "batch_size": 64},
            {"time": 6.0, "step": 2, "samples": 128, "gpus": 2, "batch_size": 64}]
    b = ProgressBatch.from_records([0, 0], recs, gpus_per_node=4)
    assert b.t.tolist() == [5.0, 6.0] and b.batch.tolist() == [64.0, 64.0]
    assert b.nodes.tolist() == [2.0, 1.0]
    assert np.isnan(ProgressBatch.from_records([0], recs[:1]).nodes[0])


def test_mismatched_shapes_are_named():
    with pytest.raises(ValueError, match="ProgressBatch.t"):
        ProgressBatch(job=np.zeros(2), t=np.zeros(3), step=np.zeros(2), samples=np.zeros(2),
                      gpus=np.zeros(2), nodes=np.zeros(2), batch=np.zeros(2))
    with pytest.raises(ValueError, match="JobSpecs.init_batch"):
        JobSpecs(min_gpus=np.ones(2), max_gpus=np.ones(2), step=np.ones(2),
                 init_batch=np.ones(3))
    with pytest.raises(ValueError, match="specs has 2 jobs, state has 1"):
        update(EstimatorState.empty(1), batch_of(job_samples(0, [(1, 1, 32, 2)],
               rate=lambda k, n, m: 1.0)), specs_for(2))
