"""The job truth model from the vendored Pollux profiles (real files, no fixtures)."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

from malleable.sim.profiles import (
    MODELS,
    POLLUX_EPOCHS,
    PROFILES_DIR,
    RESTART_COST_S,
    ProfileError,
    load_profile,
    normalize_placement,
    pack,
    spread,
)


def _rows(model: str, name: str) -> list[dict[str, str]]:
    with open(PROFILES_DIR / model / name, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_loads_with_pollux_epochs_costs_and_limits(model):
    p = load_profile(model)
    assert p.name == model
    assert p.epochs == POLLUX_EPOCHS[model]
    assert p.restart_cost_s == RESTART_COST_S[model]
    assert p.init_batch_size == min(p.batch_sizes)
    assert p.max_batch_size == max(p.batch_sizes)
    assert p.epoch_progress.shape == (p.epochs,)
    assert np.all(np.diff(p.epoch_progress) > 0)
    assert p.target_progress == p.epoch_progress[-1]
    assert p.progress_per_epoch == pytest.approx(p.target_progress / p.epochs)
    # The target is the smallest last-epoch progress of any batch size (Pollux's rule).
    last = [float(_rows(model, f"validation-{b}.csv")[p.epochs - 1]["progress"])
            for b in p.batch_sizes]
    assert p.target_progress == min(last)
    local = [int(r["local_bsz"]) for r in _rows(model, "placements.csv")]
    assert p.min_local_bsz == min(local)
    assert p.max_local_bsz == (8 if model == "yolov3" else max(local))


def test_restart_costs_are_the_published_defaults_and_configurable():
    assert RESTART_COST_S == {"deepspeech2": 25.0, "cifar10": 30.0, "yolov3": 45.0,
                              "bert": 120.0, "imagenet": 250.0, "ncf": 25.0}
    assert load_profile("cifar10", restart_cost_s=12.5).restart_cost_s == 12.5
    assert load_profile("cifar10").restart_cost_s == 30.0  # the cache keeps both apart
    with pytest.raises(ProfileError, match="restart_cost_s"):
        load_profile("cifar10", restart_cost_s=-1.0)


def test_measured_points_are_reproduced_exactly_whatever_the_rotation():
    p = load_profile("cifar10")
    for row in _rows("cifar10", "placements.csv")[::97]:
        pl = tuple(int(c) for c in row["placement"])
        rotated = pl[1:] + pl[:1]
        b = int(row["local_bsz"])
        assert p.step_time(pl, b) == pytest.approx(float(row["step_time"]), rel=1e-12)
        assert p.step_time(rotated, b) == pytest.approx(float(row["step_time"]), rel=1e-12)
    # 16 nodes x 4 GPUs is a scalability.csv point.
    row = next(r for r in _rows("cifar10", "scalability.csv")
               if r["num_nodes"] == "16" and r["num_replicas"] == "64" and r["local_bsz"] == "64")
    assert p.step_time((4,) * 16, 64) == pytest.approx(float(row["step_time"]), rel=1e-12)


def test_local_batch_interpolation_is_linear_inside_and_clamped_or_extrapolated_outside():
    p = load_profile("imagenet")
    pts = {int(r["local_bsz"]): float(r["step_time"])
           for r in _rows("imagenet", "placements.csv") if r["placement"] == "4"}
    b = sorted(pts)
    mid = (b[2] + b[3]) / 2
    assert p.step_time((4,), mid) == pytest.approx((pts[b[2]] + pts[b[3]]) / 2)
    assert p.step_time((4,), b[0] / 2) == pytest.approx(pts[b[0]])   # clamped below
    assert p.step_time((4,), b[-1]) == pytest.approx(pts[b[-1]])


def test_extrapolation_above_the_largest_measured_local_batch_follows_the_last_segment():
    p = load_profile("cifar10", max_local_bsz=4096)
    pts = {int(r["local_bsz"]): float(r["step_time"])
           for r in _rows("cifar10", "placements.csv") if r["placement"] == "44"}
    b = sorted(pts)
    slope = (pts[b[-1]] - pts[b[-2]]) / (b[-1] - b[-2])
    expected = pts[b[-1]] + slope * 100
    assert p.step_time((4, 4), b[-1] + 100) == pytest.approx(max(expected, pts[b[-1]]))


def test_unmeasured_node_counts_interpolate_between_measured_ones_and_clamp_past_16():
    p = load_profile("bert")
    b = 8
    t4 = p.step_time((4,) * 4, b)
    t6 = p.step_time((4,) * 6, b)
    t5 = p.step_time((4,) * 5, b)
    assert t5 == pytest.approx((t4 + t6) / 2)
    assert p.step_time((4,) * 20, b) == pytest.approx(p.step_time((4,) * 16, b))
    # 8 GPUs on one node: the 4-per-node curve of one node is used.
    assert p.step_time((8,), b) == pytest.approx(p.step_time((4,), b))
    # 12 GPUs on 6 nodes is a scalability.csv point, whatever the spread.
    row = next(r for r in _rows("bert", "scalability.csv")
               if (r["num_nodes"], r["num_replicas"], r["local_bsz"]) == ("6", "12", "8"))
    assert p.step_time((2,) * 6, b) == pytest.approx(float(row["step_time"]))
    # 13 GPUs on 6 nodes: linear in GPUs between the measured 12 and 14.
    t12, t14 = p.step_time((2,) * 6, b), p.step_time((3, 3, 2, 2, 2, 2), b)
    assert p.step_time((3, 2, 2, 2, 2, 2), b) == pytest.approx((t12 + t14) / 2)


def test_gradient_accumulation_above_max_local_batch():
    p = load_profile("yolov3")   # max_local_bsz = 8 (Pollux)
    pts = {int(r["local_bsz"]): (float(r["step_time"]), float(r["sync_time"]))
           for r in _rows("yolov3", "placements.csv") if r["placement"] == "2"}
    step8, sync8 = pts[8]
    # 16 per GPU = 2 micro-steps of 8; 20 per GPU = 3 micro-steps of 7.
    assert p.step_time((2,), 16) == pytest.approx(step8 + (step8 - sync8))
    s7 = np.interp(7, [6, 8], [pts[6][0], step8])
    y7 = np.interp(7, [6, 8], [pts[6][1], sync8])
    assert p.step_time((2,), 20) == pytest.approx(s7 + 2 * (s7 - y7))


def test_throughput_is_batch_over_step_time_with_gpus_spread_over_nodes():
    p = load_profile("deepspeech2")
    assert p.throughput(6, 2, 240) == pytest.approx(240 / p.step_time((3, 3), 40))
    assert p.throughput(5, 2, 100) == pytest.approx(100 / p.step_time((3, 2), 20))
    assert spread(5, 2) == (3, 2) and spread(8, 2) == (4, 4)
    assert pack(6, 4) == (4, 2) and pack(8, 4) == (4, 4) and pack(3, 4) == (3,)
    with pytest.raises(ValueError):
        p.throughput(2, 3, 64)
    with pytest.raises(ValueError, match="batch must be positive"):
        p.throughput(2, 1, 0)


def test_efficiency_follows_pollux_gain_from_the_validation_gradient_statistics():
    p = load_profile("cifar10")
    m0 = p.init_batch_size
    rows = _rows("cifar10", "validation-1024.csv")
    sqr, var = float(rows[0]["grad_sqr"]), float(rows[0]["grad_var"])
    scale = 1024 / m0
    gain = (var + sqr) / (var / scale + sqr)
    assert p.gain(1024, 0.0) == pytest.approx(gain)
    assert p.efficiency(1024, 0.0) == pytest.approx(gain / scale)
    phi = p.noise_scale(0.0, 1024)
    assert p.efficiency(1024, 0.0) == pytest.approx((phi + m0) / (phi + 1024))
    assert p.efficiency(m0, 0.0) == pytest.approx(1.0)
    # Efficiency falls with batch size and rises as training progresses (noise scale grows).
    effs = [p.efficiency(m, 0.0) for m in (128, 256, 512, 1024, 2048)]
    assert all(a > b for a, b in zip(effs, effs[1:], strict=False))
    assert p.efficiency(2048, 0.9 * p.target_progress) > p.efficiency(2048, 0.0)
    # Between validated sizes the statistics are interpolated linearly.
    s1, v1 = p.grad_stats(0.0, 1024)
    s2, v2 = p.grad_stats(0.0, 2048)
    s, v = p.grad_stats(0.0, 1536)
    assert (s, v) == (pytest.approx((s1 + s2) / 2), pytest.approx((v1 + v2) / 2))


def test_grad_stats_and_metric_follow_the_epoch_of_the_progress():
    p = load_profile("cifar10")
    rows = _rows("cifar10", "validation-128.csv")
    bound = p.epoch_progress
    assert p.metric(0.0) is None
    assert p.metric(bound[0] - 1.0) is None
    assert p.metric(bound[0]) == float(rows[0]["metric"])
    assert p.metric(bound[4] + 1.0) == float(rows[4]["metric"])
    assert p.grad_stats(bound[2] + 1.0) == (float(rows[3]["grad_sqr"]),
                                            float(rows[3]["grad_var"]))
    assert p.epoch_at(0.0) == 0 and p.epoch_at(bound[0]) == 1
    assert p.epoch_at(p.target_progress) == p.epochs
    assert p.metric_higher_is_better
    assert not load_profile("deepspeech2").metric_higher_is_better


def test_isolated_time_integrates_step_time_over_epochs():
    p = load_profile("ncf")
    # ncf at its smallest batch: efficiency is 1, so time = target * step time.
    t = p.isolated_time(1, batch=p.init_batch_size)
    assert t == pytest.approx(p.target_progress * p.step_time((1,), p.init_batch_size))
    # Fractional shares: time-sliced below 1 GPU, linear between integers above.
    assert p.isolated_time(0.5, batch=256) == pytest.approx(2 * t)
    t2 = p.isolated_time(2, batch=512)
    t3 = p.isolated_time(3, batch=512)
    assert p.isolated_time(2.25, batch=512) == pytest.approx(t2 + 0.25 * (t3 - t2))
    with pytest.raises(ValueError):
        p.isolated_time(0)


def test_best_batch_maximises_truth_goodput_over_candidates():
    p = load_profile("cifar10")
    pl = (4, 4)
    progress = 0.5 * p.target_progress
    best = p.best_batch(pl, progress)
    assert best % 8 == 0 and p.init_batch_size <= best <= p.max_batch_size
    g_best = p.goodput(pl, best, progress)
    for m in (128, 256, 512, 1024, 2048, 4096):
        assert g_best >= p.goodput(pl, m, progress) - 1e-12


def test_bad_inputs_are_refused_with_the_field():
    p = load_profile("bert")
    with pytest.raises(ValueError, match="local_bsz must be a positive number"):
        p.step_time((1,), 0)
    with pytest.raises(ValueError, match="has no GPU"):
        p.step_time((0, 0), 4)
    with pytest.raises(ValueError, match="non-negative integers"):
        normalize_placement((1, -2))
    with pytest.raises(ValueError, match="non-negative integers"):
        normalize_placement((1.5,))
    with pytest.raises(ProfileError, match="unknown model 'gpt5'"):
        load_profile("gpt5")
    with pytest.raises(ProfileError, match="epochs=3"):
        load_profile("bert", epochs=3)


def test_a_malformed_profile_file_names_file_line_field_and_value(tmp_path):
    d = tmp_path / "mymodel"
    shutil.copytree(PROFILES_DIR / "bert", d)
    lines = (d / "placements.csv").read_text().splitlines()
    parts = lines[4].split(",")
    parts[2] = "fast"
    lines[4] = ",".join(parts)
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError) as err:
        load_profile("mymodel", directory=d)
    msg = str(err.value)
    assert "placements.csv:5" in msg and "step_time='fast'" in msg
    (d / "placements.csv").write_text((PROFILES_DIR / "bert" / "placements.csv").read_text())
    (d / "validation-12.csv").write_text("progress,iteration,metric\n1,1,1\n")
    with pytest.raises(ProfileError, match="validation-12.csv: header lacks field"):
        load_profile("mymodel", directory=d)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("x", directory=tmp_path / "nope")


def test_module_imports_only_numpy():
    code = ("import sys, malleable.sim.profiles; "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_speedup_is_sublinear_and_positive_for_every_model():
    for model in MODELS:
        p = load_profile(model)
        x1 = p.throughput(1, 1, p.default_batch(1) * 1.0)
        x16 = p.throughput(16, 4, p.default_batch(16) * 1.0)
        assert 0 < x16 / x1 < 16 * 1.05, model
        assert math.isfinite(p.isolated_time(4))


@pytest.mark.parametrize("model", MODELS)
def test_iterations_to_target_agree_with_the_measured_iteration_column(model):
    """The gain model (from grad_sqr/grad_var) against the profile's own iteration counts:
    within 10 % up to 8 x m0 for every model (larger gaps at very large batches, e.g.
    yolov3 at 512 needs 58 % more iterations than measured: a property of Pollux's model)."""
    p = load_profile(model)
    widths = np.diff(np.concatenate(([0.0], p.epoch_progress)))
    for b in p.batch_sizes:
        if b > 8 * p.init_batch_size:
            continue
        bounds = np.concatenate(([0.0], p.epoch_progress[:-1]))
        its = sum(w / p.gain(b, x) for w, x in zip(widths, bounds, strict=True))
        measured = float(_rows(model, f"validation-{b}.csv")[p.epochs - 1]["iteration"])
        assert its == pytest.approx(measured, rel=0.10), (model, b)
