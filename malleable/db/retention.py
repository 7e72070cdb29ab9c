"""Retention: keep the database bounded (``[retention]`` settings).

Run by the daemon's housekeeping job (`apply_retention`), each part in short
transactions of a bounded number of jobs, so admin commands and the daemon's
own cycle never wait long for the write lock:

1. Downsample progress samples: a job's samples younger than
   ``progress_full_s`` are kept at full resolution; its older ones are thinned
   to at most ``progress_max_per_job``, evenly spaced by rank in time order
   (the oldest and the newest of them always kept). Estimates are thinned the
   same way. Each job then holds at most ``progress_max_per_job`` old samples
   plus what it wrote in the last ``progress_full_s`` seconds. A run counts only
   the jobs that can have gained old rows since the last run (`ThinMark`,
   `_thin`), with a full pass over every job at least once a day.
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

from sqlalchemy import Engine, and_, case, delete, exists, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from malleable.config import RetentionConfig
from malleable.db.engine import readonly_engine
from malleable.db.models import (
    FINISHED_STATES,
    Action,
    Decision,
    Estimate,
    Job,
    ProgressSample,
    Setting,
)
from malleable.db.store import set_setting

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


@dataclass(frozen=True)
class ThinMark:
    """What the last thinning run of one table left behind (the setting
    ``THIN_MARK_KEY``), so the next run counts only the jobs that can have gained
    old rows since (`_thin`).

    Attributes:
        cutoff: that run's cutoff (its time less ``full_s``; aware UTC).
        max_id: the table's largest row id when that run read it (0: empty).
        full_s: ``progress_full_s`` of that run, s.
        max_per_job: ``progress_max_per_job`` of that run.
        full_at: when the last full pass (every job counted) ran (aware UTC).
        recent: jobs (``jobs.id``) that had rows newer than ``cutoff`` then.
        carry: jobs that run found over the limit but could not thin (an unfinished
            action).
    """

    cutoff: datetime
    max_id: int
    full_s: float
    max_per_job: int
    full_at: datetime
    recent: tuple[int, ...] = ()
    carry: tuple[int, ...] = ()

    def as_json(self) -> dict:
        """The mark as a JSON object (times ISO 8601)."""
        return {"cutoff": self.cutoff.isoformat(), "max_id": self.max_id,
                "full_s": self.full_s, "max_per_job": self.max_per_job,
                "full_at": self.full_at.isoformat(), "recent": list(self.recent),
                "carry": list(self.carry)}

    @classmethod
    def from_json(cls, value: object) -> ThinMark | None:
        """The mark `as_json` wrote; None for anything else (no mark, or one this
        version cannot read: the next run is then a full pass)."""
        try:
            mark = cls(datetime.fromisoformat(value["cutoff"]), int(value["max_id"]),
                       float(value["full_s"]), int(value["max_per_job"]),
                       datetime.fromisoformat(value["full_at"]),
                       tuple(int(j) for j in value["recent"]),
                       tuple(int(j) for j in value["carry"]))
        except (TypeError, KeyError, ValueError):
            return None
        if mark.cutoff.tzinfo is None or mark.full_at.tzinfo is None:
            return None
        return mark

    def covers(self, now: datetime, cutoff: datetime, full_s: float, max_per_job: int,
               max_id: int) -> bool:
        """Whether a run at ``now`` may count only the jobs this mark leads to: the
        same settings, neither the clock nor the ids gone back, and a full pass
        within `FULL_PASS_S`."""
        return (self.full_s == full_s and self.max_per_job == max_per_job
                and self.cutoff <= cutoff and self.max_id <= max_id
                and timedelta(0) <= now - self.full_at < timedelta(seconds=FULL_PASS_S))


#: The setting that holds a table's `ThinMark` (``{table}``: "progress_samples", "estimates").
THIN_MARK_KEY = "retention.thinned.{table}"
#: A thinning run counts every job at least this often, s (see `_thin`).
FULL_PASS_S = 86400.0


def _thin(engine: Engine, model: type, now: datetime, full_s: float, max_per_job: int) -> int:
    """Thin ``model``'s rows older than ``full_s`` to ``max_per_job`` per job; returns
    the rows deleted.

    Which jobs to count: with the last run's `ThinMark` (cutoff C, largest id W), a
    job can hold more than ``max_per_job`` rows older than this run's cutoff only if
    (a) that run could not thin it (``carry``), (b) it had rows newer than C then
    (``recent``: some may be old now), or (c) it has rows inserted since (ids above
    W; e.g. lines ingested late with old times). Only those jobs are counted, by the
    (job_id, time) index, instead of every row of the table; the same count gives
    this run's ``recent`` (the jobs among them with rows newer than its cutoff: by
    the same argument, no other job has any). So a run costs what the active jobs
    wrote, not what is stored. A full pass (every job) runs when there is no mark,
    the settings or the clock changed, or the last full pass is `FULL_PASS_S` old; it
    also bounds what the marks cannot see: on PostgreSQL an insert that commits after
    a run read a larger id, on SQLite a row id reused after the newest rows were
    deleted, each with a time already old."""
    time_col: InstrumentedAttribute = model.time
    job_col: InstrumentedAttribute = model.job_id
    id_col: InstrumentedAttribute = model.id
    cutoff = now - timedelta(seconds=full_s)
    key = THIN_MARK_KEY.format(table=model.__tablename__)
    old = time_col < cutoff
    per_job = select(job_col, func.count(case((old, 1))), func.max(time_col)).group_by(job_col)
    with readonly_engine(engine).connect() as conn:   # (one snapshot for every read)
        max_id = conn.scalar(select(func.max(id_col))) or 0
        mark = ThinMark.from_json(conn.scalar(select(Setting.value).where(Setting.key == key)))
        if mark is not None and mark.covers(now, cutoff, full_s, max_per_job, max_id):
            check = set(mark.carry) | set(mark.recent)
            check.update(conn.scalars(select(job_col).where(id_col > mark.max_id).distinct()))
            ordered = sorted(check)
            counts = [r for i in range(0, len(ordered), ROWS_PER_DELETE)
                      for r in conn.execute(
                          per_job.where(job_col.in_(ordered[i:i + ROWS_PER_DELETE])))]
            full_at = mark.full_at
        else:
            counts = list(conn.execute(per_job))
            full_at = now
        conn.rollback()
    jobs = [j for j, n_old, _ in counts if n_old > max_per_job]
    recent = tuple(j for j, _, newest in counts if newest >= cutoff)
    deleted, carry = 0, []
    for i in range(0, len(jobs), JOBS_PER_TRANSACTION):
        with engine.begin() as conn:
            for job_id in jobs[i:i + JOBS_PER_TRANSACTION]:
                idle = ~exists().where(and_(Action.job_id == job_id,
                                            Action.finished_at.is_(None)))
                ids = [r[0] for r in conn.execute(
                    select(id_col).where(job_col == job_id, old, idle)
                    .order_by(time_col, id_col))]
                keep = set(thinned_ranks(len(ids), max_per_job))
                drop = [x for r, x in enumerate(ids) if r not in keep]
                done = 0
                for j in range(0, len(drop), ROWS_PER_DELETE):
                    done += conn.execute(
                        delete(model).where(id_col.in_(drop[j:j + ROWS_PER_DELETE]), idle)
                    ).rowcount
                if len(ids) <= max_per_job or done < len(drop):
                    carry.append(job_id)   # (an unfinished action: not thinned, or not all)
                deleted += done
    mark = ThinMark(cutoff, max_id, full_s, max_per_job, full_at, recent, tuple(carry))
    with Session(engine) as s, s.begin():
        set_setting(s, key, mark.as_json(), now)
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
