"""The registry: names, parameters and their errors; the interface records' validation."""

from __future__ import annotations

import numpy as np
import pytest

from malleable.config import PolicyConfig
from malleable.policies.base import Capacity, Context, JobSet, Policy
from malleable.policies.hysteresis import Hysteresis, policy_from_config
from malleable.policies.registry import DEFAULT, POLICIES, available, get_policy, policy_class
from malleable.policies.synthetic import make_jobset, power_law

EXPECTED = ["default", "equi", "fifo", "gittins", "hesrpt", "las", "optimus", "pollux",
            "srpt", "static"]


def test_available_lists_every_policy():
    assert available() == EXPECTED
    for name in available():
        policy = get_policy(name)
        assert isinstance(policy, Policy)
        assert policy.__doc__


def test_each_module_cites_a_source_and_states_its_model():
    import importlib

    for name, target in POLICIES.items():
        doc = importlib.import_module(target.split(":")[0]).__doc__
        assert doc and "Source" in doc and ("Model" in doc or "model" in doc), name


def test_default_is_an_alias():
    assert DEFAULT in POLICIES
    assert policy_class("default") is policy_class(DEFAULT)
    assert type(get_policy("default")) is policy_class(DEFAULT)


def test_unknown_policy_names_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown policy 'hesrtp' \(known: default, equi"):
        get_policy("hesrtp")


@pytest.mark.parametrize("name, hint", [
    ("hesrtp", "; did you mean 'hesrpt'?"),
    ("LAS", "; did you mean 'las'? Names are lower case"),
    ("Default", "; did you mean 'default'? Names are lower case"),
    ("nosuch", None)])
def test_unknown_policy_suggests_the_name_meant(name, hint):
    with pytest.raises(ValueError) as err:
        get_policy(name)
    message = str(err.value)
    assert message.startswith(f"unknown policy {name!r} (known: default, equi")
    if hint is None:
        assert "did you mean" not in message
    else:
        assert message.endswith(hint)


@pytest.mark.parametrize("name,params,words", [
    ("hesrpt", {"q": 1}, ["hesrpt", "unknown parameter 'q'", "known: p, p_from, risk"]),
    ("hesrpt", {"p_from": "guess"}, ["hesrpt", "p_from = 'guess'"]),
    ("hesrpt", {"p": "high"}, ["hesrpt", "p = 'high'", "expected a number or null"]),
    ("hesrpt", {"p": 1.5}, ["hesrpt", "p must be in (0, 1)"]),
    ("pollux", {"window": 2.5}, ["pollux", "window = 2.5", "expected an integer"]),
    ("pollux", {"search_moves": True}, ["pollux", "search_moves = True"]),
    ("pollux", {"window": -3}, ["pollux", "window must be >= 1, got -3"]),
    ("gittins", {"level_ratio": 0.5}, ["gittins", "level_ratio must be >= 1, got 0.5"]),
    ("gittins", {"starve_s": 0.0}, ["gittins", "starve_s must be > 0, got 0.0"]),
    ("las", {"thresholds": [10.0, 5.0]}, ["las", "thresholds must increase"]),
    ("las", {"thresholds": ["a"]}, ["las", "thresholds = ['a']",
                                 "expected a list of numbers, e.g. [3600, 7200]"]),
    ("las", {"thresholds": 3600}, ["las", "thresholds = 3600", "expected a list of numbers"]),
    ("las", {"size": "huge"}, ["las", "size = 'huge'", "expected one of 'requested', 'max'"]),
    ("static", {"backfill": 1}, ["static", "backfill = 1", "expected true or false"]),
    ("fifo", {"anything": 1}, ["fifo", "unknown parameter 'anything'", "known: none"]),
    ("hesrpt", {"risk": float("nan")}, ["hesrpt", "risk = nan", "expected finite numbers"]),
    ("srpt", {"risk": float("inf")}, ["srpt", "risk = inf", "expected finite numbers"]),
    ("pollux", {"p": float("-inf")}, ["pollux", "p = -inf", "expected finite numbers"]),
    ("pollux", {"p": float("nan")}, ["pollux", "p = nan", "expected finite numbers"]),
    ("las", {"thresholds": [float("nan")]}, ["las", "thresholds = [nan]", "finite numbers"]),
    ("las", {"thresholds": [-5.0]}, ["las", "thresholds must be > 0 GPU-seconds"]),
    ("gittins", {"min_history": -1}, ["gittins", "min_history must be >= 0, got -1"]),
    ("hesrpt", {"risk": -1}, ["hesrpt", "risk must be >= 0", "got -1"]),
    ("srpt", {"risk": -0.5}, ["srpt", "risk must be >= 0", "got -0.5"]),
    ("las", {"thresholds": []}, ["las", "thresholds must not be empty, got []",
                                 "continuous = true", "fifo"]),
    # Integers beyond TOML's 64 bits (they broke gittins' np.log at its first decision).
    ("gittins", {"level_ratio": 10**22}, ["gittins", "level_ratio = 10000000000000000000000",
                                          "out of range (integers have 64 bits)"]),
    ("pollux", {"search_moves": -2**63 - 1}, ["pollux", "search_moves", "out of range"]),
    ("las", {"thresholds": [10**30]}, ["las", "thresholds = [10000", "out of range"]),
])
def test_bad_parameters_are_named(name, params, words):
    with pytest.raises(ValueError) as exc:
        get_policy(name, **params)
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))


def test_good_parameters_are_kept():
    assert get_policy("hesrpt", p=0.5).params.p == 0.5
    assert get_policy("optimus", window=3).params.window == 3
    # An integer given for a number is held as a float; an integer parameter stays one.
    assert type(get_policy("gittins", prior_scale_s=60).params.prior_scale_s) is float
    assert type(get_policy("gittins", level_ratio=3).params.level_ratio) is float
    assert type(get_policy("gittins", window=3).params.window) is int
    assert get_policy("hesrpt", p=None).params.p is None
    got = get_policy("las", thresholds=[10, 20.0]).params.thresholds
    assert got == (10.0, 20.0) and all(type(x) is float for x in got)
    assert get_policy("pollux", p=0).params.p == 0
    assert get_policy("hesrpt", risk=0).params.risk == 0
    assert get_policy("srpt", risk=1.5).params.risk == 1.5
    # continuous LAS ranks by attained service itself: no queue thresholds needed
    assert get_policy("las", thresholds=[], continuous=True).params.thresholds == ()


def test_policy_from_config_wraps_in_hysteresis():
    cfg = PolicyConfig(name="las", params={"continuous": True}, min_gain=0.1, cooldown_s=60.0)
    pol = policy_from_config(cfg)
    assert isinstance(pol, Hysteresis)
    assert pol.inner.params.continuous is True
    assert (pol.params.min_gain, pol.params.cooldown_s) == (0.1, 60.0)
    with pytest.raises(ValueError, match="unknown policy"):
        policy_from_config(PolicyConfig(name="nope"))


def _jobs(**over):
    cap = Capacity.uniform(2, 4)
    base = make_jobset(cap, power_law, np.full(2, 0.8), np.ones(2), np.full(2, 100.0))
    fields = {f: getattr(base, f) for f in ("ids", "min_gpus", "max_gpus", "step", "current",
                                              "table", "attained", "age", "restart_cost",
                                              "since_change")}
    fields.update(over)
    return JobSet(**fields)


@pytest.mark.parametrize("over,words", [
    ({"min_gpus": np.array([0, 1])}, ["JobSet.min_gpus", "job 0", "0", ">= 1"]),
    ({"max_gpus": np.array([8, 0])}, ["JobSet.max_gpus", "job 1", ">= min_gpus"]),
    ({"attained": np.array([1.0, np.nan])}, ["JobSet.attained", "job 1", "nan"]),
    ({"age": np.array([-1.0, 0.0])}, ["JobSet.age", "job 0", "-1.0"]),
    ({"current": np.array([1.5, 0])}, ["JobSet.current", "integers"]),
    ({"step": np.array([1])}, ["JobSet.step", "shape (2,)"]),
    ({"since_change": np.array([np.nan, 0.0])}, ["JobSet.since_change", "job 0"]),
])
def test_jobset_validation_names_field_job_and_value(over, words):
    with pytest.raises(ValueError) as exc:
        _jobs(**over)
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))


def test_capacity_and_context_validation():
    with pytest.raises(ValueError, match="gpus_per_node = 0"):
        Capacity(0, np.array([0]))
    with pytest.raises(ValueError, match="free_per_node of node 1 = 5"):
        Capacity(4, np.array([4, 5]))
    with pytest.raises(ValueError, match=r"size_history\[0\] = -1.0"):
        Context(size_history=np.array([-1.0]))
    cap = Capacity(4, np.array([4, 2, 4, 0]))
    assert (cap.total, cap.whole_nodes, cap.largest_job) == (10, 2, 8)
    assert Capacity(4, np.array([3, 1])).largest_job == 3


def test_empty_jobset_gives_empty_allocation():
    cap = Capacity.uniform(2, 4)
    jobs = make_jobset(cap, power_law, np.zeros(0), np.zeros(0), np.zeros(0))
    for name in available():
        alloc = get_policy(name).allocate(jobs, cap)
        assert alloc.gpus.shape == (0,) and alloc.reason == ()


def test_no_capacity_gives_zeros_with_a_reason():
    cap = Capacity(4, np.zeros(3, dtype=np.int64))
    jobs = make_jobset(Capacity.uniform(3, 4), power_law, np.full(3, 0.7), np.ones(3),
                       np.full(3, 10.0))
    for name in available():
        alloc = get_policy(name).allocate(jobs, cap)
        assert alloc.gpus.tolist() == [0, 0, 0]
        assert all("no feasible size fits" in r for r in alloc.reason), (name, alloc.reason)


def test_subset_keeps_rows_together():
    cap = Capacity.uniform(2, 4)
    jobs = make_jobset(cap, power_law, np.array([0.5, 0.6, 0.7]), np.ones(3),
                       np.array([1.0, 2.0, 3.0]), attained=np.array([10.0, 20.0, 30.0]))
    sub = jobs.subset(np.array([True, False, True]))
    assert sub.ids.tolist() == ["0", "2"]
    assert sub.table.remaining_work.tolist() == [1.0, 3.0]
    assert sub.attained.tolist() == [10.0, 30.0]
    assert np.array_equal(sub.table.goodput, jobs.table.goodput[[0, 2]])
    assert len(jobs.subset(np.array([2, 0]))) == 2 and jobs.subset([2, 0]).ids[0] == "2"
