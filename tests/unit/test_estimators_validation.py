"""The throughput part of benchmarks/estimators_validation.py: test set, prior set, fits.

The script is the acceptance check of issue 6 on Pollux's measured profiles;
these tests run its code path on a synthetic profile whose step times come
from a known Pollux model (always), and check the test-set construction on the
real bert profile where the data are present (the vendored copy or
/work/shared/data/pollux/profiles).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from malleable.estimators import ClusterDefault, ThroughputParams
from malleable.estimators.throughput import iteration_time

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "estimators_validation.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("estimators_validation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


ev = _load_script()

Q = ThroughputParams(alpha_c=0.02, beta_c=0.004, alpha_r=0.05, beta_r=0.01, alpha_n=0.3,
                     beta_n=0.02, gamma=2.0)

# (placement, GPUs, nodes); "" = a scalability.csv row.
ROWS = [("1", 1, 1), ("2", 2, 1), ("4", 4, 1), ("3", 3, 1),                  # one node
        ("22", 4, 2), ("13", 4, 2), ("444", 12, 3), ("", 6, 6), ("", 64, 16),  # prior
        ("44", 8, 2), ("2222", 8, 4), ("134", 8, 3), ("4444", 16, 4),         # test
        ("", 8, 8), ("", 16, 12), ("", 32, 8)]


def synthetic_profile(params: ThroughputParams = Q, locals_=(8.0, 32.0, 128.0)) -> ev.Profile:
    """A profile whose step times follow ``params`` exactly, at every per-GPU batch."""
    rows = [(p, k, n, lb) for p, k, n in ROWS for lb in locals_]
    k = np.array([r[1] for r in rows])
    n = np.array([r[2] for r in rows])
    local = np.array([r[3] for r in rows])
    step = iteration_time(params, k, n, k * local)
    return ev.Profile(name="synthetic", placement=np.array([r[0] for r in rows]), k=k, n=n,
                      local=local, step_time=step, m0=int(locals_[0]), curves={})


def test_test_set_is_every_configuration_with_8_16_or_32_gpus_and_the_prior_is_disjoint():
    prof = synthetic_profile()
    test, prior, train = ev.tested_rows(prof), ev.prior_rows(prof), ev.train_rows(prof)
    assert set(prof.placement[test & (prof.placement != "")]) == {"44", "2222", "134", "4444"}
    scal = test & (prof.placement == "")
    assert sorted(set(zip(prof.n[scal].tolist(), prof.k[scal].tolist(), strict=True))) == [
        (8, 8), (8, 32), (12, 16)]
    assert set(prof.placement[train]) == {"1", "2", "4"}
    assert set(prof.k[prior].tolist()) == {4, 6, 12, 64} and np.all(prof.n[prior] > 1)
    assert set(prof.placement[ev.whole_node_rows(prof)]) == {"44", "4444", ""}
    ev.assert_disjoint(prof, train, prior, test)          # does not raise
    leaky = prior | (prof.placement == "134")
    with pytest.raises(AssertionError, match=r"prior configurations overlap the test set: "
                                             r"GPU counts \[8\]"):
        ev.assert_disjoint(prof, train, leaky, test)
    with pytest.raises(AssertionError, match="training configurations overlap"):
        ev.assert_disjoint(prof, train | (prof.placement == "4444"), prior, test)


def test_validation_recovers_a_known_model_through_the_production_path():
    """Step times exactly from Q: the prior's job identifies cross-node sync, the job the rest."""
    prof = synthetic_profile()
    fits = ev.fit_model(prof, ClusterDefault())
    test = ev.tested_rows(prof)
    errors = ev.model_errors(prof, fits, test)
    assert errors["k"].size == int(test.sum()) == 21
    assert np.mean(errors["prior: finished job"]) < 1.0
    assert np.mean(errors["in-sample floor"]) < 0.1
    assert np.mean(ev.ape(fits.prior, prof, ev.train_rows(prof))) < 0.5
    # Without cross-node samples or a prior, the default's guess of them is off.
    assert np.mean(errors["cluster default"]) > np.mean(errors["prior: finished job"])


def test_real_profile_test_set_and_fit_on_one_model():
    root = ev.default_data_dir()
    if not (root / "bert" / "placements.csv").is_file():
        pytest.skip(f"Pollux profiles not present at {root} (vendored copy or shared data)")
    prof = ev.load(root, "bert")
    test = ev.tested_rows(prof)
    placements = set(prof.placement[test].tolist()) - {""}
    assert placements == {"44", "2222", "224", "233", "134", "143", "1124", "1133", "1142",
                          "1214", "1223", "1232", "1313", "1322", "4444"}
    scal = test & (prof.placement == "")
    assert set(zip(prof.n[scal].tolist(), prof.k[scal].tolist(), strict=True)) == {
        (6, 8), (8, 8), (6, 16), (8, 16), (12, 16), (16, 16), (8, 32), (12, 32), (16, 32)}
    ev.assert_disjoint(prof, ev.train_rows(prof), ev.prior_rows(prof), test)
    # A reduced run: the two smallest per-GPU batches only.
    keep = np.isin(prof.local, np.unique(prof.local)[:2])
    small = replace(prof, **{f: getattr(prof, f)[keep] for f in
                             ("placement", "k", "n", "local", "step_time")})
    fits = ev.fit_model(small, ClusterDefault())
    errors = ev.model_errors(small, fits, ev.tested_rows(small))
    assert errors["k"].size == int(ev.tested_rows(small).sum()) > 40
    assert all(np.all(np.isfinite(errors[p])) for p in ev.PROTOCOLS)
    assert np.mean(ev.ape(fits.prior, small, ev.train_rows(small))) < 5.0
    assert np.mean(errors["prior: finished job"]) < np.mean(errors["cluster default"])
