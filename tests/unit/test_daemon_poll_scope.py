"""What a poll reads: whose progress files (`Daemon._ingest_in`), and which job rows
(`Daemon.job_rows`, `store.JobRows`).

Once the daemon has read every malleable job's file since it started, a pending
job's file is read only while it can hold lines not read yet: for three poll
intervals after a poll showed the job running or gave it an event, and while bytes
are left past the last read. An ended job's file is read while its last sighting is
within three poll intervals, as before the daemon found those jobs by id. These tests run the daemon against the simulator's
Slurm (`SimSlurm`) with a real SQLite store, and write the progress lines
themselves, so that lines appear in files exactly when the test says.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select

from malleable.config import parse_config
from malleable.daemon.cycle import Daemon
from malleable.db import schema
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job, JobEvent, ProgressFile, ProgressSample
from malleable.sim.jobs import RigidJob, progress_path, progress_record, write_progress_line
from malleable.slurm.records import JobState, SlurmJob
from tests.unit.test_daemon_cycle import SPEC, Cluster, SkippingSlurm


def _line(c: Cluster, job_id: str, step: int, event: str = "progress") -> None:
    """Append one progress line of ``job_id`` at the current virtual time."""
    write_progress_line(progress_path(c.spool, job_id), progress_record(
        t=c.engine.time(), job=job_id, event=event, step=step, samples=512 * step,
        gpus=2, nodes=1, batch=512, restart=0))


def _first_read_and_window(c: Cluster) -> None:
    """The daemon's first read (every file), then four polls: the read window after the
    jobs' "new" events (three poll intervals) has passed."""
    c.advance(1)
    c.daemon.poll_cycle()
    for _ in range(4):
        c.advance(10)
        c.daemon.poll_cycle()


def _samples(c: Cluster, job_id: str) -> int:
    with c.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(ProgressSample)
                            .join(Job, Job.id == ProgressSample.job_id)
                            .where(Job.slurm_job_id == job_id)))


def _restarted_daemon(c: Cluster, tmp: Path, **progress) -> Daemon:
    """A new daemon process on the same store and spool (nothing kept in memory)."""
    config = parse_config({"progress": {"spool_dir": str(c.spool), **progress},
                           "daemon": {"poll_interval_s": 10.0, "decide_interval_s": 20.0}})
    return Daemon(slurm=c.slurm, sessions=c.sessions, clock=c.engine.datetime_at,
                  spool_dir=str(c.spool), config=config)


def test_a_pending_job_is_read_while_its_last_lines_can_be_unread(tmp_path):
    c = Cluster(tmp_path, nodes=1)
    p = c.submit(1, 2, RigidJob(1e6), SPEC)           # runs on 2 of the node's 4 GPUs
    q = c.submit(1, 4, RigidJob(1e6), SPEC)           # pends: never runs here
    c.slurm.hold(q)
    _first_read_and_window(c)                         # Q's "new" event is 30 s behind
    c.advance(1)
    _line(c, p, 1)
    _line(c, q, 1)   # (a pending job writes nothing; this shows its file is not opened)
    c.advance(9)
    c.daemon.poll_cycle()
    assert (_samples(c, p), _samples(c, q)) == (1, 0)

    # P writes its last line and is requeued before the next poll: that poll, which
    # shows P pending, still reads it.
    c.advance(1)
    _line(c, p, 2)
    c.slurm.requeue_hold(p)
    c.advance(9)
    assert c.job(p).state.value == "PENDING"
    c.daemon.poll_cycle()
    assert _samples(c, p) == 2

    # Three poll intervals after P last ran, its file is no longer read ...
    for _ in range(4):
        c.advance(10)
        c.daemon.poll_cycle()
    _line(c, p, 3)
    c.advance(10)
    c.daemon.poll_cycle()
    assert (_samples(c, p), _samples(c, q)) == (2, 0)

    # (What the daemon remembers of P is gone with the window: nothing accumulates.)
    assert c.db_id(p) not in c.daemon._writers
    # ... until a daemon starts: its first read takes every file, pending or not.
    d = _restarted_daemon(c, tmp_path)
    c.advance(10)
    d.poll_cycle()
    assert (_samples(c, p), _samples(c, q)) == (3, 1)


def test_a_pending_job_with_bytes_left_is_read_until_its_file_is_drained(tmp_path):
    c = Cluster(tmp_path, nodes=1)
    d = _restarted_daemon(c, tmp_path, max_bytes_per_job=4096)   # ~20 lines per read
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    d.poll_cycle()
    n = 300
    for step in range(1, n + 1):                      # far more than one read takes
        _line(c, p, step)
    c.slurm.requeue_hold(p)
    reads = 0
    while _samples(c, p) < n and reads < 40:
        c.advance(10)
        d.poll_cycle()
        reads += 1
        if reads == 1:
            c.advance(100)   # a gap longer than the read window: bytes left still count
    # More reads than the three-interval window holds, and every line was taken.
    assert reads > 4
    assert _samples(c, p) == n
    c.advance(10)
    assert d.poll_cycle().ingest.jobs_read == 0       # drained: nothing left to read
    c.slurm.cancel(p)          # ends: read while Slurm lists it (MinJobAge, 300 s) and
    for _ in range(35):        # for the window after; then remembered no longer
        c.advance(10)
        d.poll_cycle()
    assert c.job(p) is None and d._writers == {}


def _events(c: Cluster, job_id: str) -> list[str]:
    with c.sessions() as s:
        return [e.kind if e.kind != "state" else e.detail.split(" (")[0] for e in s.scalars(
            select(JobEvent).join(Job, Job.id == JobEvent.job_id)
            .where(Job.slurm_job_id == job_id).order_by(JobEvent.id))]


def test_a_pending_job_that_ends_unseen_is_read_once_marked_ended(tmp_path):
    """A job last seen pending, with no event for longer than the read window, that
    runs, writes its last lines and is purged between two polls (MinJobAge 0): the
    poll that finds it gone marks it VANISHED, and its file is read from the next
    poll, so its ``finished`` line makes it COMPLETED (its id is named in the ingest
    query: no scan of every stored job finds it by its last sighting)."""
    c = Cluster(tmp_path, nodes=1)
    c.slurm.min_job_age_s = 0.0
    q = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.slurm.hold(q)
    _first_read_and_window(c)
    c.advance(1)
    _line(c, q, 1)
    _line(c, q, 2, "finished")
    c.slurm.cancel(q)                                 # (and purged at once)
    c.advance(9)
    for _ in range(2):
        c.daemon.poll_cycle()
    assert c.job(q) is None
    assert _samples(c, q) == 1
    assert _events(c, q) == ["new", "PENDING -> VANISHED", "finished", "VANISHED -> COMPLETED"]


def test_a_restarted_daemon_reads_the_jobs_its_predecessor_saw_end_lately(tmp_path):
    """The jobs ended and seen in the last three poll intervals are read by their last
    sighting (`Daemon._seen_ended`): a new daemon learns those its predecessor saw from
    the store, at its first read (of every file), and reads them after it too."""
    c = Cluster(tmp_path, nodes=1)
    c.slurm.min_job_age_s = 0.0
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()
    c.slurm.cancel(p)                                 # ends, purged at once
    c.advance(10)
    c.daemon.poll_cycle()                             # P gone: marked ended
    d = _restarted_daemon(c, tmp_path)
    c.advance(5)
    d.poll_cycle()                                    # the first read: every file
    assert c.db_id(p) in d._seen_ended
    _line(c, p, 1)   # (an ended job writes nothing; this shows its file is still read)
    c.advance(5)
    d.poll_cycle()                                    # 10 s after its last sighting
    assert _samples(c, p) == 1
    for _ in range(3):
        c.advance(10)
        d.poll_cycle()
    _line(c, p, 2)
    c.advance(10)
    d.poll_cycle()                                    # out of the window: not read
    assert _samples(c, p) == 1 and c.db_id(p) not in d._seen_ended


class _ListedJobs:
    """A Slurm port that lists what the test sets (`SimSlurm` never gives an id twice,
    so a reused id is shown this way): ``jobs()`` returns ``listed``."""

    rpc_count = 0
    parse_errors = ()

    def __init__(self) -> None:
        self.listed: list[SlurmJob] = []

    def jobs(self) -> list[SlurmJob]:
        return list(self.listed)

    def nodes(self) -> list:
        return []


def test_the_finished_row_of_a_reused_slurm_id_is_not_read(tmp_path, caplog):
    """When Slurm gives a finished job's id to a new job, the finished job's rows are
    kept under ``<id>~<jobs.id>`` (a "renamed" event on them): its file is not looked
    for under that name (no progress-file row, no rejected-lines warning)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    db = make_engine(f"sqlite:///{tmp_path}/m.db")
    schema.prepare_schema(db)
    sessions = session_factory(db)
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    slurm = _ListedJobs()
    d = Daemon(slurm=slurm, sessions=sessions, clock=lambda: now[0], spool_dir=str(spool),
               config=parse_config({"progress": {"spool_dir": str(spool)},
                                    "daemon": {"poll_interval_s": 10.0}}))
    first = SlurmJob("7", 7, uid=os.getuid(), state=JobState.RUNNING, gpus=2, node_count=1,
                     gpus_per_node=2, submit_time=now[0], start_time=now[0], comment=SPEC)

    def poll(listed):
        slurm.listed = listed
        now[0] += timedelta(seconds=10)
        return d.poll_cycle()

    poll([first])
    poll([dataclasses.replace(first, state=JobState.COMPLETED, end_time=now[0])])
    for _ in range(10):                               # purged, out of the read window
        poll([])
    with caplog.at_level(logging.WARNING, logger="malleable"):
        poll([SlurmJob("7", 7, uid=os.getuid(), state=JobState.PENDING, gpus=2,
                       node_count=1, submit_time=now[0], comment=SPEC)])
        poll(slurm.listed)
    with sessions() as s:
        assert sorted(s.scalars(select(Job.slurm_job_id))) == ["7", "7~1"]
        assert s.scalars(select(ProgressFile.job_id)).all() == []
    assert "rejected progress lines" not in caplog.text
    db.dispose()


def test_the_upsert_names_every_job_given_an_event(tmp_path):
    c = Cluster(tmp_path, nodes=1)
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()
    c.slurm.requeue_hold(p)                           # state and restart count change
    c.advance(10)
    from malleable.db import store

    with c.sessions() as s, s.begin():
        r = store.upsert_jobs(s, c.slurm.jobs(), c.engine.datetime_at())
        unchanged = store.upsert_jobs(s, c.slurm.jobs(), c.engine.datetime_at())
    assert r.evented == {c.db_id(p)}
    assert unchanged.evented == frozenset()


def test_a_poll_that_does_not_commit_forgets_the_kept_rows(tmp_path, monkeypatch):
    from malleable.db import store
    from malleable.db.models import JobEvent

    c = Cluster(tmp_path, nodes=1)
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()
    assert set(c.daemon.job_rows.rows) == {p} and c.daemon.job_rows.complete

    def broken(_s):
        raise RuntimeError("the store failed after the upsert")

    c.slurm.requeue_hold(p)                           # seen first by the poll that fails
    monkeypatch.setattr(store, "operator_settings", broken)
    c.advance(10)
    try:
        c.daemon.poll_cycle()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the poll should have failed")
    assert len(c.daemon.job_rows) == 0 and not c.daemon.job_rows.complete
    monkeypatch.undo()
    c.advance(10)
    c.daemon.poll_cycle()                             # reads the rows again
    with c.sessions() as s:
        job = s.get(Job, c.db_id(p))
        kinds = list(s.scalars(select(JobEvent.kind).where(JobEvent.job_id == job.id)
                               .order_by(JobEvent.id)))
        # The requeue the failed poll saw is stored by the next one, with its events.
        assert (job.state, job.held, job.restart_count) == ("PENDING", True, 1)
        assert kinds == ["new", "state", "restart"]
    assert set(c.daemon.job_rows.rows) == {p}


def test_while_polls_skip_job_records_every_file_is_read(tmp_path):
    # A job whose record the poll could not parse is missing from it: its state is not
    # known, so it is read whatever the store says (here: pending, while it runs).
    c = Cluster(tmp_path, nodes=1, slurm_cls=SkippingSlurm)
    x = c.submit(1, 4, RigidJob(1e6), SPEC)
    c.slurm.hold(x)
    c.advance(1)
    c.daemon.poll_cycle()
    for _ in range(4):                                # X's "new" event is behind
        c.advance(10)
        c.daemon.poll_cycle()
    c.slurm.skip = frozenset({x})                     # from now on unparseable
    c.slurm.release(x)                                # X runs; the store says pending
    c.advance(1)
    _line(c, x, 1)
    c.advance(9)
    r = c.daemon.poll_cycle()
    assert c.daemon.poll_incomplete
    assert _samples(c, x) == 1 and r.ingest.jobs_read == 1
    c.advance(1)
    _line(c, x, 2)
    c.advance(9)
    c.daemon.ingest(c.engine.datetime_at())           # an ingest cycle between polls
    assert _samples(c, x) == 2


def test_kept_rows_are_read_again_after_a_gap_longer_than_the_lease_timeout(tmp_path):
    from sqlalchemy import update

    c = Cluster(tmp_path, nodes=1)
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()
    c.advance(10)
    c.daemon.poll_cycle()
    # Another daemon (which took over the lease while this one hung) wrote the row.
    with c.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.slurm_job_id == p).values(attained_gpu_s=1000.0))
    c.advance(301)                                    # > lease_timeout_s (300)
    c.daemon.poll_cycle()
    with c.sessions() as s:
        # From the stored 1000 GPU-seconds, not from what this daemon kept (20).
        assert s.scalar(select(Job.attained_gpu_s).where(Job.slurm_job_id == p)) == \
            1000.0 + 2 * 301
