"""Jobs Slurm stops listing before a poll saw how they ended (`Daemon._mark_vanished`).

Slurm forgets a finished job after MinJobAge; if no poll ran meanwhile (the daemon
was down), the daemon never sees its end state. It used to record every such job as
COMPLETED, which fed a cancelled or failed job's short run into the estimators' work
priors and Gittins' size history as a completed job's size. Now such a job is
COMPLETED only if its progress says ``finished``, else VANISHED (finished, state not
known). The daemon runs against the simulator's Slurm (`SimSlurm`) with a real SQLite
store; the tests write the jobs' progress lines themselves.
"""

from __future__ import annotations

from sqlalchemy import select

from malleable.db.models import FINISHED_STATES, VANISHED, Job, JobEvent
from malleable.sim.jobs import RigidJob, progress_path, progress_record, write_progress_line
from tests.unit.test_daemon_cycle import SPEC, Cluster
from tests.unit.test_daemon_poll_scope import _restarted_daemon


def _line(c: Cluster, job_id: str, event: str, step: int) -> None:
    write_progress_line(progress_path(c.spool, job_id), progress_record(
        t=c.engine.time(), job=job_id, event=event, step=step, samples=512 * step, gpus=1,
        nodes=1, batch=512, restart=0))


def _state(c: Cluster, job_id: str) -> tuple[str, list[str]]:
    """The stored state and the detail of each "state" event."""
    with c.sessions() as s:
        job = s.scalar(select(Job).where(Job.slurm_job_id == job_id))
        events = s.scalars(select(JobEvent.detail).where(JobEvent.job_id == job.id,
                                                         JobEvent.kind == "state")
                           .order_by(JobEvent.id))
        return job.state, [d for d in events if d and ("no longer" in d or "VANISHED" in d)]


def test_a_vanished_job_is_completed_only_if_its_progress_says_finished(tmp_path):
    c = Cluster(tmp_path, nodes=1)
    done = c.submit(1, 1, RigidJob(1e6), SPEC)
    gone = c.submit(1, 1, RigidJob(1e6), SPEC)
    c.advance(1)
    c.daemon.poll_cycle()
    assert c.job(done).state.value == c.job(gone).state.value == "RUNNING"
    _line(c, done, "progress", 1)
    _line(c, gone, "progress", 1)
    c.advance(5)
    _line(c, done, "finished", 2)       # DONE reached its target; GONE did not
    c.slurm.cancel(done)
    c.slurm.cancel(gone)
    c.advance(400)                       # no poll for longer than MinJobAge (300 s)
    assert c.job(done) is None and c.job(gone) is None
    c.daemon.poll_cycle()                # its ingest reads DONE's last line first
    assert _state(c, done) == ("COMPLETED", [
        "RUNNING -> COMPLETED (no longer reported by Slurm; its progress says finished)"])
    assert _state(c, gone) == (VANISHED, [
        "RUNNING -> VANISHED (no longer reported by Slurm; how it ended is not known: not "
        "counted as completed)"])
    assert VANISHED in FINISHED_STATES   # finished: never managed or polled for again
    c.advance(10)
    c.daemon.poll_cycle()
    assert _state(c, gone)[0] == VANISHED


def test_a_finished_line_read_after_the_job_vanished_completes_it(tmp_path):
    """A file read in parts (``max_bytes_per_job``) of a job purged before the next
    poll (a MinJobAge below the poll interval): its ``finished`` line comes in a poll
    after the one that found the job gone (its file is read for three poll intervals
    after it was last seen)."""
    c = Cluster(tmp_path, nodes=1)
    c.slurm.min_job_age_s = 5.0
    d = _restarted_daemon(c, tmp_path, max_bytes_per_job=4096)   # ~20 lines per read
    p = c.submit(1, 1, RigidJob(1e6), SPEC)
    c.advance(1)
    d.poll_cycle()
    for step in range(1, 61):
        _line(c, p, "progress", step)
    _line(c, p, "finished", 61)
    c.slurm.cancel(p)
    c.advance(10)
    d.poll_cycle()
    assert _state(c, p)[0] == VANISHED
    c.advance(10)
    d.poll_cycle()
    assert _state(c, p) == ("COMPLETED", [
        "RUNNING -> VANISHED (no longer reported by Slurm; how it ended is not known: not "
        "counted as completed)", "VANISHED -> COMPLETED (its progress says finished)"])
