"""What the estimators read: job specs and progress samples, as arrays.

The daemon builds these from its database and the simulator from its jobs;
both pass the same records. Rows are jobs 0..J-1 in the caller's order (the
caller keeps the mapping from job id to row; `EstimatorState.take` follows
a reordering).

Progress samples are the job contract's progress lines (JSON, version 1):
``{"v":1,"t":<unix s>,"event":"progress","step":..,"samples":..,"gpus":..,
"nodes":..,"batch":..,"metric":..,"grad_sqr":..,"grad_var":..}``;
`ProgressBatch.from_records` turns a list of such dicts into arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

import numpy as np

_NAN_DEFAULTS = ("max_batch", "max_local_batch", "target_samples", "target_epochs",
                 "samples_per_epoch", "target_steps", "target_metric", "grad_ref_batch")


@dataclass(frozen=True)
class JobSpecs:
    """The malleable jobs' declared specs, as parallel (J,) arrays.

    Required:
        min_gpus, max_gpus, step: int, feasible sizes
            (`malleable.estimators.table.feasible_mask`).
        init_batch: float, m0, the initial (smallest) global batch, samples.

    Optional (NaN or -1 where not declared; omit to leave all undeclared):
        max_batch: largest global batch the job accepts (NaN: m0, i.e. the
            batch is not adapted).
        max_local_batch: largest per-GPU batch (NaN: no limit).
        target_samples: total work, samples at m0 (progress units).
        target_epochs, samples_per_epoch: total work = their product.
        target_steps: total work = target_steps * m0.
        target_metric: value of the validation metric that ends the job.
        metric_direction: +1 the metric rises to the target (accuracy), -1 it
            falls (loss). Default +1.
        grad_ref_batch: the batch size the job's ``grad_var`` refers to (see
            `malleable.estimators.efficiency`): > 0 a fixed batch (adaptdl
            convention: m0); NaN: the sample's own batch.
        history_group: int, which finished jobs are "like this one" for the
            remaining-work history (same name/user/model); -1: the whole cluster.

    Targets are in progress units (samples at m0): a job that keeps batch m0
    progresses one unit per sample; one that grows its batch progresses
    E(m) < 1 per sample (Pollux's definition).

    Raises:
        ValueError: an array whose shape is not (J,) (naming the field).
        Per-job bad values (m0 <= 0, min > max, ...) do not raise: see `bad`.
    """

    min_gpus: np.ndarray
    max_gpus: np.ndarray
    step: np.ndarray
    init_batch: np.ndarray
    max_batch: np.ndarray = field(default=None)  # type: ignore[assignment]
    max_local_batch: np.ndarray = field(default=None)  # type: ignore[assignment]
    target_samples: np.ndarray = field(default=None)  # type: ignore[assignment]
    target_epochs: np.ndarray = field(default=None)  # type: ignore[assignment]
    samples_per_epoch: np.ndarray = field(default=None)  # type: ignore[assignment]
    target_steps: np.ndarray = field(default=None)  # type: ignore[assignment]
    target_metric: np.ndarray = field(default=None)  # type: ignore[assignment]
    metric_direction: np.ndarray = field(default=None)  # type: ignore[assignment]
    grad_ref_batch: np.ndarray = field(default=None)  # type: ignore[assignment]
    history_group: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        J = np.shape(self.min_gpus)[0] if np.ndim(self.min_gpus) == 1 else -1
        if J < 0:
            raise ValueError(f"JobSpecs.min_gpus must be a 1-d array, got shape "
                             f"{np.shape(self.min_gpus)}")
        ints = {"min_gpus", "max_gpus", "step", "history_group"}
        for f in fields(self):
            val = getattr(self, f.name)
            if val is None:
                if f.name in _NAN_DEFAULTS:
                    val = np.full(J, np.nan)
                elif f.name == "metric_direction":
                    val = np.ones(J, dtype=np.int64)
                else:  # history_group
                    val = np.full(J, -1, dtype=np.int64)
            dtype = np.int64 if f.name in ints or f.name == "metric_direction" else np.float64
            try:
                arr = np.asarray(val, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"JobSpecs.{f.name} must be numeric, got {val!r}") from exc
            if arr.shape != (J,):
                raise ValueError(f"JobSpecs.{f.name} must have shape ({J},), got {arr.shape}")
            if dtype is np.int64:
                arr = np.where(np.isfinite(arr), arr, -1).astype(np.int64)
            object.__setattr__(self, f.name, arr)

    def __len__(self) -> int:
        return int(self.min_gpus.shape[0])

    @property
    def bad(self) -> np.ndarray:
        """(J,) bool, jobs whose spec is unusable: m0 not > 0, min_gpus < 1,
        max_gpus < min_gpus, or step < 1. They get only k = 0 and ``BAD_SPEC``."""
        m0 = self.init_batch
        return (~np.isfinite(m0) | (m0 <= 0) | (self.min_gpus < 1)
                | (self.max_gpus < self.min_gpus) | (self.step < 1))

    def declared_work(self, steps: bool = True) -> np.ndarray:
        """(J,) total work declared, samples at m0; NaN where none.

        The first declared of: target_samples; target_epochs * samples_per_epoch;
        target_steps * m0 (only if ``steps``). Non-positive or non-finite values
        count as undeclared. (A step target is the job's own steps: once it has
        logged, the estimators count what is left from its last step and batch.)
        """
        def pos(a):
            return np.where(np.isfinite(a) & (a > 0), a, np.nan)
        out = pos(self.target_samples)
        out = np.where(np.isnan(out), pos(self.target_epochs) * pos(self.samples_per_epoch), out)
        if not steps:
            return out
        return np.where(np.isnan(out), pos(self.target_steps) * pos(self.init_batch), out)


@dataclass(frozen=True)
class ProgressBatch:
    """New progress samples of many jobs, flattened: N samples, (N,) arrays.

    Attributes:
        job: int, the job's row (0..J-1). Samples of one job must be in time
            order; jobs may interleave (the batch is sorted by (job, t) if not
            already).
        t: unix time of the sample, seconds.
        step: cumulative optimizer steps.
        samples: cumulative training samples processed.
        gpus: k, GPUs the job ran on; nodes: n, nodes it spanned.
        batch: m, its global batch size (samples per step).
        metric: validation metric (NaN: none in this sample).
        grad_sqr, grad_var: gradient statistics (NaN: none); see
            `malleable.estimators.efficiency`.
        restart: the run the sample belongs to (Slurm's restart count; NaN:
            unknown, treated as one run).

    Throughput is measured between consecutive samples of a job at the same
    (k, n, m) in the same run: delta samples / delta t. An interval across a
    checkpoint-requeue holds the queueing and restart time, so it is never a
    throughput sample, even when the job restarts at the same size. Bad values (NaN, negative, time going
    backwards) never raise; the estimators drop them and count them
    (``REJECTED_SAMPLES``).

    Raises:
        ValueError: arrays of different lengths (naming the field).
    """

    job: np.ndarray
    t: np.ndarray
    step: np.ndarray
    samples: np.ndarray
    gpus: np.ndarray
    nodes: np.ndarray
    batch: np.ndarray
    metric: np.ndarray = field(default=None)  # type: ignore[assignment]
    grad_sqr: np.ndarray = field(default=None)  # type: ignore[assignment]
    grad_var: np.ndarray = field(default=None)  # type: ignore[assignment]
    restart: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        job = np.asarray(self.job)
        if job.ndim != 1:
            raise ValueError(f"ProgressBatch.job must be 1-d, got shape {job.shape}")
        N = job.shape[0]
        object.__setattr__(self, "job", job.astype(np.int64))
        for f in fields(self)[1:]:
            val = getattr(self, f.name)
            arr = np.full(N, np.nan) if val is None else np.asarray(val, dtype=np.float64)
            if arr.shape != (N,):
                raise ValueError(f"ProgressBatch.{f.name} must have shape ({N},), got {arr.shape}")
            object.__setattr__(self, f.name, arr)

    def __len__(self) -> int:
        return int(self.job.shape[0])

    @classmethod
    def from_records(cls, rows: Iterable[int], records: Iterable[Mapping],
                     gpus_per_node: int | None = None) -> ProgressBatch:
        """Build a batch from progress-line dicts (job contract, version 1).

        Args:
            rows: the job row of each record.
            records: dicts with keys t, step, samples, gpus, nodes, batch and
                optionally metric, grad_sqr, grad_var ("batch_size" and "time",
                as the database names them, are accepted for "batch" and "t";
                "time" must then be unix seconds). Missing or non-numeric
                values become NaN (and the sample is dropped later); records
                whose "event" is not "progress" are skipped.
            gpus_per_node: if given, a missing "nodes" is filled in as
                `with_nodes_filled` does.
        """
        keys = ("t", "step", "samples", "gpus", "nodes", "batch", "metric", "grad_sqr",
                "grad_var", "restart")
        alias = {"t": "time", "batch": "batch_size"}
        cols: dict[str, list[float]] = {k: [] for k in keys}
        jobs: list[int] = []
        for row, rec in zip(rows, records, strict=True):
            if rec.get("event", "progress") != "progress":
                continue
            jobs.append(int(row))
            for k in keys:
                v = rec.get(k)
                if v is None and k in alias:
                    v = rec.get(alias[k])
                try:
                    cols[k].append(float(v) if v is not None else np.nan)
                except (TypeError, ValueError):
                    cols[k].append(np.nan)
        out = cls(job=np.asarray(jobs, dtype=np.int64),
                  **{k: np.asarray(v, dtype=np.float64) for k, v in cols.items()})
        return out if gpus_per_node is None else out.with_nodes_filled(gpus_per_node)

    def with_nodes_filled(self, gpus_per_node: int) -> ProgressBatch:
        """A copy where a missing (NaN) node count is what the grid's rule gives:
        1 node for ``gpus <= gpus_per_node``, else ``ceil(gpus / gpus_per_node)``.

        Raises:
            ValueError: gpus_per_node < 1.
        """
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
        with np.errstate(invalid="ignore"):
            guess = np.where(self.gpus <= gpus_per_node, 1.0, np.ceil(self.gpus / gpus_per_node))
        nodes = np.where(np.isnan(self.nodes), guess, self.nodes)
        return ProgressBatch(**{f.name: (nodes if f.name == "nodes" else getattr(self, f.name))
                                for f in fields(self)})


class WorkHistory:
    """Total work of finished jobs, for remaining-work estimates without a target.

    Args:
        total_work: (H,) float, each finished job's total work, samples at m0.
        group: (H,) int, its group (same name/user/model; matches
            `JobSpecs.history_group`); default all 0.

    Non-finite or non-positive totals are dropped.

    Raises:
        ValueError: shapes differ.
    """

    def __init__(self, total_work: np.ndarray, group: np.ndarray | None = None) -> None:
        tw = np.asarray(total_work, dtype=np.float64).reshape(-1)
        gr = np.zeros(tw.shape, dtype=np.int64) if group is None else np.asarray(group).reshape(-1)
        if gr.shape != tw.shape:
            raise ValueError(f"WorkHistory.group must have shape {tw.shape}, got {gr.shape}")
        ok = np.isfinite(tw) & (tw > 0)
        order = np.lexsort((tw[ok], gr[ok]))
        self.total_work = tw[ok][order]
        self.group = gr[ok][order].astype(np.int64)

    def __len__(self) -> int:
        return int(self.total_work.shape[0])
