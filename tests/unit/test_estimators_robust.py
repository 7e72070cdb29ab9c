"""Bad input never stops the cycle: every job gets a defined estimate and a flag."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malleable.estimators import (
    EstimateFlags,
    EstimatorState,
    JobSpecs,
    ProgressBatch,
    ThroughputParams,
    ThroughputPrior,
    WorkHistory,
    candidate_grid,
    cycle,
)
from tests.unit.test_estimators_state import batch_of, job_samples, specs_for

F = EstimateFlags
K = candidate_grid(np.array([16]), 4, 16)                 # 0 1 2 3 4 8 12 16


def check_table(table, J):
    assert table.goodput.shape == (J, len(K))
    assert np.all(np.isfinite(table.goodput)) and np.all(table.goodput >= 0)
    assert np.all(np.isfinite(table.goodput_std)) and np.all(table.goodput_std >= 0)
    assert np.all(np.isfinite(table.remaining_work)) and np.all(table.remaining_work >= 0)
    assert np.all(np.isfinite(table.remaining_std)) and np.all(table.remaining_std >= 0)
    assert np.all(table.goodput[:, 0] == 0) and np.all(table.batch[:, 0] == 0)


def run(batch, J, spec=None, **kw):
    spec = spec or specs_for(J, 32.0)
    state, est, table = cycle(EstimatorState.empty(J), batch, spec, K, 4, **kw)
    check_table(table, J)
    return est, table


def empty_batch():
    z = np.zeros(0)
    return ProgressBatch(job=z, t=z, step=z, samples=z, gpus=z, nodes=z, batch=z)


def test_no_samples_and_one_sample_come_from_the_prior():
    one = batch_of(job_samples(1, [(2, 1, 64, 1)], rate=lambda k, n, m: 100.0))
    est, table = run(one, 2)
    assert table.from_prior.tolist() == [True, True]
    assert np.all(table.flags & F.NO_SAMPLES)
    assert np.all(table.goodput[:, 1:] > 0)                 # defined everywhere, from the prior
    _, table0 = run(empty_batch(), 2)
    assert table0.from_prior.all()


def test_all_samples_at_one_k_are_fitted_there_and_flagged():
    b = batch_of(job_samples(0, [(2, 1, 64, 20)], rate=lambda k, n, m: 100.0))
    est, table = run(b, 1, spec=specs_for(1, 64.0))
    assert not table.from_prior[0]
    assert table.flags[0] & F.SINGLE_GPU_COUNT and table.flags[0] & F.SINGLE_BATCH
    # At the observed configuration the model reproduces the measurement
    # (no gradient statistics: the batch stays at m0 = 64).
    assert table.batch[0, 2] == 64
    assert abs(table.goodput[0, 2] / 100.0 - 1) < 0.02


def test_zero_negative_and_nan_throughput_are_dropped_and_flagged():
    good = job_samples(0, [(1, 1, 32, 10)], rate=lambda k, n, m: 100.0)
    stalled = job_samples(1, [(1, 1, 32, 10)], rate=lambda k, n, m: 100.0)
    stalled["samples"] = [stalled["samples"][0]] * 10               # zero throughput
    backwards = job_samples(2, [(1, 1, 32, 10)], rate=lambda k, n, m: 100.0)
    backwards["samples"] = backwards["samples"][::-1]               # negative throughput
    nans = job_samples(3, [(1, 1, 32, 10)], rate=lambda k, n, m: 100.0)
    nans["t"] = [float("nan")] * 10
    junk = job_samples(4, [(1, 1, 32, 4)], rate=lambda k, n, m: 100.0)
    junk["gpus"] = [0, -1, float("inf"), 2.0]
    junk["nodes"] = [1, 1, 1, 3]                                    # nodes > gpus
    est, table = run(batch_of(good, stalled, backwards, nans, junk), 5)
    assert not table.from_prior[0] and not table.flags[0] & F.REJECTED_SAMPLES
    for j in (1, 2, 3, 4):
        assert table.flags[j] & F.REJECTED_SAMPLES
        assert table.from_prior[j]


def test_rows_out_of_range_are_ignored():
    b = batch_of(job_samples(7, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0),
                 job_samples(-1, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0))
    est, table = run(b, 2)
    assert table.from_prior.all()


def test_bad_specs_get_only_k_zero_and_a_flag():
    spec = JobSpecs(min_gpus=np.array([1, 0, 4, 1]), max_gpus=np.array([8, 8, 2, 8]),
                    step=np.array([1, 1, 1, 0]), init_batch=np.array([np.nan, 32.0, 32.0, 32.0]),
                    max_batch=np.array([-5.0, np.inf, 1.0, np.nan]))
    b = batch_of(*[job_samples(j, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0) for j in range(4)])
    est, table = run(b, 4, spec=spec)
    assert np.all(table.flags & F.BAD_SPEC)
    assert np.all(table.feasible == (K[None, :] == 0))


def test_a_garbage_prior_is_ignored():
    nan = np.array([np.nan])
    prior = ThroughputPrior(ThroughputParams(nan, nan, nan, nan, nan, nan, nan),
                            np.full((1, 7), 0.3), np.array([True]))
    est, table = run(batch_of(job_samples(0, [(1, 1, 32, 5)], rate=lambda k, n, m: 100.0)), 1,
                     prior=prior)
    assert not table.flags[0] & F.PRIOR_SUPPLIED


floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def junk_batches(draw):
    J = draw(st.integers(1, 4))
    N = draw(st.integers(0, 30))
    cols = {name: draw(st.lists(floats, min_size=N, max_size=N))
            for name in ("t", "step", "samples", "nodes", "metric", "grad_sqr", "grad_var")}
    cols["gpus"] = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0, -3.0, np.nan]),
                                 min_size=N, max_size=N))
    cols["batch"] = draw(st.lists(st.one_of(st.sampled_from([32.0, 64.0, 0.0]), floats),
                                  min_size=N, max_size=N))
    job = draw(st.lists(st.integers(-1, J), min_size=N, max_size=N))
    m0 = draw(st.lists(st.sampled_from([32.0, 1.0, 0.0, np.nan, 1e6]), min_size=J, max_size=J))
    target = draw(st.lists(st.one_of(floats, st.just(np.nan)), min_size=J, max_size=J))
    return J, ProgressBatch(job=np.array(job, dtype=np.int64),
                            **{k: np.array(v, dtype=np.float64) for k, v in cols.items()}), \
        np.array(m0), np.array(target)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_batches())
def test_random_samples_never_raise_and_give_finite_nonnegative_goodput(case):
    J, batch, m0, target = case
    spec = JobSpecs(min_gpus=np.ones(J, np.int64), max_gpus=np.full(J, 16), step=np.ones(J),
                    init_batch=m0, max_batch=m0 * 8, target_metric=target,
                    target_samples=np.where(np.isnan(target), target, np.abs(target)))
    hist = WorkHistory(np.array([1e5, 2e5, 3e5, 4e5]))
    state = EstimatorState.empty(J)
    for _ in range(2):                       # twice: the second is warm-started
        state, est, table = cycle(state, batch, spec, K, 4, history=hist)
        check_table(table, J)
        assert np.all(np.isfinite(est.u)) and np.all(np.isfinite(est.cov))


def test_interval_across_a_requeue_at_the_same_size_is_not_throughput():
    """A job requeued and restarted at the same (k, n, m): the gap (queueing, restart)
    must not enter the throughput fit as one very slow interval."""
    import numpy as np

    from malleable.estimators import EstimatorState, JobSpecs, ProgressBatch, update

    specs = JobSpecs(min_gpus=np.array([1]), max_gpus=np.array([8]), step=np.array([1]),
                     init_batch=np.array([32.0]))
    t = np.array([0.0, 10, 20, 1000, 1010, 1020])
    smp = np.array([0.0, 320, 640, 640, 960, 1280])        # resumes from the checkpoint
    base = dict(job=np.zeros(6, np.int64), t=t, step=smp / 32, samples=smp,
                gpus=np.full(6, 4.0), nodes=np.ones(6), batch=np.full(6, 32.0))
    one_run = update(EstimatorState.empty(1), ProgressBatch(**base), specs)
    two_runs = update(EstimatorState.empty(1),
                      ProgressBatch(**base, restart=np.array([0.0, 0, 0, 1, 1, 1])), specs)
    # Without run numbers the 980 s gap is an interval (with 0 samples: rejected);
    # with them it is no interval at all, and the four real ones remain.
    assert int(two_runs.intervals[0]) == 4
    assert int(two_runs.rejected[0]) == 0
    assert int(one_run.rejected[0]) == 1
    # Split across two update calls, the run boundary is still seen.
    a = update(EstimatorState.empty(1), ProgressBatch(
        **{k: v[:3] for k, v in base.items()}, restart=np.zeros(3)), specs)
    b = update(a, ProgressBatch(**{k: v[3:] for k, v in base.items()}, restart=np.ones(3)),
               specs)
    assert int(b.intervals[0]) == 4 and int(b.rejected[0]) == 0
