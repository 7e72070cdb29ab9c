"""Retention: keep the database bounded (``[retention]`` settings).

Run by the daemon's housekeeping job (`apply_retention`), each part in short
transactions of a bounded number of jobs, so admin commands and the daemon's
own cycle never wait long for the write lock:

1. Downsample progress samples: a job's samples younger than
   ``progress_full_s`` are kept at full resolution; its older ones are thinned
   to at most ``progress_max_per_job``, evenly spaced by rank in time order
   (the oldest and the newest of them always kept). Estimates are thinned the
   same way. Each job then holds at most ``progress_max_per_job`` old samples
   plus what it wrote in the last ``progress_full_s`` seconds.
2. Prune finished jobs: a job in a finished Slurm state whose end (or, without
   one, its last sighting) is older than ``finished_job_days`` is deleted with
   all its rows (events, samples, estimates, targets, actions, progress file)
   by ``ON DELETE CASCADE``.
3. Prune decisions older than ``finished_job_days`` (with their targets).

Retention never touches a job with an unfinished action: it is neither
pruned nor thinned, and a decision an unfinished action refers to is never
deleted. The condition is part of each DELETE statement itself, so an action
created concurrently is respected.

Deleted rows leave free pages in the SQLite file that later inserts reuse:
the file stays at its high-water mark instead of shrinking (``VACUUM`` by
hand shrinks it). docs/state-store.md derives the size bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, and_, delete, exists, func, select
from sqlalchemy.orm import InstrumentedAttribute

from malleable.config import RetentionConfig
from malleable.db.engine import readonly_engine
from malleable.db.models import FINISHED_STATES, Action, Decision, Estimate, Job, ProgressSample

JOBS_PER_TRANSACTION = 100
ROWS_PER_DELETE = 500


@dataclass(frozen=True)
class RetentionReport:
    """Rows removed by one retention run."""

    samples_deleted: int = 0
    estimates_deleted: int = 0
    jobs_pruned: int = 0
    decisions_pruned: int = 0


def thinned_ranks(m: int, k: int) -> list[int]:
    """Ranks (0 .. m-1) to keep when thinning ``m`` time-ordered rows to ``k``, evenly spaced.

    Keeps rank 0 and rank m-1 when k >= 2, the newest (m-1) when k == 1, none when k == 0.

    Raises:
        ValueError: negative m or k.
    """
    if m < 0 or k < 0:
        raise ValueError(f"m = {m}, k = {k}: expected values >= 0")
    if k >= m:
        return list(range(m))
    if k == 0:
        return []
    if k == 1:
        return [m - 1]
    return [(i * (m - 1)) // (k - 1) for i in range(k)]


def _thin(engine: Engine, model: type, now: datetime, full_s: float, max_per_job: int) -> int:
    time_col: InstrumentedAttribute = model.time
    job_col: InstrumentedAttribute = model.job_id
    id_col: InstrumentedAttribute = model.id
    cutoff = now - timedelta(seconds=full_s)
    with readonly_engine(engine).connect() as conn:
        jobs = [r[0] for r in conn.execute(
            select(job_col).where(time_col < cutoff).group_by(job_col)
            .having(func.count() > max_per_job))]
        conn.rollback()
    deleted = 0
    for i in range(0, len(jobs), JOBS_PER_TRANSACTION):
        with engine.begin() as conn:
            for job_id in jobs[i:i + JOBS_PER_TRANSACTION]:
                idle = ~exists().where(and_(Action.job_id == job_id,
                                            Action.finished_at.is_(None)))
                ids = [r[0] for r in conn.execute(
                    select(id_col).where(job_col == job_id, time_col < cutoff, idle)
                    .order_by(time_col, id_col))]
                keep = set(thinned_ranks(len(ids), max_per_job))
                drop = [x for r, x in enumerate(ids) if r not in keep]
                for j in range(0, len(drop), ROWS_PER_DELETE):
                    deleted += conn.execute(
                        delete(model).where(id_col.in_(drop[j:j + ROWS_PER_DELETE]), idle)
                    ).rowcount
    return deleted


def downsample_progress(engine: Engine, now: datetime, *, full_s: float,
                        max_per_job: int) -> int:
    """Thin each job's progress samples older than ``full_s`` seconds to ``max_per_job``.

    Returns:
        Samples deleted.

    Raises:
        ValueError: negative ``full_s`` or ``max_per_job``.
        DatabaseUnavailable: the database cannot be written.
    """
    _check(full_s=full_s, max_per_job=max_per_job)
    return _thin(engine, ProgressSample, now, full_s, max_per_job)


def downsample_estimates(engine: Engine, now: datetime, *, full_s: float,
                         max_per_job: int) -> int:
    """Thin each job's estimates older than ``full_s`` seconds to ``max_per_job``; as above."""
    _check(full_s=full_s, max_per_job=max_per_job)
    return _thin(engine, Estimate, now, full_s, max_per_job)


def _no_unfinished_action_for_job():
    return ~exists().where(and_(Action.job_id == Job.id, Action.finished_at.is_(None)))


def prune_finished_jobs(engine: Engine, now: datetime, *, days: float) -> int:
    """Delete finished jobs that ended more than ``days`` days ago, with all their rows.

    A job with an unfinished action is kept (checked inside the DELETE).

    Returns:
        Jobs deleted.

    Raises:
        ValueError: negative ``days``.
        DatabaseUnavailable: the database cannot be written.
    """
    _check(days=days)
    cutoff = now - timedelta(days=days)
    old = and_(Job.state.in_(sorted(FINISHED_STATES)),
               func.coalesce(Job.end_time, Job.last_seen) < cutoff,
               _no_unfinished_action_for_job())
    with readonly_engine(engine).connect() as conn:
        ids = [r[0] for r in conn.execute(select(Job.id).where(old).order_by(Job.id))]
        conn.rollback()
    pruned = 0
    for i in range(0, len(ids), JOBS_PER_TRANSACTION):
        with engine.begin() as conn:
            pruned += conn.execute(
                delete(Job).where(Job.id.in_(ids[i:i + JOBS_PER_TRANSACTION]), old)
                .execution_options(synchronize_session=False)).rowcount
    return pruned


def prune_decisions(engine: Engine, now: datetime, *, days: float) -> int:
    """Delete decisions (and their targets) older than ``days`` days that no unfinished
    action refers to. Returns decisions deleted."""
    _check(days=days)
    cutoff = now - timedelta(days=days)
    old = and_(Decision.time < cutoff,
               ~exists().where(and_(Action.decision_id == Decision.id,
                                    Action.finished_at.is_(None))))
    with readonly_engine(engine).connect() as conn:
        ids = [r[0] for r in conn.execute(select(Decision.id).where(old).order_by(Decision.id))]
        conn.rollback()
    pruned = 0
    for i in range(0, len(ids), ROWS_PER_DELETE):
        with engine.begin() as conn:
            pruned += conn.execute(
                delete(Decision).where(Decision.id.in_(ids[i:i + ROWS_PER_DELETE]), old)
                .execution_options(synchronize_session=False)).rowcount
    return pruned


def apply_retention(engine: Engine, config: RetentionConfig,
                    now: datetime | None = None) -> RetentionReport:
    """Run every retention step with the ``[retention]`` settings.

    Args:
        engine: the state store.
        config: ``finished_job_days``, ``progress_full_s``, ``progress_max_per_job``.
        now: the caller's clock (aware UTC); default the wall clock.

    Returns:
        A `RetentionReport` of the rows removed.

    Raises:
        ValueError: a negative setting.
        DatabaseUnavailable: the database cannot be written.
    """
    now = now or datetime.now(UTC)
    jobs = prune_finished_jobs(engine, now, days=config.finished_job_days)
    decisions = prune_decisions(engine, now, days=config.finished_job_days)
    samples = downsample_progress(engine, now, full_s=config.progress_full_s,
                                  max_per_job=config.progress_max_per_job)
    estimates = downsample_estimates(engine, now, full_s=config.progress_full_s,
                                     max_per_job=config.progress_max_per_job)
    return RetentionReport(samples, estimates, jobs, decisions)


def _check(**values: float) -> None:
    for name, v in values.items():
        if v < 0:
            raise ValueError(f"retention {name} = {v!r}: expected a value >= 0")
