"""What a poll reads: whose progress files (`Daemon._ingest_in`), and which job rows
(`Daemon.job_rows`, `store.JobRows`).

Once the daemon has read every malleable job's file since it started, a pending or
ended job's file is read only while it can hold lines not read yet: for three poll
intervals after a poll showed the job running or gave it an event, and while bytes
are left past the last read. These tests run the daemon against the simulator's
Slurm (`SimSlurm`) with a real SQLite store, and write the progress lines
themselves, so that lines appear in files exactly when the test says.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from malleable.config import parse_config
from malleable.daemon.cycle import Daemon
from malleable.db.models import Job, ProgressSample
from malleable.sim.jobs import RigidJob, progress_path, progress_record, write_progress_line
from tests.unit.test_daemon_cycle import SPEC, Cluster, SkippingSlurm


def _line(c: Cluster, job_id: str, step: int) -> None:
    """Append one progress line of ``job_id`` at the current virtual time."""
    write_progress_line(progress_path(c.spool, job_id), progress_record(
        t=c.engine.time(), job=job_id, event="progress", step=step, samples=512 * step,
        gpus=2, nodes=1, batch=512, restart=0))


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
    c.advance(1)
    c.daemon.poll_cycle()                             # the first read: every file
    for _ in range(4):                                # Q's "new" event is 30 s behind
        c.advance(10)
        c.daemon.poll_cycle()
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
    c.slurm.cancel(p)                                 # ends: remembered no longer
    for _ in range(5):
        c.advance(10)
        d.poll_cycle()
    assert d._writers == {}


def test_an_ended_job_is_read_for_three_poll_intervals_while_slurm_lists_it(tmp_path):
    """An ended job's last lines are read in the window after the poll that saw it end;
    after that its file is not read, though Slurm lists it until MinJobAge (300 s)."""
    c = Cluster(tmp_path, nodes=1)
    p = c.submit(1, 2, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()                             # the first read: every file
    c.advance(10)
    c.daemon.poll_cycle()
    _line(c, p, 1)
    c.slurm.cancel(p)                                 # its last line, then its end
    c.advance(10)
    c.daemon.poll_cycle()
    assert _samples(c, p) == 1
    for _ in range(4):
        c.advance(10)
        c.daemon.poll_cycle()
    assert c.job(p) is not None and c.job(p).state.value == "CANCELLED"   # (listed)
    _line(c, p, 2)   # (an ended job writes nothing; this shows its file is not opened)
    c.advance(10)
    assert c.daemon.poll_cycle().ingest.jobs_read == 0
    assert _samples(c, p) == 1


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
