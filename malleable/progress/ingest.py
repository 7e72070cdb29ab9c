"""Ingestion: new progress lines from the spool directory into the database.

The daemon's ingest step, and the simulator's, is one call::

    with Session() as s, s.begin():
        report = ingest_progress(s, jobs, SpoolDir(cfg.progress.spool_dir), now=now,
                                 max_bytes_per_job=cfg.progress.max_bytes_per_job,
                                 max_future_s=cfg.progress.max_future_s)

For each known job (`IngestJob`: the ``jobs.id``, Slurm id and owner uid) it
reads only the bytes after the offset stored in ``progress_files`` (at most
``max_bytes_per_job``), validates every complete line
(`malleable.progress.lines`), and writes:

* ``progress`` lines -> ``progress_samples`` rows (time, step, samples, GPUs,
  nodes, batch size, metric, gradient statistics);
* ``started``, ``checkpointed``, ``finished`` lines -> ``job_events`` rows of that
  kind at the line's time, ``detail`` a JSON object with step, samples, gpus,
  nodes, batch, restart (and path for ``checkpointed``);
* ``progress_files``: the new offset (always at a line boundary, or past an
  over-long line), the file's device/inode/size, lines accepted, and rejected
  lines counted by reason (`malleable.progress.lines.Reason`, plus the file-level
  `malleable.progress.spool.FileProblem` values, counted once per refused file).

A partial last line is left for the next call. A replaced (other inode) or
truncated file is read again from 0. Nothing here raises for a bad file or a
bad line: one job's problems never stop the cycle (database errors do
propagate: the caller's transaction is then rolled back as a whole).

The ordering check (step never decreasing within a run) needs each job's last
accepted (restart, step, samples): `Cursors` keeps it in memory across calls,
rebuilding a missing one from the database (latest sample and latest job-reported
event), so a daemon restart keeps checking. The ``progress_files`` rows and the
missing cursors are read in batches of 500 jobs; the samples, the events and the
``progress_files`` rows are each written with one executemany, so a cycle costs a
few statements whatever the number of jobs (benchmarks/results/ingest.txt). The
spool directory is opened once per call.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from malleable.db import store
from malleable.db.models import JobEvent
from malleable.progress.lines import RESTART_SLACK, Cursor, LineValidator, ProgressRecord
from malleable.progress.reporter import MAX_LINE_BYTES
from malleable.progress.spool import SpoolDir, process_read

EVENT_KINDS = ("started", "checkpointed", "finished")


@dataclass(frozen=True)
class IngestJob:
    """A job whose progress file ingestion reads.

    Attributes:
        db_id: its ``jobs.id``.
        slurm_job_id: its Slurm id ("123", "123_4"): names the file.
        uid: its user's uid; the file must be owned by it (None: never read).
        max_restart: the highest ``restart`` its lines may carry (`RESTART_SLACK` more
            than Slurm's restart count as last polled); a line above it is rejected as
            ``future_restart``. None: no bound.
    """

    db_id: int
    slurm_job_id: str
    uid: int | None
    max_restart: int | None = None

    @classmethod
    def of(cls, job: object) -> IngestJob:
        """From a `malleable.db.models.Job` row (anything with ``id``, ``slurm_job_id``,
        ``uid`` and, for the bound on ``restart``, ``restart_count``), e.g.
        ``[IngestJob.of(j) for j in store.active_jobs(s, malleable=True)]``."""
        count = getattr(job, "restart_count", None)
        return cls(job.id, job.slurm_job_id, job.uid,  # type: ignore[attr-defined]
                   None if count is None else int(count) + RESTART_SLACK)


@dataclass
class IngestReport:
    """What `ingest_progress` did, for logs and metrics.

    Attributes:
        jobs_read: jobs whose file had new bytes.
        samples: progress samples written; events: job events written.
        rejected: rejected lines (and refused files) by reason, over all jobs.
        rejected_by_job: Slurm id -> Counter of reasons, for jobs with rejections.
        problems: Slurm id -> description of a refused file (symlink, owner, ...).
        bytes_read: bytes consumed over all files.
        unread: ``jobs.id`` of the jobs whose file still holds bytes past where this
            call stopped (the per-call byte limit, or a line not finished yet).
        finished: ``jobs.id`` of the jobs that got a ``finished`` event in this call.
        spool_error: why the spool directory could not be opened ("" when it was): no
            file was read.
    """

    jobs_read: int = 0
    samples: int = 0
    events: int = 0
    rejected: Counter = field(default_factory=Counter)
    rejected_by_job: dict[str, Counter] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    bytes_read: int = 0
    unread: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    spool_error: str = ""


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


class Cursors:
    """Each job's ordering state (`Cursor`) across ingest calls, keyed by ``jobs.id``.

    Kept in memory by the daemon (and the simulator) for the life of the
    process; jobs not seen yet get theirs from the database (`load`): the step
    and samples of the latest progress sample and the restart count of the
    latest job-reported event (0 if none).
    """

    def __init__(self) -> None:
        self._by_job: dict[int, Cursor | None] = {}

    def load(self, session: Session, job_ids: Iterable[int]) -> None:
        """Fetch the cursors of the jobs not known yet (a few queries per 500 jobs)."""
        missing = [j for j in dict.fromkeys(job_ids) if j not in self._by_job]
        for i in range(0, len(missing), _CHUNK):
            self._by_job.update(_cursors_from_db(session, missing[i:i + _CHUNK]))

    def get(self, job_id: int) -> Cursor | None:
        """The cursor of a job (None: nothing accepted yet, or not loaded)."""
        return self._by_job.get(job_id)

    def set(self, job_id: int, cursor: Cursor | None) -> None:
        self._by_job[job_id] = cursor

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the cursors of jobs not in ``keep`` (finished and pruned jobs)."""
        keep = set(keep)
        for job_id in [j for j in self._by_job if j not in keep]:
            del self._by_job[job_id]


_CHUNK = 500
# The job-reported events of the jobs :ids, newest first per job (built once).
_REPORTED_EVENTS = (select(JobEvent.job_id, JobEvent.detail, JobEvent.time)
                    .where(JobEvent.job_id.in_(bindparam("ids", expanding=True)),
                           JobEvent.kind.in_(EVENT_KINDS))
                    .order_by(JobEvent.job_id, JobEvent.time.desc(), JobEvent.id.desc()))


def _cursors_from_db(session: Session, job_ids: list[int]) -> dict[int, Cursor | None]:
    latest = store.latest_samples(session, job_ids, 1)
    restarts: dict[int, int] = {}
    # The time of the newest accepted line: a run's time never goes back (decreasing_time),
    # also across a daemon restart.
    newest: dict[int, float] = {}
    for job_id, detail, time in store.run_core(session, _REPORTED_EVENTS, {"ids": job_ids}):
        if job_id in restarts or not detail:
            continue
        try:
            restarts[job_id] = int(json.loads(detail).get("restart", 0))
        except (ValueError, TypeError, AttributeError):
            continue
        newest[job_id] = _epoch(time)
    out: dict[int, Cursor | None] = {}
    for job_id in job_ids:
        restart = restarts.get(job_id, 0)
        rows = latest.get(job_id) or []
        if not rows:
            out[job_id] = None if restart == 0 else Cursor(restart, 0, 0, newest.get(job_id))
            continue
        last = rows[-1]
        if last.restart is not None:
            restart = max(restart, int(last.restart))
        t = max(newest.get(job_id, -math.inf), _epoch(last.time))
        out[job_id] = Cursor(restart, int(last.step), int(last.samples), t)
    return out


def _epoch(when: datetime) -> float:
    """A stored (aware) time as Unix seconds, less 1 us: stored times are rounded to
    microseconds, and a line stamped exactly as the last one is in order."""
    return when.timestamp() - 1e-6


def _keep(before: dict[int, dict], job_id: int, pf: dict | None) -> None:
    """Remember a job's ``progress_files`` row as read, before it is changed in place."""
    if pf is not None and job_id not in before:
        before[job_id] = dict(pf)


def _event_detail(rec: ProgressRecord) -> str:
    doc = {"step": rec.step, "samples": rec.samples, "gpus": rec.gpus, "nodes": rec.nodes,
           "batch": rec.batch, "restart": rec.restart}
    if rec.path is not None:
        doc["path"] = rec.path
    return json.dumps(doc, separators=(",", ":"))


def ingest_progress(session: Session, jobs: Iterable[IngestJob], spool: SpoolDir, *,
                    now: datetime, max_bytes_per_job: int = 1 << 20,
                    max_future_s: float = 300.0, cursors: Cursors | None = None,
                    files: dict[int, dict] | None = None) -> IngestReport:
    """Read every known job's new progress lines into the database (see the module doc).

    Args:
        session: an open read-write session; nothing is committed here.
        jobs: the jobs to read (the daemon passes its malleable jobs that are not
            finished, plus those that finished since the last call).
        spool: the spool directory (`SpoolDir`), the daemon's or the simulator's.
        now: the caller's clock (aware datetime): lines dated more than
            ``max_future_s`` after it are rejected; ``progress_files.last_read_at``.
        max_bytes_per_job: read at most this many bytes per job per call (raised
            to one maximal line if smaller).
        max_future_s: see ``now``.
        cursors: ordering state kept across calls (a fresh `Cursors` if None: then
            rebuilt from the database).
        files: the jobs' ``progress_files`` rows as `store.progress_file_rows` returns
            them, if the caller read them in this transaction (e.g. with the jobs,
            `store.with_progress_files`); changed in place. None: read here.

    Returns:
        An `IngestReport`. Never raises for a bad file or line.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database failed (nothing of this call
            should then be committed).
    """
    cursors = cursors if cursors is not None else Cursors()
    jobs = list(jobs)
    report = IngestReport()
    now_s = now.timestamp()
    limit = max(int(max_bytes_per_job), MAX_LINE_BYTES + 1)
    # Table rows as dicts, changed in memory and written in bulk at the end.
    if files is None:
        files = store.progress_file_rows(session, [j.db_id for j in jobs])
    read_files: dict[int, dict] = {}
    before: dict[int, dict] = {}   # the rows as read, of the files read
    cursors.load(session, [j.db_id for j in jobs])
    samples: list[store.SampleIn] = []
    events: list[tuple[int, datetime, str, str]] = []
    with spool.opened() as opened:
        report.spool_error = opened.error
        for job in jobs:
            pf = files.get(job.db_id)
            read = opened.read(job.slurm_job_id, job.uid, offset=pf["offset"] if pf else 0,
                               device=pf["device"] if pf else None,
                               inode=pf["inode"] if pf else None, max_bytes=limit)
            if not read.exists:
                continue
            if read.problem is not None:
                report.problems[job.slurm_job_id] = read.detail
                seen = pf is not None and (pf["device"], pf["inode"]) == (read.device, read.inode) \
                    and pf["offset"] == 0 and read.problem.value in (pf["rejected"] or {})
                counts = {} if seen else {read.problem.value: 1}
                if counts:
                    report.rejected.update(counts)
                    report.rejected_by_job.setdefault(job.slurm_job_id, Counter()).update(counts)
                _keep(before, job.db_id, pf)
                files[job.db_id] = read_files[job.db_id] = store.read_progress_file(
                    pf, job_id=job.db_id, path=spool.file_path_safe(job.slurm_job_id),
                    device=read.device, inode=read.inode, offset=0, size=read.size, now=now,
                    rejected=counts)
                continue
            if not read.data and pf is not None and not read.reset:
                continue
            validator = LineValidator(job.slurm_job_id, cursors.get(job.db_id),
                                      max_future_s=max_future_s,
                                      max_restart=job.max_restart)
            result = process_read(read, validator, now_s)
            cursors.set(job.db_id, validator.last)
            samples.extend(store.SampleIn(
                job_id=job.db_id, time=_utc(r.t), step=r.step, samples=r.samples, gpus=r.gpus,
                batch_size=r.batch, nodes=r.nodes, metric=r.metric, grad_sqr=r.grad_sqr,
                grad_var=r.grad_var, restart=r.restart)
                for r in result.records if r.event == "progress")
            events.extend((job.db_id, _utc(r.t), r.event, _event_detail(r))
                          for r in result.records if r.event in EVENT_KINDS)
            _keep(before, job.db_id, pf)
            files[job.db_id] = read_files[job.db_id] = store.read_progress_file(
                pf, job_id=job.db_id, path=spool.file_path_safe(job.slurm_job_id),
                device=read.device, inode=read.inode, offset=result.offset, size=read.size,
                now=now, accepted=len(result.records), rejected=dict(result.rejected))
            report.jobs_read += 1
            report.bytes_read += result.bytes_read
            if result.offset < read.size:
                report.unread.add(job.db_id)
            if result.rejected:
                report.rejected.update(result.rejected)
                report.rejected_by_job.setdefault(job.slurm_job_id, Counter()).update(
                    result.rejected)
    # Events first, then the files' rows, then the samples.
    report.events = store.add_job_events(session, events)
    report.finished = {e[0] for e in events if e[2] == "finished"}
    store.save_progress_files(session, read_files.values(), before)
    report.samples = store.add_progress_samples(session, samples)
    session.flush()
    return report
