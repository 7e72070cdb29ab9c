"""Job truth model from a measured profile: step time, statistical efficiency, progress.

A `ModelProfile` answers, for one model of the Pollux T4 profiles
(``malleable/sim/data/pollux/profiles/<model>/``, see the README there), what a
real training job of that model would do: how long one iteration takes on a
placement at a per-GPU batch size, how much useful progress one iteration at a
global batch size makes at a point of training, which gradient statistics and
validation metric the job would log, and when it is done. The simulator's jobs
(`malleable.sim.jobs`) and the emulated Slurm job (``examples/emulated_job.py``)
both run on it. numpy only; nothing else is imported.

Units: times in seconds; batch sizes in samples (``local_bsz`` per GPU per
iteration, ``batch`` global); *progress* in Pollux's unit: iterations at the
model's smallest validated batch size ``m0`` weighted by statistical
efficiency, so that one iteration at batch ``m`` advances progress by
``gain(m) = E(m) * m / m0``. Progress times ``m0`` is samples at ``m0``.

Step time (`ModelProfile.step_time`), how it is interpolated:

* A placement is GPUs per node, e.g. ``(4, 4)`` or ``(2,)``. If it (up to rotation,
  as the profile stores it) was measured in ``placements.csv`` (1 to 4 nodes,
  1 to 4 GPUs per node), its own curve is used.
* Otherwise the curves are averaged per (nodes n, GPUs k) over the measured
  placements plus ``scalability.csv`` (6, 8, 12, 16 nodes), and interpolated
  bilinearly in (n, r = k/n): linearly in r between the measured GPU counts of a
  node count, then linearly in n between the two measured node counts around n.
  Beyond 16 nodes the 16-node curves are used (as Pollux's simulator clamps n to
  16); beyond 4 GPUs per node the 4-per-node curve is used (the profiles were
  measured on 4-GPU nodes).
* Along the per-GPU batch size, curves are interpolated linearly: compute time
  is affine in ``local_bsz`` (``T = alpha + beta * b``, Pollux's model), and
  linear interpolation reproduces Pollux's own simulator within the measured
  range. Below the smallest measured size the value at that size is used (fixed
  per-iteration overheads dominate there); above the largest, the last segment
  is extrapolated (never below the last measured value).
* Above ``max_local_bsz`` the job accumulates gradients (as Pollux's jobs do):
  ``s = ceil(b / max_local_bsz)`` micro-steps of ``ceil(b / s)`` samples, and the
  step takes ``T(b') + (s - 1) * (T(b') - T_sync(b'))``.

Statistical efficiency (`ModelProfile.efficiency`), from the validation curves:
the per-epoch gradient statistics ``grad_sqr`` and ``grad_var`` measured at each
validated batch size (linearly interpolated between them, clamped outside)
give Pollux's gain ``gain(m) = (var + sqr) / (var / s + sqr)`` with
``s = m / m0`` (Qiao et al., OSDI'21, eq. 5 with the gradient noise scale
``phi = m0 * var / sqr``), and ``E(m) = gain(m) / s = (phi + m0) / (phi + m)``.
Epoch ``e`` ends at the smallest cumulative ``progress`` any batch size needs for
it; the job is done after the model's Pollux epoch count (bert 2, cifar10 100,
deepspeech2 80, imagenet 90, ncf 10, yolov3 50).

Restart cost defaults (seconds lost per checkpoint-restart: save, queue, start,
load, warm-up), from published measurements on the Pollux testbed as collected
in the project's issue 10: deepspeech2 25, cifar10 30, yolov3 45, bert 120,
imagenet 250. ncf: 25, our choice: NCF on MovieLens is the smallest model and
data set of the six (a checkpoint of a few MB, ratings that load in about a
second), so its restart is the fixed start-up floor (process launch, CUDA and
NCCL initialisation) that the two smallest measured models show (25 to 30 s);
we take the lower value. All are configurable (`load_profile`).
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Where the vendored Pollux profiles live.
DATA_DIR = Path(__file__).resolve().parent / "data" / "pollux"
PROFILES_DIR = DATA_DIR / "profiles"

#: The six models of the Pollux T4 profiles.
MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

#: Epochs to train, as in Pollux's simulator (applications.py, osdi21-artifact).
POLLUX_EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90,
                 "ncf": 10, "yolov3": 50}

#: Default restart cost per model, seconds (see the module docstring for sources).
RESTART_COST_S = {"deepspeech2": 25.0, "cifar10": 30.0, "yolov3": 45.0, "bert": 120.0,
                  "imagenet": 250.0, "ncf": 25.0}

#: Per-GPU batch limits that differ from the largest size in placements.csv (Pollux).
MAX_LOCAL_BSZ = {"yolov3": 8}


class ProfileError(ValueError):
    """A profile file is missing or malformed; the message names file, line, field, value."""


# ----------------------------------------------------------------------------- parsing


def _read_csv(path: Path, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of a CSV with a header that contains ``fields``; raises ProfileError otherwise."""
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile file: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        missing = [f for f in fields if f not in (reader.fieldnames or ())]
        if missing:
            raise ProfileError(f"{path}: header lacks field(s) {', '.join(missing)} "
                               f"(found {reader.fieldnames})")
        return list(reader)


def _num(path: Path, line: int, row: dict[str, str], name: str, *, positive: bool = False,
         integer: bool = False) -> float:
    raw = row.get(name)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ProfileError(f"{path}:{line}: field {name}={raw!r} is not a number") from None
    if not math.isfinite(value) or (positive and value <= 0) or value < 0 \
            or (integer and value != int(value)):
        kind = "a positive integer" if integer else "a positive number" if positive \
            else "a finite non-negative number"
        raise ProfileError(f"{path}:{line}: field {name}={raw!r} must be {kind}")
    return value


def normalize_placement(placement: Sequence[int] | int) -> tuple[int, ...]:
    """GPUs per node as a tuple of positive ints, empty nodes dropped.

    ``placement`` is a sequence such as ``(4, 4)`` or an int ``k`` (one node).

    Raises:
        ValueError: a count is not a non-negative integer, or no GPU at all.
    """
    if isinstance(placement, (int, np.integer)):
        placement = (int(placement),)
    out = []
    for g in placement:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 0:
            raise ValueError(f"placement {tuple(placement)!r}: GPUs per node must be "
                             f"non-negative integers, got {g!r}")
        if g:
            out.append(int(g))
    if not out:
        raise ValueError(f"placement {tuple(placement)!r} has no GPU")
    return tuple(out)


def spread(gpus: int, nodes: int) -> tuple[int, ...]:
    """``gpus`` spread as evenly as possible over ``nodes`` nodes, e.g. (5, 2) -> (3, 2).

    Raises:
        ValueError: ``gpus < 1``, ``nodes < 1`` or ``nodes > gpus``.
    """
    if gpus < 1 or nodes < 1 or nodes > gpus:
        raise ValueError(f"cannot spread {gpus} GPUs over {nodes} nodes")
    base, extra = divmod(gpus, nodes)
    return (base + 1,) * extra + (base,) * (nodes - extra)


def pack(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """``gpus`` on as few nodes as possible: full nodes, then the rest, e.g. (6, 4) -> (4, 2).

    Raises:
        ValueError: ``gpus < 1`` or ``gpus_per_node < 1``.
    """
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError(f"cannot pack {gpus} GPUs on nodes of {gpus_per_node}")
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def _canonical(placement: tuple[int, ...]) -> tuple[int, ...]:
    """The lexicographically smallest rotation (the form placements.csv stores)."""
    return min(placement[i:] + placement[:i] for i in range(len(placement)))


@dataclass(frozen=True)
class _Curve:
    """Step and sync time (s) against per-GPU batch size for one configuration."""

    bsz: np.ndarray    # (B,) increasing
    step: np.ndarray   # (B,)
    sync: np.ndarray   # (B,)

    def at(self, b: float) -> tuple[float, float]:
        bsz = self.bsz
        if b <= bsz[0] or len(bsz) == 1:
            i = 0 if b <= bsz[0] else -1
            return float(self.step[i]), float(self.sync[i])
        if b >= bsz[-1]:
            frac = (b - bsz[-2]) / (bsz[-1] - bsz[-2])
            step = self.step[-2] + frac * (self.step[-1] - self.step[-2])
            return max(float(step), float(self.step[-1])), float(self.sync[-1])
        return (float(np.interp(b, bsz, self.step)), float(np.interp(b, bsz, self.sync)))


def _curve(points: dict[float, list[tuple[float, float]]]) -> _Curve:
    bsz = np.array(sorted(points), dtype=float)
    step = np.array([np.mean([p[0] for p in points[b]]) for b in bsz])
    sync = np.array([np.mean([p[1] for p in points[b]]) for b in bsz])
    return _Curve(bsz, step, sync)


# ----------------------------------------------------------------------------- the model


class ModelProfile:
    """The measured truth model of one training job (see the module docstring).

    Attributes:
        name: model name ("cifar10", ...).
        epochs: epochs to train (the Pollux count by default).
        batch_sizes: (V,) validated global batch sizes, increasing.
        init_batch_size: m0, the smallest validated batch size (progress unit).
        max_batch_size: the largest validated batch size.
        min_local_bsz, max_local_bsz: per-GPU batch range (above the maximum the
            job accumulates gradients).
        restart_cost_s: seconds lost per checkpoint-restart.
        epoch_progress: (epochs,) cumulative progress at the end of each epoch.
        target_progress: progress at completion (``epoch_progress[-1]``).
        progress_per_epoch: mean progress per epoch (``target_progress / epochs``).
        metric_higher_is_better: True for accuracy-like metrics, False for losses.
        source: directory the profile was read from.
    """

    def __init__(self, directory: Path, *, epochs: int | None = None,
                 restart_cost_s: float | None = None, max_local_bsz: int | None = None):
        directory = Path(directory)
        name = directory.name
        self.name = name
        self.source = directory
        self._load_placements(directory / "placements.csv", directory / "scalability.csv")
        self._load_validation(directory)
        available = self._iteration.shape[1]
        epochs = epochs if epochs is not None else POLLUX_EPOCHS.get(name, available)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or not 1 <= epochs <= available:
            raise ProfileError(f"{directory}: epochs={epochs!r} must be an integer in "
                               f"1..{available} (rows of its validation files)")
        self.epochs = epochs
        self.epoch_progress = self._progress.min(axis=0)[:epochs].copy()
        self._bounds = self.epoch_progress.tolist()
        self.target_progress = float(self.epoch_progress[-1])
        self.progress_per_epoch = self.target_progress / epochs
        cost = restart_cost_s if restart_cost_s is not None else RESTART_COST_S.get(name, 30.0)
        if not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost >= 0):
            raise ProfileError(f"{name}: restart_cost_s={cost!r} must be a number >= 0")
        self.restart_cost_s = float(cost)
        mlb = max_local_bsz if max_local_bsz is not None else MAX_LOCAL_BSZ.get(name)
        self.max_local_bsz = int(mlb) if mlb is not None else int(self._all_bsz_max)
        if self.max_local_bsz < self.min_local_bsz:
            raise ProfileError(f"{name}: max_local_bsz={self.max_local_bsz} is below the "
                               f"smallest measured per-GPU batch {self.min_local_bsz}")
        self._step_cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = {}
        self._best_cache: dict[tuple[tuple[int, ...], int], int] = {}
        self._rows_cache: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._iso_cache: dict[tuple[tuple[int, ...], float | None], float] = {}

    def __repr__(self) -> str:
        return (f"ModelProfile({self.name!r}, epochs={self.epochs}, m0={self.init_batch_size}, "
                f"restart_cost_s={self.restart_cost_s})")

    # ------------------------------------------------------------------ loading

    def _load_placements(self, placements: Path, scalability: Path) -> None:
        fields = ("placement", "local_bsz", "step_time", "sync_time")
        by_placement: dict[tuple[int, ...], dict[float, list[tuple[float, float]]]] = {}
        by_nk: dict[tuple[int, int], dict[float, list[tuple[float, float]]]] = {}
        bsz_all: list[float] = []
        for line, row in enumerate(_read_csv(placements, fields), start=2):
            raw = row["placement"]
            if not raw.isdigit() or "0" in raw:
                raise ProfileError(f"{placements}:{line}: field placement={raw!r} must be "
                                   "digits 1-9, one per node")
            pl = tuple(int(c) for c in raw)
            b = _num(placements, line, row, "local_bsz", positive=True, integer=True)
            st = _num(placements, line, row, "step_time", positive=True)
            sy = _num(placements, line, row, "sync_time")
            by_placement.setdefault(_canonical(pl), {}).setdefault(b, []).append((st, sy))
            by_nk.setdefault((len(pl), sum(pl)), {}).setdefault(b, []).append((st, sy))
            bsz_all.append(b)
        fields = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
        for line, row in enumerate(_read_csv(scalability, fields), start=2):
            n = int(_num(scalability, line, row, "num_nodes", positive=True, integer=True))
            k = int(_num(scalability, line, row, "num_replicas", positive=True, integer=True))
            if k < n:
                raise ProfileError(f"{scalability}:{line}: field num_replicas={k} is below "
                                   f"num_nodes={n}")
            b = _num(scalability, line, row, "local_bsz", positive=True, integer=True)
            st = _num(scalability, line, row, "step_time", positive=True)
            sy = _num(scalability, line, row, "sync_time")
            by_nk.setdefault((n, k), {}).setdefault(b, []).append((st, sy))
        if not by_placement:
            raise ProfileError(f"{placements}: no rows")
        self._placements = {pl: _curve(pts) for pl, pts in by_placement.items()}
        grid: dict[int, dict[int, _Curve]] = {}
        for (n, k), pts in by_nk.items():
            grid.setdefault(n, {})[k] = _curve(pts)
        self._levels = np.array(sorted(grid), dtype=float)
        self._grid = {n: (np.array(sorted(grid[n]), dtype=float),
                          [grid[n][k] for k in sorted(grid[n])]) for n in grid}
        self.min_local_bsz = int(min(bsz_all))
        self._all_bsz_max = max(bsz_all)

    def _load_validation(self, directory: Path) -> None:
        files = []
        for path in directory.glob("validation-*.csv"):
            stem = path.stem.split("-", 1)[1]
            if not stem.isdigit() or int(stem) < 1:
                raise ProfileError(f"{path}: file name must be validation-<global batch>.csv")
            files.append((int(stem), path))
        if not files:
            raise ProfileError(f"{directory}: no validation-<batch>.csv files")
        files.sort()
        fields = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
        cols: dict[str, list[list[float]]] = {f: [] for f in fields}
        for _, path in files:
            rows = _read_csv(path, fields)
            if not rows:
                raise ProfileError(f"{path}: no rows")
            for f in fields:
                cols[f].append([_num(path, i, r, f) if f != "metric" else
                                _metric(path, i, r) for i, r in enumerate(rows, start=2)])
        n_epochs = min(len(c) for c in cols["progress"])
        arr = {f: np.array([c[:n_epochs] for c in cols[f]]) for f in fields}
        self.batch_sizes = tuple(b for b, _ in files)
        self._bs = np.array(self.batch_sizes, dtype=float)
        self.init_batch_size = self.batch_sizes[0]
        self.max_batch_size = self.batch_sizes[-1]
        self._progress = arr["progress"]
        self._iteration = arr["iteration"]
        self._metric = arr["metric"]
        self._sqr = arr["grad_sqr"]
        self._var = arr["grad_var"]
        first, last = self._metric[:, 0].mean(), self._metric[:, -1].mean()
        self.metric_higher_is_better = bool(last >= first)

    # ------------------------------------------------------------------ step time

    def _grid_at(self, n: int, k: int, b: float) -> tuple[float, float]:
        levels = self._levels
        r = k / n
        nc = min(max(float(n), levels[0]), levels[-1])
        hi = int(np.searchsorted(levels, nc))
        if levels[hi] == nc:
            return self._level_at(int(nc), r * nc, b)
        lo_n, hi_n = int(levels[hi - 1]), int(levels[hi])
        s_lo, y_lo = self._level_at(lo_n, r * lo_n, b)
        s_hi, y_hi = self._level_at(hi_n, r * hi_n, b)
        w = (nc - lo_n) / (hi_n - lo_n)
        return s_lo + w * (s_hi - s_lo), y_lo + w * (y_hi - y_lo)

    def _level_at(self, n: int, kq: float, b: float) -> tuple[float, float]:
        ks, curves = self._grid[n]
        if kq <= ks[0]:
            return curves[0].at(b)
        if kq >= ks[-1]:
            return curves[-1].at(b)
        hi = int(np.searchsorted(ks, kq))
        if ks[hi] == kq:
            return curves[hi].at(b)
        s_lo, y_lo = curves[hi - 1].at(b)
        s_hi, y_hi = curves[hi].at(b)
        w = (kq - ks[hi - 1]) / (ks[hi] - ks[hi - 1])
        return s_lo + w * (s_hi - s_lo), y_lo + w * (y_hi - y_lo)

    def _atomic(self, placement: tuple[int, ...], b: float) -> tuple[float, float]:
        key = (placement, b)
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        curve = self._placements.get(_canonical(placement))
        out = curve.at(b) if curve is not None else \
            self._grid_at(len(placement), sum(placement), b)
        self._step_cache[key] = out
        return out

    def step_time(self, placement: Sequence[int] | int, local_bsz: float) -> float:
        """Seconds per iteration (one optimizer step) at ``local_bsz`` samples per GPU.

        Args:
            placement: GPUs per node, e.g. ``(4, 4)``, ``(2,)`` or ``2``.
            local_bsz: per-GPU batch size (> 0); above ``max_local_bsz`` gradients
                are accumulated over several micro-steps.

        Raises:
            ValueError: a bad placement or a non-positive batch size.
        """
        pl = normalize_placement(placement)
        b = float(local_bsz)
        if not (b > 0) or not math.isfinite(b):
            raise ValueError(f"local_bsz must be a positive number, got {local_bsz!r}")
        if b <= self.max_local_bsz:
            return self._atomic(pl, b)[0]
        steps = math.ceil(b / self.max_local_bsz - 1e-9)
        atomic = math.ceil(b / steps - 1e-9)
        step, sync = self._atomic(pl, float(atomic))
        return step + (steps - 1) * (step - sync)

    def throughput(self, gpus: int, nodes: int, batch: float) -> float:
        """Training samples per second at ``gpus`` GPUs on ``nodes`` nodes and global ``batch``.

        The GPUs are spread evenly over the nodes (`spread`) and the batch evenly
        over the GPUs (``local_bsz = batch / gpus``, fractional allowed).

        Raises:
            ValueError: impossible ``gpus``/``nodes`` or a non-positive ``batch``.
        """
        if not (batch > 0):
            raise ValueError(f"batch must be positive, got {batch!r}")
        return float(batch) / self.step_time(spread(int(gpus), int(nodes)), batch / gpus)

    # ------------------------------------------------------------------ statistical efficiency

    def epoch_at(self, progress: float) -> int:
        """Completed epochs at ``progress`` (0 .. epochs)."""
        return bisect.bisect_right(self._bounds, progress + 1e-9)

    def _rows_at(self, batch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-epoch (grad_sqr, grad_var, metric), each (epochs,), at global ``batch``:
        linear between the two validated batch sizes around it, clamped outside."""
        key = float(batch)
        hit = self._rows_cache.get(key)
        if hit is not None:
            return hit
        bs = self._bs
        if key <= bs[0] or len(bs) == 1:
            lo = hi = 0 if key <= bs[0] else len(bs) - 1
            w = 0.0
        elif key >= bs[-1]:
            lo = hi = len(bs) - 1
            w = 0.0
        else:
            hi = int(np.searchsorted(bs, key))
            lo = hi - 1
            w = (key - bs[lo]) / (bs[hi] - bs[lo])
        E = self.epochs
        rows = tuple((1.0 - w) * t[lo, :E] + w * t[hi, :E]
                     for t in (self._sqr, self._var, self._metric))
        self._rows_cache[key] = rows  # type: ignore[assignment]
        return rows  # type: ignore[return-value]

    def grad_stats(self, progress: float, batch: float | None = None) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` a job at ``batch`` (default m0) logs during the epoch
        that ``progress`` falls in (the profile's per-epoch values, interpolated
        linearly between validated batch sizes, clamped outside them)."""
        m = self.init_batch_size if batch is None else batch
        e = min(self.epoch_at(progress), self.epochs - 1)
        sqr, var, _ = self._rows_at(m)
        return float(sqr[e]), float(var[e])

    def gain(self, batch: float, progress: float) -> float:
        """Progress per iteration at global ``batch``: ``E(batch) * batch / m0`` (Pollux eq. 5)."""
        if not (batch > 0):
            raise ValueError(f"batch must be positive, got {batch!r}")
        sqr, var = self.grad_stats(progress, batch)
        scale = batch / self.init_batch_size
        return (var + sqr) / (var / scale + sqr)

    def efficiency(self, batch: float, progress: float) -> float:
        """Statistical efficiency ``E(batch) = (phi + m0) / (phi + batch)`` at ``progress``.

        Progress per sample at ``batch`` relative to ``m0``, in (0, 1] for
        ``batch >= m0``. Raises ValueError for a non-positive batch.
        """
        return self.gain(batch, progress) * self.init_batch_size / batch

    def noise_scale(self, progress: float, batch: float | None = None) -> float:
        """The gradient noise scale ``phi = m0 * grad_var / grad_sqr`` in samples."""
        sqr, var = self.grad_stats(progress, batch)
        return self.init_batch_size * var / sqr

    def goodput(self, placement: Sequence[int] | int, batch: float, progress: float) -> float:
        """Progress per second at global ``batch`` on ``placement``: ``gain / step_time``.

        The batch is split evenly over the placement's GPUs.
        """
        pl = normalize_placement(placement)
        return self.gain(batch, progress) / self.step_time(pl, batch / sum(pl))

    def metric(self, progress: float, batch: float | None = None) -> float | None:
        """Validation metric after the last completed epoch at ``progress`` (None before
        the first), interpolated between validated batch sizes at ``batch`` (default m0)."""
        e = self.epoch_at(progress)
        if e == 0:
            return None
        m = self.init_batch_size if batch is None else batch
        return float(self._rows_at(m)[2][min(e, self.epochs) - 1])

    # ------------------------------------------------------------------ batch sizes and time

    def default_batch(self, gpus: int) -> int:
        """Pollux's starting batch for ``gpus`` GPUs: ``max(m0, min_local_bsz * gpus)``,
        at most ``max_batch_size``."""
        return int(min(self.max_batch_size, max(self.init_batch_size, self.min_local_bsz * gpus)))

    def best_batch(self, placement: Sequence[int] | int, progress: float) -> int:
        """The global batch in [max(m0, min_local_bsz*k), max_batch_size] that maximises
        truth goodput on ``placement`` at ``progress`` (an oracle for AdaptDL's own choice).

        Candidates: the validated sizes and 24 geometric steps, each rounded to a
        whole per-GPU batch (``ceil(m / k) * k``).
        """
        pl = normalize_placement(placement)
        epoch = min(self.epoch_at(progress), self.epochs - 1)
        key = (pl, epoch)
        hit = self._best_cache.get(key)
        if hit is not None:
            return hit
        k = sum(pl)
        lo = max(self.init_batch_size, self.min_local_bsz * k)
        hi = max(lo, self.max_batch_size)
        cands = set(np.geomspace(lo, hi, 24).tolist()) | {b for b in self._bs if lo <= b <= hi}
        best, best_val = lo, -1.0
        for m in sorted(cands):
            eff = math.ceil(m / k - 1e-9) * k
            if eff > hi:
                eff = max(k, (int(hi) // k) * k)
            val = self.gain(eff, progress) / self.step_time(pl, eff / k)
            if val > best_val:
                best, best_val = eff, val
        self._best_cache[key] = int(best)
        return int(best)

    def isolated_time(self, gpus: float, batch: float | None = None,
                      gpus_per_node: int = 4, placement: Sequence[int] | None = None) -> float:
        """Seconds to train from scratch to the target alone on ``gpus`` GPUs, no restarts.

        ``gpus`` are packed on nodes of ``gpus_per_node`` (`pack`), unless an integer
        ``gpus`` comes with its ``placement``; the global batch is ``batch`` (default
        `default_batch`), rounded up to a whole per-GPU batch. A fractional share
        below 1 GPU is time-sliced (time / share); between two integers the time is
        interpolated linearly. Used for finish-time fairness.

        Raises:
            ValueError: ``gpus <= 0``, or a ``placement`` that does not hold ``gpus``.
        """
        if not (gpus > 0):
            raise ValueError(f"gpus must be positive, got {gpus!r}")
        if placement is not None:
            pl = normalize_placement(placement)
            if sum(pl) != gpus:
                raise ValueError(f"placement {pl} does not hold {gpus} GPUs")
            return self._isolated(pl, batch)
        if gpus < 1:
            return self.isolated_time(1, batch, gpus_per_node) / gpus
        lo = int(math.floor(gpus))
        if gpus != lo:
            t_lo = self.isolated_time(lo, batch, gpus_per_node)
            t_hi = self.isolated_time(lo + 1, batch, gpus_per_node)
            return t_lo + (gpus - lo) * (t_hi - t_lo)
        return self._isolated(pack(lo, gpus_per_node), batch)

    def _isolated(self, pl: tuple[int, ...], batch: float | None) -> float:
        key = (pl, None if batch is None else float(batch))
        hit = self._iso_cache.get(key)
        if hit is not None:
            return hit
        k = sum(pl)
        m = self.default_batch(k) if batch is None else batch
        local = math.ceil(m / k - 1e-9)
        eff = local * k
        step = self.step_time(pl, local)
        sqr, var, _ = self._rows_at(eff)
        scale = eff / self.init_batch_size
        gains = (var + sqr) / (var / scale + sqr)                       # (epochs,)
        widths = np.diff(np.concatenate(([0.0], self.epoch_progress)))  # progress per epoch
        total = float(np.sum(widths * step / gains))
        self._iso_cache[key] = total
        return total


def _metric(path: Path, line: int, row: dict[str, str]) -> float:
    raw = row.get("metric")
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ProfileError(f"{path}:{line}: field metric={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ProfileError(f"{path}:{line}: field metric={raw!r} must be finite")
    return value


@functools.lru_cache(maxsize=64)
def _load_cached(directory: Path, epochs: int | None, restart_cost_s: float | None,
                 max_local_bsz: int | None) -> ModelProfile:
    return ModelProfile(directory, epochs=epochs, restart_cost_s=restart_cost_s,
                        max_local_bsz=max_local_bsz)


def load_profile(model: str, *, directory: str | Path | None = None, epochs: int | None = None,
                 restart_cost_s: float | None = None,
                 max_local_bsz: int | None = None) -> ModelProfile:
    """The truth model of ``model`` (one of `MODELS`), loaded once and cached.

    Args:
        model: model name; with ``directory`` unset, a folder of the vendored profiles.
        directory: a profile folder of the same layout (placements.csv,
            scalability.csv, validation-<batch>.csv), e.g. another GPU type's.
        epochs: epochs to train (default: the Pollux count).
        restart_cost_s: seconds per checkpoint-restart (default: `RESTART_COST_S`).
        max_local_bsz: per-GPU batch limit (default: `MAX_LOCAL_BSZ` or the profile's largest).

    Raises:
        ProfileError: unknown model, missing or malformed files, bad parameters.
    """
    if directory is None:
        if model not in MODELS:
            raise ProfileError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        path = PROFILES_DIR / model
    else:
        path = Path(directory)
        if not path.is_dir():
            raise ProfileError(f"profile directory {str(path)!r} does not exist")
    return _load_cached(path.resolve(), epochs, restart_cost_s, max_local_bsz)
