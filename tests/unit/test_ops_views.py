"""Derived numbers of the admin commands (malleable.ops.views) and the shared formatting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from malleable.db import store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job
from malleable.estimators.params import EstimateFlags
from malleable.ops.output import (
    BadInput,
    fmt_duration,
    fmt_number,
    iso,
    parse_since,
    table,
)
from malleable.ops.views import (
    UNPLANNED_START_S,
    estimate_bits,
    eta_with_wait,
    flag_names,
    goodput_basis,
    goodput_curve,
    infer_gpus_per_node,
    queue_wait,
    recent_throughput,
    remaining_time,
    slurm_conf_gpus_per_node,
)
from tests.unit.ops_store import T0, G, build_store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def row(t: float, samples: int, restart: int | None = 0, gpus: int = 2):
    return SimpleNamespace(time=NOW + timedelta(seconds=t), samples=samples, restart=restart,
                           gpus=gpus)


def test_throughput_uses_the_latest_run_only():
    rows = [row(0, 0), row(10, 1000), row(20, 2000),                 # run 0: 100/s
            row(40, 2000, 1, 4), row(50, 2500, 1, 4), row(60, 3500, 1, 4)]   # run 1: 75/s
    tp = recent_throughput(rows)
    assert tp.samples_per_s == pytest.approx(1500 / 20) and tp.restart == 1
    assert (tp.lines, tp.window_s, tp.gpus) == (3, 20.0, 4)
    # at most `last` lines
    tp = recent_throughput([row(i, 10 * i * i) for i in range(20)], last=3)
    assert tp.samples_per_s == pytest.approx((10 * 19 * 19 - 10 * 17 * 17) / 2)


@pytest.mark.parametrize("rows", [[], [row(0, 0)], [row(0, 0, 0), row(5, 10, 1)],
                                  [row(5, 0), row(5, 100)], [row(0, 100), row(5, 50)]])
def test_throughput_unknown_without_two_ordered_lines_of_one_run(rows):
    assert recent_throughput(rows) is None


def test_goodput_curve_equals_the_daemons_speedup_table(tmp_path):
    """The curve `job show` prints is the goodput the policy saw: the same numbers as
    the SpeedupTable the daemon built from the same estimate."""
    built = build_store(tmp_path / "m.db")
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s:
        jobs = {j.slurm_job_id: j for j in s.query(Job).all()}
        est = store.latest_estimates(s, [jobs["101"].id])[jobs["101"].id]
        curve = goodput_curve(est.params, jobs["101"].spec, G, flags=estimate_bits(est))
        uncapped = goodput_curve(est.params, jobs["101"].spec, G)
    eng.dispose()
    t = built.table
    feasible = t.k[t.feasible[0] & (t.k > 0)]
    assert list(curve.gpus) == [2, 4, 8]     # 2-8 step 2, whole nodes above g = 4
    assert list(curve.gpus) == list(feasible)
    for k in curve.gpus:
        col = int(np.flatnonzero(t.k == k)[0])
        assert curve.at(int(k)) == pytest.approx(t.goodput[0, col], rel=1e-9)
        assert curve.batch[list(curve.gpus).index(k)] == t.batch[0, col]
    assert list(curve.nodes) == [1, 1, 2]
    assert curve.speedup[0] == pytest.approx(curve.goodput[0] / curve.goodput_1)
    assert curve.at(6) is None
    # The job never ran across nodes: the table (and so the curve) caps its cross-node
    # synchronisation; without its flags the curve would show the stored posterior's
    # slower 8 GPUs on 2 nodes and the same in-node sizes.
    assert estimate_bits(est) & int(EstimateFlags.NO_MULTI_NODE | EstimateFlags.NO_SAMPLES)
    assert uncapped.at(8) < curve.at(8)
    assert uncapped.at(4) == pytest.approx(curve.at(4), rel=1e-12)


def test_goodput_curve_with_extra_counts_and_unusable_inputs():
    u = [0.0] * 7
    u[6] = np.log(2.0)  # any finite vector
    params = {"u": u, "m0": 64.0, "phi": None}
    c = goodput_curve(params, {"min_gpus": 1, "max_gpus": 3}, 4, extra=[5])
    assert list(c.gpus) == [1, 2, 3, 5]
    assert goodput_curve({"u": [1.0] * 6, "m0": 64}, {"min_gpus": 1, "max_gpus": 2}, 4) is None
    assert goodput_curve({**params, "m0": None}, {"min_gpus": 1, "max_gpus": 2}, 4) is None
    assert goodput_curve(params, {"max_gpus": 2}, 4) is None
    assert goodput_curve(None, {"min_gpus": 1, "max_gpus": 2}, 4) is None
    assert goodput_curve({**params, "u": [float("nan")] * 7}, {"min_gpus": 1, "max_gpus": 2},
                         4) is None


def test_queue_wait_is_slurms_expected_start_of_a_pending_job():
    d = timedelta(seconds=600)
    assert queue_wait("PENDING", T0 + d, T0) == 600.0
    assert queue_wait("PENDING", T0 - d, T0) == 0.0                 # overdue: starts now
    assert queue_wait("RUNNING", T0 + d, T0) is None
    assert queue_wait("PENDING", None, T0) is None
    assert queue_wait("PENDING", T0 + d, T0, held=True) is None     # eligible time, not a start
    # Backfill's "cannot plan" start, a year ahead (running jobs without a time limit).
    assert queue_wait("PENDING", T0 + timedelta(days=365), T0) is None
    assert queue_wait("PENDING", T0 + timedelta(seconds=UNPLANNED_START_S - 1), T0) > 0
    assert eta_with_wait(100.0, 600.0) == 700.0 and eta_with_wait(100.0, None) == 100.0
    assert eta_with_wait(None, 600.0) is None


def test_goodput_basis_from_the_flags():
    F = EstimateFlags
    assert goodput_basis(int(F.REMAINING_EXACT | F.SINGLE_BATCH)) == "fit"
    assert goodput_basis(int(F.NO_SAMPLES | F.REMAINING_EXACT)) == "default"
    assert goodput_basis(int(F.NO_SAMPLES | F.PRIOR_SUPPLIED)) == "finished_jobs"
    assert goodput_basis(int(F.FIT_FAILED)) == "default"
    assert goodput_basis(None) is None and goodput_basis(0) is None


def test_remaining_time_and_flags():
    assert remaining_time(1000.0, 50.0) == 20.0
    assert remaining_time(-5.0, 50.0) == 0.0
    for w, g in ((None, 1.0), (1.0, None), (1.0, 0.0), (float("nan"), 1.0)):
        assert remaining_time(w, g) is None
    bits = int(EstimateFlags.NO_SAMPLES | EstimateFlags.REMAINING_EXACT)
    assert flag_names(bits) == ["no_samples", "remaining_exact"]
    assert flag_names(0) == [] and flag_names(None) == []


def test_gpus_per_node_from_slurm_conf_and_from_the_store(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nGresTypes=gpu\n"
                    "NodeName=a[1-3] Gres=gpu:8 CPUs=4\nNodeName=b1 Gres=gpu:2 CPUs=4\n"
                    "PartitionName=p Nodes=ALL Default=YES\n")
    assert slurm_conf_gpus_per_node(str(conf)) == 8
    assert slurm_conf_gpus_per_node(str(tmp_path / "missing.conf")) is None
    built = build_store(tmp_path / "m.db")
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        assert infer_gpus_per_node(s) == 4          # single-node jobs: the largest g seen
        j = s.query(Job).filter(Job.slurm_job_id == "104").one()
        j.nodes, j.gpus, j.gpus_per_node = 2, 12, 6   # a multi-node job shows g exactly
        s.flush()
        assert infer_gpus_per_node(s) == 6
    eng.dispose()


def test_since_durations_and_times():
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_since("90s", now) == now - timedelta(seconds=90)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("2h", now) == now - timedelta(hours=2)
    assert parse_since("1d", now) == now - timedelta(days=1)
    assert parse_since("1w", now) == now - timedelta(weeks=1)
    assert parse_since("45", now) == now - timedelta(seconds=45)
    assert parse_since("2026-05-01T10:00", now) == datetime(2026, 5, 1, 10, tzinfo=UTC)
    assert parse_since("2026-05-01T10:00:00+02:00", now) == datetime(2026, 5, 1, 8, tzinfo=UTC)
    assert parse_since("2026-05-01T10:00:00Z", now) == datetime(2026, 5, 1, 10, tzinfo=UTC)
    with pytest.raises(BadInput, match=r"--since 'yesterday': expected a duration"):
        parse_since("yesterday", now)
    for huge in ("99999999d", "999999999w", "1e400"):   # past datetime's range: no traceback
        with pytest.raises(BadInput, match=r"too long ago|expected a duration"):
            parse_since(huge, now)


def test_text_helpers():
    assert iso(T0) == "2026-03-01T12:00:00Z" and iso(None) is None
    assert [fmt_duration(x) for x in (None, 5, 119, 600, 3 * 3600 + 5 * 60, 2 * 86400 + 7200)] \
        == ["-", "5 s", "119 s", "10 min", "3 h 05 min", "2 d 2 h"]
    assert [fmt_number(x) for x in (None, 0.01234, 12.34, 500.0, 123456.7)] == \
        ["-", "0.0123", "12.3", "500", "123,457"]
    out = table(["A", "NUM"], [("x", 1), ("long", None)], right=(1,)).splitlines()
    assert out == ["A     NUM", "x       1", "long    -"]
