"""The gradient noise scale phi: smoothed in training progress, not wall time.

A job's phi must not depend on how often it reports, how fast it runs or how
much its clock is compressed (the end-to-end demo runs jobs 40x compressed):
only on the statistics it reports and the samples each report covers. With the
estimators' former wall-seconds half-life (``gns_half_life_s = 600``) the
invariance tests below fail (phi moves by 10 % and more).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.estimators import EstimatorConfig, EstimatorState, ProgressBatch, update
from tests.unit.test_estimators_state import specs_for

M0 = 32.0
ADAPTDL_THETA = 0.999        # adaptdl/torch/gradient_noise_scale.py: self._smoothing


def reports(samples, values, times, batch=64.0, gpus=2.0, job=0):
    """A ProgressBatch of one job's progress lines at cumulative ``samples`` (each
    with its (grad_sqr, grad_var) from ``values``) at wall ``times``."""
    n = len(samples)
    samples = np.asarray(samples, dtype=np.float64)
    sqr, var = (np.asarray(v, dtype=np.float64) for v in zip(*values, strict=True))
    return ProgressBatch(job=np.full(n, job, np.int64), t=np.asarray(times, np.float64),
                         step=samples / batch, samples=samples, gpus=np.full(n, gpus),
                         nodes=np.ones(n), batch=np.full(n, batch), grad_sqr=sqr, grad_var=var)


def phi_of(batch: ProgressBatch, config: EstimatorConfig | None = None) -> float:
    spec = specs_for(1, M0, grad_ref_batch=np.full(1, M0))
    st_ = update(EstimatorState.empty(1), batch, spec, config)
    return float(st_.noise_scale()[0])


def rising_noise(n_coarse: int, per_epoch: int):
    """(grad_sqr, grad_var) per coarse interval: phi grows 1.5x per epoch of
    ``per_epoch`` intervals, as early in training (Pollux's deepspeech2 profile
    doubles in a few epochs)."""
    return [(2.0, 2.0 * 3.0 * 1.5 ** (i // per_epoch)) for i in range(n_coarse)]


def test_phi_is_the_same_whether_the_job_reports_every_60_s_or_more_often_later():
    # 100 samples/s, 6,000 samples (187.5 steps at m0) per 60 s interval, 40 intervals.
    coarse_vals = rising_noise(40, 2)
    s_coarse = [6000.0 * (i + 1) for i in range(40)]
    coarse = reports(s_coarse, coarse_vals, [60.0 * (i + 1) for i in range(40)])
    # The same job reporting every 60 s for 20 intervals, then every 10 s (a job
    # that logs every N steps and runs 6x faster after a rescale, or whose
    # logging was made more frequent): each line has the statistics of the
    # interval it is in (they change only at the 60 s boundaries).
    s_fine = s_coarse[:20] + [120000.0 + 1000.0 * (i + 1) for i in range(120)]
    v_fine = coarse_vals[:20] + [coarse_vals[20 + i // 6] for i in range(120)]
    t_fine = [60.0 * (i + 1) for i in range(20)] + [1200.0 + 10.0 * (i + 1) for i in range(120)]
    fine = reports(s_fine, v_fine, t_fine)
    assert phi_of(fine) == pytest.approx(phi_of(coarse), rel=1e-9)


def test_phi_is_the_same_when_the_job_runs_40x_time_compressed():
    vals = rising_noise(40, 2)
    s = [6000.0 * (i + 1) for i in range(40)]
    real = reports(s, vals, [60.0 * (i + 1) for i in range(40)])
    compressed = reports(s, vals, [1.5 * (i + 1) for i in range(40)])   # 60 s / 40
    assert phi_of(compressed) == pytest.approx(phi_of(real), rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(increments=st.lists(st.floats(1.0, 5e4), min_size=1, max_size=25),
       noise=st.lists(st.floats(0.01, 100.0), min_size=25, max_size=25),
       splits=st.lists(st.integers(1, 5), min_size=25, max_size=25),
       seconds=st.lists(st.floats(0.01, 3600.0), min_size=125, max_size=125),
       compression=st.floats(1.0, 1000.0),
       half_life=st.sampled_from([None, 10.0, 693.0, 5000.0]))
def test_phi_depends_on_samples_and_statistics_only(increments, noise, splits, seconds,
                                                    compression, half_life):
    """Any split of each report into several with the same statistics, at any
    times and any time compression, gives the same phi."""
    config = None if half_life is None else EstimatorConfig(gns_half_life_steps=half_life)
    vals = [(1.0, v) for v in noise[:len(increments)]]
    s_coarse = np.cumsum(increments)
    coarse = reports(s_coarse, vals, np.arange(1, len(increments) + 1) * 60.0)
    s_fine, v_fine = [], []
    prev = 0.0
    for end, v, k in zip(s_coarse, vals, splits, strict=False):
        s_fine += list(prev + (end - prev) * np.arange(1, k + 1) / k)
        v_fine += [v] * k
        prev = end
    t_fine = np.cumsum(seconds[:len(s_fine)]) / compression
    fine = reports(s_fine, v_fine, t_fine)
    assert phi_of(fine, config) == pytest.approx(phi_of(coarse, config), rel=1e-9)


def adaptdl_phi(step_batches, step_values, theta=ADAPTDL_THETA):
    """phi from AdaptDL's per-step averages (bias-corrected exponential averages,
    factor ``theta ** (batch / m0)`` per step), written out step by step."""
    acc = {"sqr": [0.0, 0.0], "var": [0.0, 0.0]}
    for m, (sqr, var) in zip(step_batches, step_values, strict=True):
        f = theta ** (m / M0)
        for key, value in (("sqr", sqr), ("var", var)):
            biased, unbias = acc[key]
            acc[key] = [f * biased + (1 - f) * value, f * unbias + (1 - f)]
    sqr_avg = acc["sqr"][0] / acc["sqr"][1]
    var_avg = acc["var"][0] / acc["var"][1]
    return M0 * var_avg / sqr_avg


def test_default_half_life_is_adaptdls_per_step_average():
    # 300 steps at batch 32 (= m0), then 300 at 128 (each counts 4 steps at m0);
    # the statistics change every 100 steps; the job reports every 25 steps.
    batches = [32.0] * 300 + [128.0] * 300
    values = [(2.0, 1.0 + 0.5 * (i // 100)) for i in range(600)]
    want = adaptdl_phi(batches, values)
    samples = np.cumsum(batches)
    ix = np.arange(24, 600, 25)
    b = ProgressBatch(job=np.zeros(ix.size, np.int64), t=ix * 0.5, step=ix + 1.0,
                      samples=samples[ix], gpus=np.ones(ix.size), nodes=np.ones(ix.size),
                      batch=np.asarray(batches)[ix],
                      grad_sqr=np.array([values[i][0] for i in ix]),
                      grad_var=np.array([values[i][1] for i in ix]))
    exact = EstimatorConfig(gns_half_life_steps=math.log(2) / -math.log(ADAPTDL_THETA))
    assert phi_of(b, exact) == pytest.approx(want, rel=1e-9)
    assert EstimatorConfig().gns_half_life_steps == pytest.approx(692.8, abs=0.5)
    assert phi_of(b) == pytest.approx(want, rel=1e-3)


def test_statistics_halve_in_weight_per_half_life_of_steps():
    # 693 steps at m0 at value A, then 693 at value B: the average is 1/3 A + 2/3 B
    # (weights (1 - 1/2) * 1/2 and 1/2 on a history of exactly two half-lives,
    # normalised by 3/4).
    h = EstimatorConfig().gns_half_life_steps
    b = reports([h * M0, 2 * h * M0], [(1.0, 1.0), (1.0, 4.0)], [1.0, 2.0])
    assert phi_of(b) == pytest.approx(M0 * (1.0 / 3.0 + 4.0 * 2.0 / 3.0), rel=1e-9)


def test_a_line_that_covers_no_samples_counts_only_alone():
    # A started line (samples 0) gives phi at once; the first progress line replaces it.
    started = reports([0.0], [(1.0, 9.0)], [0.0])
    assert phi_of(started) == pytest.approx(M0 * 9.0)
    both = reports([0.0, 6400.0], [(1.0, 9.0), (1.0, 2.0)], [0.0, 30.0])
    assert phi_of(both) == pytest.approx(M0 * 2.0, rel=1e-4)


def test_lost_work_does_not_rewind_the_average():
    # A requeue without a checkpoint: samples go back from 12,800 to 6,400.
    h = EstimatorConfig().gns_half_life_steps
    b = reports([6400.0, 12800.0, 6400.0, 6400.0 + h * M0],
                [(1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (1.0, 3.0)], [1.0, 2.0, 3.0, 4.0])
    phi = phi_of(b)
    assert np.isfinite(phi) and M0 * 1.0 < phi < M0 * 3.0


def test_a_very_long_history_in_one_batch_stays_finite_and_follows_the_newest():
    # 20,000 lines, 10 steps at m0 each, half-life 10 steps: 20,000 half-lives.
    n = 20000
    vals = [(1.0, 1.0)] * (n - 1) + [(1.0, 5.0)]
    b = reports(np.arange(1, n + 1) * 10 * M0, vals, np.arange(n, dtype=np.float64))
    cfg = EstimatorConfig(gns_half_life_steps=10.0)
    spec = specs_for(1, M0, grad_ref_batch=np.full(1, M0))
    st_ = update(EstimatorState.empty(1), b, spec, cfg)
    assert np.all(np.isfinite([st_.gns_w[0], st_.gns_sqr[0], st_.gns_var[0]]))
    assert st_.noise_scale()[0] == pytest.approx(M0 * (0.5 * 1.0 + 0.5 * 5.0), rel=1e-9)


def test_the_wall_seconds_key_is_gone_with_a_clear_error():
    with pytest.raises(ValueError, match="gns_half_life_s was removed.*gns_half_life_steps"):
        EstimatorConfig(gns_half_life_s=600.0)
    with pytest.raises(ValueError, match="gns_half_life_steps is out of range"):
        EstimatorConfig(gns_half_life_steps=0.0)
