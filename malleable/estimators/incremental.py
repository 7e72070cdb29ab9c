"""One estimator cycle that re-estimates only the jobs whose inputs changed.

`malleable.estimators.pipeline.cycle` fits every job in every cycle. A job's
estimate is a function of its own row alone: its `EstimatorState` row (the
samples folded in so far, and the last fit as the starting point), its
`JobSpecs` row, its prior row, the candidate grid and g, and, for its
remaining work only, the finished jobs' `WorkHistory`. In a long queue most
jobs wait: no new sample, the same spec and prior. Fitting them again only
moved the Levenberg-Marquardt solution a little further from where the last
cycle left it (the fit starts from the last one and stops after a few
iterations or a small step), so a waiting job's estimate changed slightly in
every cycle for no new information.

`cycle_changed` gives a job the estimate of the last cycle unless one of its
inputs changed or its last fit had not settled:

* new samples for it in this batch, or a row not estimated before;
* its spec row (any `JobSpecs` field), or its supplied prior row (mean, sd,
  given);
* its last fit moved ``u`` by more than `SETTLE_TOL` (a fit stops after a few
  iterations: a job's first fit, or one after new samples or a new prior, may
  need a few cycles to settle; it is fitted in each of them);
* the finished jobs' history: the remaining work (W, its sd and the remaining
  work flags) of every row without a declared target is recomputed from the
  new history; its throughput fit and speedup table rows stay;
* the grid ``k`` or ``gpus_per_node``: every row's speedup table is computed
  again from the fits as they are (a fit does not depend on the grid).

The rows it fits get what `pipeline.estimate` and `pipeline.speedup_table`
give them over the whole state up to rounding (about 1e-14 relative: the fit
works on the configuration table cut to the widest row it fits, so summation
order can differ in the last bit; `tests/unit/test_estimators_incremental.py`
compares the two).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import NamedTuple

import numpy as np

from malleable.estimators.inputs import JobSpecs, ProgressBatch, WorkHistory
from malleable.estimators.params import (
    NUM_PARAMS,
    EstimateFlags,
    EstimatorConfig,
    ThroughputParams,
    ThroughputPrior,
)
from malleable.estimators.pipeline import Estimates, _put, _remaining, estimate, speedup_table
from malleable.estimators.state import EstimatorState, update
from malleable.estimators.table import SpeedupTable

F = EstimateFlags
# The flags `_remaining` sets (the rest come from the throughput fit and the state).
REMAINING_FLAGS = int(F.REMAINING_EXACT | F.REMAINING_CURVE | F.REMAINING_HISTORY
                      | F.REMAINING_DEFAULT | F.TARGET_UNREACHABLE | F.TARGET_REACHED
                      | F.CURVE_TOO_SHORT)
SETTLE_TOL = 1e-3
"""A fit that moved no entry of ``u`` (logs of times, the logit of gamma) by more than
this from the previous fit has settled: fitting it again without new inputs would move
it by less than about 0.1 %. One that moved more is fitted again in the next cycle."""
_TABLE_ROWS = ("feasible", "goodput", "batch", "remaining_work", "remaining_std", "from_prior",
               "flags", "goodput_std", "speedup_exponent")


class CycleMemo(NamedTuple):
    """What `cycle_changed` keeps of the last cycle; row j is the state's row j.

    Attributes:
        specs: (J, 14) float64, the `JobSpecs` fields each row was estimated with
            (`spec_matrix`).
        prior: (J, 15) float64, its supplied prior (`prior_matrix`).
        history: (total work (H,), group (H,)) of the `WorkHistory` used; None: none.
        k: (K,) int64, the grid; gpus_per_node: g.
        est: the `Estimates` of the J rows.
        table: their `SpeedupTable`.
        valid: (J,) bool, rows that hold an estimate (False: a row added since).
        settled: (J,) bool, rows whose last fit moved no entry of ``u`` by more than
            `SETTLE_TOL` from the fit before (False: fitted again next cycle too).
    """

    specs: np.ndarray
    prior: np.ndarray
    history: tuple[np.ndarray, np.ndarray] | None
    k: np.ndarray
    gpus_per_node: int
    est: Estimates
    table: SpeedupTable
    valid: np.ndarray
    settled: np.ndarray

    def take(self, rows: np.ndarray) -> CycleMemo:
        """The memo of rows ``rows`` ((J',) int) in that order; -1 adds a row that
        holds no estimate (``valid`` False), as `EstimatorState.concat` of an empty row.

        Raises:
            IndexError: a row out of range (a memo of no rows has none to copy from).
        """
        rows = np.asarray(rows, dtype=np.int64)
        src = np.maximum(rows, 0)
        return CycleMemo(self.specs[src], self.prior[src], self.history, self.k,
                         self.gpus_per_node, take_estimates(self.est, src),
                         take_table(self.table, src), self.valid[src] & (rows >= 0),
                         self.settled[src] & (rows >= 0))


def spec_matrix(specs: JobSpecs) -> np.ndarray:
    """(J, 14) float64: every `JobSpecs` field, one column each (a row's spec, to compare)."""
    return np.column_stack([np.asarray(getattr(specs, f.name), dtype=np.float64)
                            for f in fields(specs)])


def prior_matrix(prior: ThroughputPrior | None, num_jobs: int) -> np.ndarray:
    """(J, 15) float64: a supplied prior's mean fields, log sd and ``given`` per row
    (NaN rows where no prior is supplied at all)."""
    if prior is None:
        return np.full((num_jobs, 2 * NUM_PARAMS + 1), np.nan)
    mean = [np.broadcast_to(np.asarray(f, dtype=np.float64), (num_jobs,)) for f in prior.mean]
    sd = np.broadcast_to(np.asarray(prior.log_sd, dtype=np.float64), (num_jobs, NUM_PARAMS))
    return np.column_stack(mean + [sd, np.asarray(prior.given, dtype=np.float64)])


def take_specs(specs: JobSpecs, rows: np.ndarray) -> JobSpecs:
    """The `JobSpecs` of rows ``rows`` ((J',) int), in that order."""
    return JobSpecs(**{f.name: getattr(specs, f.name)[rows] for f in fields(specs)})


def take_prior(prior: ThroughputPrior | None, rows: np.ndarray) -> ThroughputPrior | None:
    """The `ThroughputPrior` of rows ``rows`` (None stays None)."""
    if prior is None:
        return None
    J = np.shape(prior.given)[0]
    mean = ThroughputParams(*(np.broadcast_to(np.asarray(f, dtype=np.float64), (J,))[rows]
                              for f in prior.mean))
    sd = np.broadcast_to(np.asarray(prior.log_sd, dtype=np.float64), (J, NUM_PARAMS))
    return ThroughputPrior(mean, sd[rows], np.asarray(prior.given)[rows])


def take_estimates(est: Estimates, rows: np.ndarray) -> Estimates:
    """The `Estimates` of rows ``rows`` ((J',) int), in that order."""
    return Estimates(*(a[rows] for a in est))


def take_table(table: SpeedupTable, rows: np.ndarray) -> SpeedupTable:
    """The `SpeedupTable` of rows ``rows`` ((J',) int), in that order (same grid)."""
    return SpeedupTable(k=table.k, **{n: getattr(table, n)[rows] for n in _TABLE_ROWS})


def _same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(J,) bool: row j of ``a`` equals row j of ``b`` (NaN equal to NaN)."""
    return ((a == b) | (np.isnan(a) & np.isnan(b))).all(axis=1)


def _settled(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(J,) bool: a fit from ``before`` (J, 7) to ``after`` moved no entry by more than
    `SETTLE_TOL` (a row with no fit before has not settled)."""
    with np.errstate(invalid="ignore"):
        return (np.abs(after - before) <= SETTLE_TOL).all(axis=1)


def _same_history(a: tuple | None, history: WorkHistory | None) -> bool:
    if a is None or history is None:
        return a is None and history is None
    return np.array_equal(a[0], history.total_work) and np.array_equal(a[1], history.group)


def cycle_changed(state: EstimatorState, batch: ProgressBatch, specs: JobSpecs, k: np.ndarray,
                  gpus_per_node: int, prior: ThroughputPrior | None = None,
                  history: WorkHistory | None = None, config: EstimatorConfig | None = None,
                  memo: CycleMemo | None = None
                  ) -> tuple[EstimatorState, Estimates, SpeedupTable, CycleMemo]:
    """`pipeline.cycle` for J jobs, re-estimating only the rows whose inputs changed
    since ``memo`` (the module docstring says which inputs).

    Args:
        state, batch, specs, k, gpus_per_node, prior, history, config: as `cycle`.
        memo: what the last call returned, its rows following ``state``'s
            (`CycleMemo.take` after the caller reorders the state); None: every
            row is estimated, as `cycle` does.

    Returns:
        (new state, estimates (J rows), table (J rows, grid ``k``), memo for the
        next call).

    Raises:
        ValueError: as `cycle` (``specs`` or ``prior`` without J rows, a bad grid).
    """
    config = config or EstimatorConfig()
    state = update(state, batch, specs, config)   # (the last fit, state.u, stays)
    J = state.num_jobs
    k = np.asarray(k, dtype=np.int64)
    smat, pmat = spec_matrix(specs), prior_matrix(prior, J)
    hist = None if history is None else (history.total_work, history.group)
    if memo is None or memo.valid.shape[0] != J:
        est = estimate(state, specs, prior=prior, history=history, config=config)
        table = speedup_table(est, specs, k, gpus_per_node, config)
        return state.with_fit(est.u), est, table, CycleMemo(
            smat, pmat, hist, k, gpus_per_node, est, table, np.ones(J, dtype=bool),
            _settled(state.u, est.u))
    dirty = (~memo.valid | ~memo.settled | ~_same_rows(smat, memo.specs)
             | ~_same_rows(pmat, memo.prior))
    seen = batch.job[(batch.job >= 0) & (batch.job < J)]
    dirty[seen] = True
    est, table, settled = memo.est, memo.table, memo.settled
    rows = np.flatnonzero(dirty)
    e = sub_specs = None
    if rows.size:
        sub_specs = take_specs(specs, rows)
        e = estimate(state.take(rows), sub_specs, prior=take_prior(prior, rows),
                     history=history, config=config)
        est = Estimates(*(_put(a, rows, b) for a, b in zip(est, e, strict=True)))
        settled = _put(settled, rows, _settled(state.u[rows], e.u))
        state = state.with_fit(est.u)
    again = np.zeros(0, dtype=np.int64)
    if not _same_history(memo.history, history):
        # Remaining work from the new history for the other rows that may use it.
        again = np.flatnonzero(~dirty & ~np.isfinite(specs.declared_work()))
        if again.size:
            W, Wsd, rflags = _remaining(state.take(again), take_specs(specs, again),
                                        est.progress[again], history, config)
            est = est._replace(
                remaining_work=_put(est.remaining_work, again, W),
                remaining_std=_put(est.remaining_std, again, Wsd),
                flags=_put(est.flags, again, (est.flags[again] & ~REMAINING_FLAGS) | rflags))
    if not np.array_equal(memo.k, k) or memo.gpus_per_node != gpus_per_node:
        # Another grid (or g): every row's table, from the fits as they are.
        table = speedup_table(est, specs, k, gpus_per_node, config)
    else:
        if e is not None:
            t = speedup_table(e, sub_specs, k, gpus_per_node, config)
            table = SpeedupTable(k=k, **{n: _put(getattr(table, n), rows, getattr(t, n))
                                         for n in _TABLE_ROWS})
        if again.size:
            table = replace(table, remaining_work=est.remaining_work.astype(np.float64),
                            remaining_std=est.remaining_std.astype(np.float64),
                            flags=est.flags.copy())
    return state, est, table, CycleMemo(smat, pmat, hist, k, gpus_per_node, est, table,
                                        np.ones(J, dtype=bool), settled)


__all__ = ["REMAINING_FLAGS", "SETTLE_TOL", "CycleMemo", "cycle_changed", "prior_matrix",
           "spec_matrix", "take_estimates", "take_prior", "take_specs", "take_table"]
