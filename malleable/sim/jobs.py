"""Simulated jobs: programs that `SimSlurm` runs in place of batch scripts.

`ProfileJob` is a malleable training job driven by the truth model of
`malleable.sim.profiles`: while it runs it advances its progress at the
model's goodput for its current placement and global batch size, appends
progress lines to its file in a spool directory, checkpoints when it gets its
checkpoint signal, resumes from the checkpoint after a requeue at whatever size
Slurm gives it, and exits when it reaches its target. `RigidJob` runs for a
fixed time and ignores everything (an ordinary job).

The restart cost ``delta`` of a model (`ModelProfile.restart_cost_s`) is split
in two: ``save_s = save_fraction * delta`` spent saving after the checkpoint
signal, and ``resume_s = delta - save_s`` spent at every start before training
resumes (process start, checkpoint load, warm-up). Pollux's simulator charges
its whole restart cost at every (re)allocation including the first; here the
first start pays ``resume_s`` and every requeue pays ``save_s + resume_s`` plus
whatever time the job spends pending in Slurm. No published source splits the
cost; the default ``save_fraction = 0.1`` is an assumption (a checkpoint of these
models is 5 MB to 1.3 GB, written in seconds, while start-up dominates).

Progress lines (format version 1; the job contract's parser owns the format):
one JSON object per line, keys in this order: ``v`` (1), ``t`` (Unix seconds,
float), ``job`` (Slurm id), ``event`` ("started", "progress", "checkpointed",
"finished"), ``step`` (cumulative iterations), ``samples`` (cumulative
samples), ``gpus``, ``nodes``, ``batch`` (global batch size), then when known
``metric``, ``grad_sqr``, ``grad_var``, then ``restart`` (restart count) and,
on "checkpointed", ``path``. A line is written by `write_progress_line`, the
one place to switch to the shared writer later.

After a requeue a job resumes from its last checkpoint: work done after it (a
requeue without a checkpoint signal) is lost, so ``step`` can go back.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from malleable.progress.reporter import PLAN_SUFFIX, parse_plan
from malleable.sim.engine import Event
from malleable.sim.profiles import ModelProfile
from malleable.sim.slurm import Run
from malleable.slurm.records import JobState, SignalTarget

PROGRESS_VERSION = 1

#: ``sink(path, record)`` appends one progress record; the default writes a JSON line.
ProgressSink = Callable[[Path, dict[str, Any]], None]


def progress_path(spool_dir: str | Path, job_id: str) -> Path:
    """The progress file of job ``job_id`` in ``spool_dir``: ``<spool_dir>/<job_id>.jsonl``."""
    return Path(spool_dir) / f"{job_id}.jsonl"


def write_progress_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to ``path`` as one compact JSON line (keys in the given order).

    Raises:
        OSError: the file cannot be opened or written.
    """
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(_line(record))


def _line(record: dict[str, Any]) -> str:
    """``record`` as one compact JSON line with its newline (keys in the given order)."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"


class ProgressFiles:
    """A `ProgressSink` that keeps the progress files it appends to open (at most
    ``max_open`` of them; the least recently written is closed first), instead of
    opening and closing a file per line as `write_progress_line` does: a run's jobs
    write a line every report interval each.

    A line is written whole and flushed before the call returns (line-buffered), so
    a reader sees it at once, as it would see `write_progress_line`'s. `close`
    closes every file (also on leaving a ``with`` block).

    Args:
        max_open: open files kept, >= 1 (default 256, well under the usual limit of
            1,024 descriptors per process).

    Raises:
        ValueError: ``max_open`` < 1.
        OSError: (when called) the file cannot be opened or written.
    """

    def __init__(self, max_open: int = 256):
        if not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an integer >= 1, got {max_open!r}")
        self.max_open = max_open
        self._files: OrderedDict[Path, TextIO] = OrderedDict()

    def __call__(self, path: Path, record: dict[str, Any]) -> None:
        line = _line(record)
        files = self._files
        fh = files.get(path)
        if fh is None:
            if len(files) >= self.max_open:
                files.popitem(last=False)[1].close()
            fh = files[path] = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        else:
            files.move_to_end(path)
        fh.write(line)

    def __len__(self) -> int:
        return len(self._files)

    def close(self) -> None:
        """Close every open file (a later call opens its file again)."""
        while self._files:
            self._files.popitem(last=False)[1].close()

    def __enter__(self) -> ProgressFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_record(*, t: float, job: str, event: str, step: int, samples: int, gpus: int,
                    nodes: int, batch: int, restart: int, metric: float | None = None,
                    grad_sqr: float | None = None, grad_var: float | None = None,
                    path: str | None = None) -> dict[str, Any]:
    """One progress record (format version 1) with its keys in the documented order.

    Raises:
        ValueError: an unknown event.
    """
    if event not in ("started", "progress", "checkpointed", "finished"):
        raise ValueError(f"progress event must be started|progress|checkpointed|finished, "
                         f"got {event!r}")
    rec: dict[str, Any] = {"v": PROGRESS_VERSION, "t": round(t, 3), "job": job, "event": event,
                           "step": step, "samples": samples, "gpus": gpus, "nodes": nodes,
                           "batch": batch}
    if metric is not None:
        rec["metric"] = metric
    if grad_sqr is not None:
        rec["grad_sqr"] = grad_sqr
    if grad_var is not None:
        rec["grad_var"] = grad_var
    rec["restart"] = restart
    if path is not None:
        rec["path"] = path
    return rec


class ProfileJob:
    """A malleable training job of one model, driven by its measured profile.

    Args:
        profile: the model's truth model (`malleable.sim.profiles.load_profile`).
        spool_dir: directory for the progress file (`progress_path`); None = write nothing.
        batch: global batch size to train at (rounded up to a whole per-GPU batch
            at each size); None = the profile's `default_batch` for the first size.
        adaptive_batch: pick the goodput-maximising batch at every start and
            epoch (`ModelProfile.best_batch`; an oracle for AdaptDL's own choice)
            instead of ``batch``.
        report_interval_s: seconds of training between "progress" lines.
        checkpoint_signal: signal name that makes it checkpoint ("USR1").
        signal_target: where its handler runs: a signal sent to this target or
            to FULL reaches it; others are recorded in ``missed_signals`` and ignored.
        save_fraction: share of the restart cost spent saving (see module docstring).
        shrink_in_place: False = a shrink kills it (exits FAILED), like a job
            whose processes cannot survive losing nodes.
        shrink_pause_s: training pause after an in-place shrink (default ``resume_s``).
        sink: how a progress record is written (default `write_progress_line`).
        follow_plan: at every start, train at the batch size of the daemon's plan file
            (``<spool>/<job>.plan.json``) when the plan is for the GPU count it starts
            on, as `malleable.progress.reporter.Reporter.recommended_batch_size` tells a
            real job (examples/emulated_job.py does); off by default (Pollux's
            artifact fixes the batch or tunes it itself: ``adaptive_batch``).

    Attributes:
        progress: progress so far (profile units); iterations, samples likewise
            (as of the job's last event; `advance` brings them up to now).
        done: True once it reached its target; finished_at the virtual time.
        checkpoints: number of checkpoints written.
    """

    def __init__(self, profile: ModelProfile, *, spool_dir: str | Path | None = None,
                 batch: int | None = None, adaptive_batch: bool = False,
                 report_interval_s: float = 30.0, checkpoint_signal: str = "USR1",
                 signal_target: SignalTarget = SignalTarget.BATCH, save_fraction: float = 0.1,
                 shrink_in_place: bool = True, shrink_pause_s: float | None = None,
                 sink: ProgressSink | None = None, follow_plan: bool = False):
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or batch < 1):
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        if not (report_interval_s > 0):
            raise ValueError(f"report_interval_s must be > 0, got {report_interval_s!r}")
        if not (0 <= save_fraction <= 1):
            raise ValueError(f"save_fraction must be in [0, 1], got {save_fraction!r}")
        self.profile = profile
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self.batch = batch
        self.adaptive_batch = adaptive_batch
        self.report_interval_s = float(report_interval_s)
        self.checkpoint_signal = checkpoint_signal.upper().removeprefix("SIG")
        self.signal_target = SignalTarget(signal_target)
        self.save_s = profile.restart_cost_s * save_fraction
        self.resume_s = profile.restart_cost_s - self.save_s
        self.shrink_in_place = shrink_in_place
        self.shrink_pause_s = self.resume_s if shrink_pause_s is None else float(shrink_pause_s)
        self.sink = sink if sink is not None else write_progress_line
        self.follow_plan = follow_plan
        self.progress = 0.0
        self.iterations = 0.0
        self.samples = 0.0
        self._ckpt = (0.0, 0.0, 0.0)
        self.checkpoints = 0
        self.done = False
        self.finished_at: float | None = None
        self.missed_signals: list[tuple[float, str, str]] = []
        self.run: Run | None = None
        self._phase = "stopped"  # stopped|resuming|reconfiguring|training|saving|checkpointed|done
        self._event: Event | None = None
        self._last = 0.0
        self._next_report = math.inf
        self._eff_batch = 0
        self._step_s = math.inf
        self._rate = 0.0          # progress per second while training

    # ------------------------------------------------------------------ SimProgram

    def on_start(self, run: Run) -> None:
        """Start (or resume from the checkpoint) on ``run.placement`` after ``resume_s``."""
        self.run = run
        self.progress, self.iterations, self.samples = self._ckpt
        if self.follow_plan and not self.adaptive_batch:
            self._apply_plan(run)
        if self.progress >= self.profile.target_progress - 1e-9:
            self._finish()
            return
        self._phase = "resuming"
        self._next_report = math.inf
        self._set_event(run.engine.now + self.resume_s, self._begin_training)

    def on_signal(self, signal: str, target: SignalTarget) -> None:
        """The checkpoint signal (reaching its handler) makes it save, then wait."""
        run = self.run
        if run is None:
            return
        if signal != self.checkpoint_signal or \
                target not in (self.signal_target, SignalTarget.FULL):
            self.missed_signals.append((run.engine.now, signal, str(target)))
            return
        if self._phase in ("resuming", "reconfiguring", "training"):
            self.advance()
            self._phase = "saving"
            self._set_event(run.engine.now + self.save_s, self._saved)
        elif self._phase == "checkpointed":
            self._write("checkpointed", path=self._ckpt_path())

    def on_shrink(self, placement: tuple[int, ...]) -> None:
        """Continue on fewer nodes after ``shrink_pause_s`` (or fail if it cannot)."""
        run = self.run
        if run is None:
            return
        if not self.shrink_in_place:
            self._cancel_event()
            self._phase = "done"
            run.exit(JobState.FAILED)
            return
        if self._phase == "training":
            self.advance()
            self._phase = "reconfiguring"
            self._set_event(run.engine.now + self.shrink_pause_s, self._begin_training)

    def on_kill(self, reason: str) -> None:
        """Processes gone: keep only the checkpoint."""
        self._cancel_event()
        self.run = None
        if self._phase != "done":
            self._phase = "stopped"
            self.progress, self.iterations, self.samples = self._ckpt

    # ------------------------------------------------------------------ public helpers

    def set_batch(self, batch: int) -> None:
        """Train at global ``batch`` from the next (re)start on (e.g. the plan's batch)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.batch = batch

    @property
    def phase(self) -> str:
        """stopped | resuming | reconfiguring | training | saving | checkpointed | done."""
        return self._phase

    @property
    def current_batch(self) -> int:
        """Global batch of the current or last run (0 before the first)."""
        return self._eff_batch

    # ------------------------------------------------------------------ internals

    def _set_event(self, at: float, callback: Callable[[], None]) -> None:
        self._cancel_event()
        assert self.run is not None
        self._event = self.run.engine.schedule(at, callback)

    def _cancel_event(self) -> None:
        if self._event is not None:
            self._event.cancel()
            self._event = None

    def _choose_batch(self, placement: tuple[int, ...]) -> int:
        k = sum(placement)
        if self.adaptive_batch:
            return self.profile.best_batch(placement, self.progress)
        if self.batch is None:
            self.batch = self.profile.default_batch(k)
        return math.ceil(self.batch / k - 1e-9) * k

    def _configure(self) -> None:
        """Batch, step time and progress rate for the current placement and epoch."""
        run = self.run
        assert run is not None
        pl = run.placement
        self._eff_batch = self._choose_batch(pl)
        self._step_s = self.profile.step_time(pl, self._eff_batch / sum(pl))
        self._rate = self.profile.gain(self._eff_batch, self.progress) / self._step_s

    def _begin_training(self) -> None:
        run = self.run
        assert run is not None
        now = run.engine.now
        self._last = now
        self._configure()
        if self.spool_dir is None:
            self._next_report = math.inf     # nothing to write: no report events at all
        elif not now <= self._next_report < math.inf:
            self._next_report = now + self.report_interval_s
        first = self._phase == "resuming"
        self._phase = "training"
        if first:
            self._write("started")
        self._schedule_next()

    def advance(self) -> None:
        """Bring ``progress``, ``iterations`` and ``samples`` up to the engine's clock
        (they are otherwise updated only at the job's own events); no-op when stopped."""
        run = self.run
        if run is None:
            return
        now = run.engine.now
        if self._phase == "training" and now > self._last:
            dt = now - self._last
            its = dt / self._step_s
            self.progress += dt * self._rate
            self.iterations += its
            self.samples += its * self._eff_batch
        self._last = now

    def _schedule_next(self) -> None:
        run = self.run
        assert run is not None
        now = run.engine.now
        prof = self.profile
        epoch = prof.epoch_at(self.progress)
        boundary = float(prof.epoch_progress[min(epoch, prof.epochs - 1)])
        t_boundary = now + max(0.0, boundary - self.progress) / self._rate
        if t_boundary <= self._next_report:
            self._set_event(t_boundary, self._on_boundary)
        else:
            self._set_event(self._next_report, self._on_report)

    def _on_report(self) -> None:
        self.advance()
        self._write("progress")
        self._next_report += self.report_interval_s
        self._schedule_next()

    def _on_boundary(self) -> None:
        self.advance()
        prof = self.profile
        epoch = prof.epoch_at(self.progress)
        boundary = float(prof.epoch_progress[min(epoch, prof.epochs - 1)])
        # Land exactly on the boundary that was aimed at (floating-point drift).
        if epoch < prof.epochs and boundary - self.progress < 1e-6 * max(1.0, boundary):
            self.progress = boundary
        if self.progress >= prof.target_progress - 1e-9:
            self._finish()
            return
        self._configure()
        self._schedule_next()

    def _saved(self) -> None:
        run = self.run
        assert run is not None
        self._ckpt = (self.progress, self.iterations, self.samples)
        self.checkpoints += 1
        self._phase = "checkpointed"
        self._event = None
        self._write("checkpointed", path=self._ckpt_path())

    def _finish(self) -> None:
        run = self.run
        assert run is not None
        self.progress = max(self.progress, self.profile.target_progress)
        self._ckpt = (self.progress, self.iterations, self.samples)
        self.done = True
        self.finished_at = run.engine.now
        self._phase = "done"
        self._event = None
        if self._eff_batch == 0:
            self._eff_batch = self._choose_batch(run.placement)
        self._write("finished")
        run.exit(JobState.COMPLETED)

    def _apply_plan(self, run: Run) -> None:
        """Take the plan's batch size if the plan is for this start's GPU count."""
        if self.spool_dir is None:
            return
        path = self.spool_dir / (run.job_id + PLAN_SUFFIX)
        try:
            plan = parse_plan(path.read_bytes(), run.job_id)
        except (OSError, ValueError):
            return    # no plan, or one a real job would also ignore
        if plan.batch is not None and plan.gpus == sum(run.placement):
            self.batch = int(plan.batch)

    def _ckpt_path(self) -> str:
        run = self.run
        job = run.job_id if run is not None else "unknown"
        base = self.spool_dir if self.spool_dir is not None else Path("checkpoints")
        return str(base / f"{job}.ckpt" / f"step-{int(self._ckpt[1])}")

    def _write(self, event: str, path: str | None = None) -> None:
        run = self.run
        if run is None or self.spool_dir is None:
            return
        prof = self.profile
        # Before its first training step (signalled while resuming) a job reports the
        # batch it is about to train at: a progress line's batch is at least 1.
        batch = self._eff_batch or self._choose_batch(run.placement)
        sqr, var = prof.grad_stats(self.progress, batch)
        rec = progress_record(t=run.engine.time(), job=run.job_id, event=event,
                              step=int(self.iterations), samples=int(self.samples),
                              gpus=run.gpus, nodes=run.nodes, batch=batch,
                              restart=run.restart_count, metric=prof.metric(self.progress, batch),
                              grad_sqr=sqr, grad_var=var, path=path)
        self.sink(progress_path(self.spool_dir, run.job_id), rec)


class RigidJob:
    """An ordinary (rigid) job: runs ``duration_s`` seconds from each start, then exits.

    Signals are recorded and ignored; a shrink changes nothing; a requeue restarts
    it from scratch (it does not checkpoint).

    Args:
        duration_s: run time per start, seconds (>= 0).
    """

    def __init__(self, duration_s: float):
        if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s)
                and duration_s >= 0):
            raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")
        self.duration_s = float(duration_s)
        self.signals: list[str] = []
        self.done = False
        self.finished_at: float | None = None
        self._run: Run | None = None
        self._event: Event | None = None

    def on_start(self, run: Run) -> None:
        """Run for ``duration_s``."""
        self._run = run
        self._event = run.engine.schedule_in(self.duration_s, self._end)

    def on_signal(self, signal: str, target: SignalTarget) -> None:
        """Recorded, no effect."""
        self.signals.append(signal)

    def on_shrink(self, placement: tuple[int, ...]) -> None:
        """No effect."""

    def on_kill(self, reason: str) -> None:
        """Stop; a later start runs the whole duration again."""
        if self._event is not None:
            self._event.cancel()
            self._event = None
        self._run = None

    def _end(self) -> None:
        run = self._run
        assert run is not None
        self.done = True
        self.finished_at = run.engine.now
        self._event = None
        run.exit(JobState.COMPLETED)
