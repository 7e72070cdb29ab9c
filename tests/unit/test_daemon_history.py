"""What the daemon derives from its own records: holds, back-off, readiness to checkpoint."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from malleable.daemon.history import (
    MAX_BACKOFF_S,
    daemon_holds,
    reporting_runs,
    requeue_backoff,
)
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def Session(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/h.db")
    schema.upgrade(eng)
    yield session_factory(eng)
    eng.dispose()


def jobs(s, *ids):
    return store.upsert_jobs(s, [SlurmJob(job_id=i, job_id_num=int(i), state=JobState.RUNNING)
                                 for i in ids], T0).ids


def test_reporting_runs_is_the_latest_run_with_progress(Session):
    with Session() as s, s.begin():
        ids = jobs(s, "1", "2", "3")
        store.add_progress_samples(s, [
            store.SampleIn(ids["1"], T0, 1, 10, 1, 10, restart=0),
            store.SampleIn(ids["1"], T0, 2, 20, 1, 10, restart=1),
            store.SampleIn(ids["2"], T0, 1, 10, 1, 10, restart=None)])
    with Session() as s:
        assert reporting_runs(s, ids.values()) == {ids["1"]: 1, ids["2"]: 0}


def test_a_restart_above_slurms_count_is_no_run(Session):
    """A stored restart=999 (accepted before future_restart existed) made the job look
    ready to checkpoint in every run; only runs up to Slurm's count plus one count."""
    with Session() as s, s.begin():
        (jid,) = store.upsert_jobs(s, [SlurmJob(job_id="4", job_id_num=4, restart_count=1,
                                                state=JobState.RUNNING)], T0).ids.values()
        store.add_progress_samples(s, [
            store.SampleIn(jid, T0, 1, 10, 1, 10, restart=0),
            store.SampleIn(jid, T0, 2, 20, 1, 10, restart=999)])
    with Session() as s:
        assert reporting_runs(s, [jid]) == {jid: 0}
    with Session() as s, s.begin():
        store.add_progress_samples(s, [store.SampleIn(jid, T0, 3, 30, 1, 10, restart=2)])
    with Session() as s:
        assert reporting_runs(s, [jid]) == {jid: 2}


def test_backoff_doubles_per_missed_checkpoint(Session):
    with Session() as s, s.begin():
        jid = jobs(s, "7")["7"]
        store.add_job_event(s, jid, T0, "no_checkpoint")
    with Session() as s:
        assert requeue_backoff(s, [jid], T0 + timedelta(seconds=50), 60)[jid] == \
            T0 + timedelta(seconds=60)
        assert requeue_backoff(s, [jid], T0 + timedelta(seconds=61), 60) == {}
    with Session() as s, s.begin():
        store.add_job_event(s, jid, T0 + timedelta(seconds=100), "no_checkpoint")
    with Session() as s:
        assert requeue_backoff(s, [jid], T0 + timedelta(seconds=150), 60)[jid] == \
            T0 + timedelta(seconds=220)


def test_backoff_is_capped_after_many_missed_checkpoints(Session):
    """2**(n-1) x 60 s overflowed a timedelta after ~30 missed checkpoints, and the
    decide cycle then failed at every interval."""
    with Session() as s, s.begin():
        jid = jobs(s, "8")["8"]
        for i in range(200):
            store.add_job_event(s, jid, T0 + timedelta(seconds=i), "no_checkpoint")
    with Session() as s:
        last = T0 + timedelta(seconds=199)
        assert requeue_backoff(s, [jid], last, 60)[jid] == \
            last + timedelta(seconds=MAX_BACKOFF_S)


def test_daemon_holds_follow_the_latest_finished_action(Session):
    with Session() as s, s.begin():
        ids = jobs(s, "1", "2")
        for jid, kinds in ((ids["1"], ["hold"]), (ids["2"], ["hold", "admit"])):
            for k in kinds:
                a = store.create_action(s, job_id=jid, kind=k, state="done", to_gpus=0, now=T0)
                store.update_action(s, a.id, now=T0, finished=True)
    with Session() as s:
        assert daemon_holds(s, ids.values()) == {ids["1"]}
