"""Estimators: what each job's progress says about its future.

Owns the throughput model X(k, n, m) (Pollux iteration-time model, with a
cluster-default or finished-jobs prior, and the k^p power law), statistical
efficiency E(m) from the gradient noise scale, goodput X*E and its optimal batch size, remaining-work estimates with
uncertainty, and the speedup table that policies consume. Pure functions over
numpy arrays: no database, no Slurm, no clock.

One cycle (see `malleable.estimators.pipeline`)::

    state = EstimatorState.empty(J)                      # once; take()/concat() as jobs come and go
    state, est, table = cycle(state, batch, specs, k, gpus_per_node, prior, history)

Equations, units, sources and the cluster default prior: docs/estimators.md.
(The functions ``throughput.throughput`` and ``efficiency.efficiency`` are not
re-exported here, so that the package attributes keep naming the modules.)
"""

from malleable.estimators.efficiency import noise_scale, optimal_batch
from malleable.estimators.inputs import JobSpecs, ProgressBatch, WorkHistory
from malleable.estimators.learning_curve import CurveStats, predict_target
from malleable.estimators.params import (
    ClusterDefault,
    EstimateFlags,
    EstimatorConfig,
    GroupPrior,
    ThroughputParams,
    ThroughputPrior,
    group_prior,
    prior_from_finished,
)
from malleable.estimators.pipeline import (
    Estimates,
    cycle,
    estimate,
    nodes_for,
    speedup_table,
)
from malleable.estimators.remaining import remaining_from_history
from malleable.estimators.state import EstimatorState, update
from malleable.estimators.table import SpeedupTable, candidate_grid, feasible_mask
from malleable.estimators.throughput import fit_power_law, fit_throughput, iteration_time

__all__ = [
    "ClusterDefault", "CurveStats", "EstimateFlags", "Estimates", "EstimatorConfig",
    "EstimatorState", "GroupPrior", "JobSpecs", "ProgressBatch", "SpeedupTable", "ThroughputParams",
    "ThroughputPrior", "WorkHistory", "candidate_grid", "cycle", "estimate",
    "feasible_mask", "fit_power_law", "fit_throughput", "group_prior", "iteration_time", "noise_scale",
    "nodes_for", "optimal_batch", "predict_target", "prior_from_finished",
    "remaining_from_history", "speedup_table", "update",
]
