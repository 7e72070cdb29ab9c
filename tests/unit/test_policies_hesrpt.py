"""heSRPT: the closed form, and optimality against a brute-force search.

Method of the optimality test (instances of 1 to 4 jobs with known sizes, all
present at time 0, no arrivals, speedup s(k) = k^p):

1. Fluid simulation. A policy maps the remaining sizes to GPU counts; all
   jobs progress at rate k^p (one-GPU seconds per second) until the next
   completion, when the policy is asked again. Between completions nothing
   changes, so the simulation is exact (event to event). Mean completion
   time = total flow time / m.
2. Brute force. heSRPT's paper shows the optimal allocation changes only at
   completions, so the optimum is a piecewise-constant allocation: one share
   vector per phase (between consecutive completions). The search enumerates
   every share vector on a grid (multiples of 1/n of the cluster, n = 64 for
   2 jobs, 32 for 3, 16 for 4) in every phase, whichever job finishes first,
   simulates all of these allocation sequences at once (vectorised), and
   keeps the best. Any grid point is a real policy, so the search can only be
   worse than the true optimum; a finer grid gets closer.
3. Checks: (a) the brute-force optimum is never below heSRPT's closed-form
   optimal flow time (heSRPT is optimal; this also validates the simulation),
   and is within 0.5% of it (the grid is fine enough to be a reference);
   (b) the `hesrpt` policy itself, run through the fluid simulation on 256
   one-GPU nodes (integer GPUs, rounded by the shared feasibility repair),
   has a mean completion time within 1% of the brute-force optimum.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.policies.base import Capacity
from malleable.policies.curves import fit_power_law
from malleable.policies.hesrpt import HesrptPolicy, hesrpt_shares, hesrpt_total_flow_time
from malleable.policies.registry import get_policy
from malleable.policies.synthetic import make_jobset, power_law
from tests.unit.policy_cases import PROFILE


def closed_form(sizes: list[float], p: float) -> list[float]:
    """The paper's formula, written out independently: sort largest first, job i gets
    (i/m)^(1/(1-p)) - ((i-1)/m)^(1/(1-p))."""
    m = len(sizes)
    ranked = sorted(range(m), key=lambda j: (-sizes[j], j))
    out = [0.0] * m
    for i, j in enumerate(ranked, start=1):
        out[j] = (i / m) ** (1 / (1 - p)) - ((i - 1) / m) ** (1 / (1 - p))
    return out


@settings(PROFILE, max_examples=200)
@given(sizes=st.lists(st.floats(1e-3, 1e6), min_size=1, max_size=40),
       p=st.floats(0.01, 0.99))
def test_shares_equal_closed_form(sizes, p):
    got = hesrpt_shares(np.array(sizes), p)
    assert np.allclose(got, closed_form(sizes, p), rtol=0, atol=1e-9)
    assert abs(got.sum() - 1.0) < 1e-9


@settings(PROFILE)
@given(seed=st.integers(0, 2**32 - 1), J=st.integers(1, 30), p=st.floats(0.05, 0.95))
def test_policy_model_is_closed_form_before_rounding(seed, J, p):
    """The policy's pre-rounding GPUs = closed-form share x free GPUs, with p fitted from
    the table (exact for a k^p table) and sizes = remaining work / goodput(1)."""
    rng = np.random.default_rng(seed)
    cap = Capacity.uniform(8, 8)
    rate1 = rng.uniform(1, 50, J)
    work = rng.uniform(1, 1e5, J)
    jobs = make_jobset(cap, power_law, np.full(J, p), rate1, work)
    assert np.allclose(fit_power_law(jobs.table), p, atol=1e-9)
    gpus, sizes, p_used = HesrptPolicy().model(jobs, cap)
    assert abs(p_used - p) < 1e-9
    assert np.allclose(sizes, work / rate1, rtol=1e-12)
    expected = np.array(closed_form((work / rate1).tolist(), p)) * cap.total
    assert np.allclose(gpus, expected, rtol=0, atol=1e-9 * cap.total)


def test_shares_reject_bad_p():
    with pytest.raises(ValueError, match="0 < p < 1"):
        hesrpt_shares(np.ones(3), 1.0)
    with pytest.raises(ValueError, match="p must be in"):
        get_policy("hesrpt", p=1.5)


# --- fluid simulation and brute force -------------------------------------------------


def fluid_total_flow_time(policy, sizes: np.ndarray, p: float) -> float:
    """Total flow time when ``policy(remaining) -> GPUs`` is applied between completions."""
    rem = np.asarray(sizes, dtype=np.float64).copy()
    alive = np.ones(len(rem), bool)
    t = total = 0.0
    while alive.any():
        k = np.zeros(len(rem))
        k[alive] = policy(rem[alive])
        rate = np.where(alive & (k > 0), np.power(np.maximum(k, 1e-300), p), 0.0)
        assert rate.any(), "policy idles every remaining job"
        with np.errstate(divide="ignore"):
            tau = np.min(np.where(rate > 0, rem / np.where(rate > 0, rate, 1), np.inf))
        t += tau
        rem = np.where(rate > 0, rem - rate * tau, rem)
        done = alive & (rem <= 1e-9 * np.max(sizes))
        total += t * done.sum()
        alive &= ~done
    return total


def compositions(n: int, m: int) -> np.ndarray:
    """All share vectors of m jobs on the grid of multiples of 1/n (summing to 1)."""
    rows = []
    for bars in itertools.combinations(range(n + m - 1), m - 1):
        edges = (-1, *bars, n + m - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(m)])
    return np.asarray(rows, dtype=np.float64) / n


def brute_force_total_flow_time(sizes: np.ndarray, p: float, n: int) -> float:
    """Minimum total flow time over all piecewise-constant allocations on the 1/n grid
    (one server of capacity 1; rate of a job with share s is s^p)."""
    states = np.asarray(sizes, dtype=np.float64)[None, :]
    cost = np.zeros(1)
    while states.shape[1] > 1:
        m = states.shape[1]
        rates = compositions(n, m) ** p
        S, B = len(rates), len(states)
        st_ = np.repeat(states, S, axis=0)
        rr = np.tile(rates, (B, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            ttf = np.where(rr > 0, st_ / rr, np.inf)
        first = ttf.argmin(axis=1)
        tau = ttf[np.arange(len(first)), first]
        cost = np.repeat(cost, S) + m * tau
        left = np.maximum(st_ - rr * tau[:, None], 0.0)
        keep = np.ones_like(left, bool)
        keep[np.arange(len(first)), first] = False
        states = left[keep].reshape(len(first), m - 1)
    return float((cost + states[:, 0]).min())


CASES = [(m, seed) for m in (1, 2, 3) for seed in range(3)] + [(4, seed) for seed in range(3)]


@pytest.mark.parametrize("m,seed", CASES)
def test_mean_completion_within_1pct_of_brute_force(m, seed):
    rng = np.random.default_rng(100 + seed)
    sizes = rng.uniform(1.0, 20.0, m) * 3600.0   # one-GPU seconds
    p = float(rng.uniform(0.3, 0.9))
    grid_n = {1: 1, 2: 64, 3: 32, 4: 16}[m]
    N = 256
    # (a) brute force: never better than the closed-form optimum, and close to it.
    brute = brute_force_total_flow_time(sizes, p, grid_n) / N ** p
    optimum = hesrpt_total_flow_time(sizes, p, N)
    assert brute >= optimum * (1 - 1e-9)
    assert brute <= optimum * 1.005
    # The continuous heSRPT shares in the fluid simulation reach the closed form.
    cont = fluid_total_flow_time(lambda rem: hesrpt_shares(rem, p) * N, sizes, p)
    assert cont == pytest.approx(optimum, rel=1e-9)

    # (b) the policy, integer GPUs on 256 one-GPU nodes, p fitted from the table.
    cap = Capacity.uniform(N, 1)
    policy = get_policy("hesrpt")

    def run_policy(rem: np.ndarray) -> np.ndarray:
        jobs = make_jobset(cap, power_law, np.full(len(rem), p), np.ones(len(rem)), rem)
        alloc = policy.allocate(jobs, cap)
        assert alloc.gpus.sum() == N  # rounding loses no GPU
        return alloc.gpus.astype(float)

    ours = fluid_total_flow_time(run_policy, sizes, p)
    assert ours / m <= 1.01 * brute / m, (ours, brute)


def test_p_from_the_estimators_samples():
    """With p_from="samples" the estimators' per-job exponent (where finite) replaces the
    fit to the goodput table; the median over jobs is used."""
    from dataclasses import replace

    cap = Capacity.uniform(2, 8)
    jobs = make_jobset(cap, power_law, np.full(3, 0.5), np.ones(3), np.array([1e3, 2e3, 3e3]))
    table = replace(jobs.table, speedup_exponent=np.array([0.8, np.nan, 0.9]))
    jobs = replace(jobs, table=table)
    assert get_policy("hesrpt").model(jobs, cap)[2] == pytest.approx(0.5)
    # per job: 0.8, the table's 0.5 (no estimate), 0.9 -> median 0.8
    assert get_policy("hesrpt", p_from="samples").model(jobs, cap)[2] == pytest.approx(0.8)
