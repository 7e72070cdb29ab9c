"""Retention on SQLite: downsampling bounds, pruning, and unfinished actions left alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from malleable.config import RetentionConfig
from malleable.db import retention, schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import (
    Action,
    Decision,
    Estimate,
    Job,
    JobEvent,
    ProgressFile,
    ProgressSample,
    Target,
)
from malleable.slurm.records import JobState, SlurmJob

NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/r.db")
    schema.upgrade(eng)
    yield eng
    eng.dispose()


def test_thinned_ranks():
    assert retention.thinned_ranks(10, 20) == list(range(10))
    assert retention.thinned_ranks(10, 0) == []
    assert retention.thinned_ranks(10, 1) == [9]
    assert retention.thinned_ranks(10, 2) == [0, 9]
    assert retention.thinned_ranks(10, 4) == [0, 3, 6, 9]
    for m in range(1, 60):
        for k in range(0, m + 3):
            r = retention.thinned_ranks(m, k)
            assert len(r) == min(m, k) and len(set(r)) == len(r)
            assert all(0 <= x < m for x in r) and r == sorted(r)
    with pytest.raises(ValueError):
        retention.thinned_ranks(-1, 2)


def _job(s, sid, state=JobState.RUNNING, seen=NOW, end=None):
    return store.upsert_jobs(s, [SlurmJob(job_id=sid, job_id_num=int(sid), state=state,
                                          end_time=end)], seen).ids[sid]


def test_downsampling_keeps_recent_and_bounds_old(engine):
    Session = session_factory(engine)
    with Session() as s, s.begin():
        a, b = _job(s, "1"), _job(s, "2")
        # job a: 1000 samples 10 s apart, the last 360 within the last hour
        store.add_progress_samples(s, [
            store.SampleIn(a, NOW - timedelta(seconds=10 * (999 - i) + 5), i, i, 1, 8)
            for i in range(1000)])
        store.add_progress_samples(s, [store.SampleIn(b, NOW - timedelta(days=3), 0, 0, 1, 8)])
        for i in range(300):
            store.record_estimate(s, job_id=a, time=NOW - timedelta(hours=5, seconds=i),
                                  model="m", params={}, remaining_work=1.0,
                                  remaining_work_sd=0.1)
    cfg = RetentionConfig(finished_job_days=30, progress_full_s=3600, progress_max_per_job=100)
    report = retention.apply_retention(engine, cfg, NOW)
    with Session() as s:
        steps = [r[0] for r in s.execute(select(ProgressSample.step)
                                         .where(ProgressSample.job_id == a)
                                         .order_by(ProgressSample.time))]
        recent = [x for x in steps if x >= 1000 - 360]
        old = [x for x in steps if x < 1000 - 360]
        assert len(recent) == 360 and recent == list(range(640, 1000))   # full resolution
        assert len(old) == 100 and old[0] == 0 and old[-1] == 639         # thinned, ends kept
        gaps = {y - x for x, y in zip(old, old[1:], strict=False)}
        assert max(gaps) - min(gaps) <= 1                                   # evenly spaced
        assert store.count_samples(s, b) == 1
        assert s.scalar(select(func.count()).select_from(Estimate)) == 100
    assert report.samples_deleted == 1000 - 460 and report.estimates_deleted == 200
    # a second run changes nothing
    assert retention.apply_retention(engine, cfg, NOW) == retention.RetentionReport()


def test_prune_finished_jobs_with_children_but_never_with_unfinished_action(engine):
    Session = session_factory(engine)
    old_end = NOW - timedelta(days=40)
    with Session() as s, s.begin():
        done = _job(s, "1", JobState.COMPLETED, seen=old_end, end=old_end)
        busy = _job(s, "2", JobState.CANCELLED, seen=old_end, end=old_end)
        recent = _job(s, "3", JobState.FAILED, seen=NOW, end=NOW - timedelta(days=1))
        running = _job(s, "4", JobState.RUNNING, seen=old_end)   # not finished: kept
        no_end = _job(s, "5", JobState.TIMEOUT, seen=old_end)    # no end time: last_seen
        for j in (done, busy, recent, running, no_end):
            store.add_progress_samples(s, [store.SampleIn(j, old_end, 0, 0, 1, 8)])
            store.save_progress_file(s, job_id=j, path=f"/p/{j}", device=1, inode=j, offset=0,
                                     size=0, now=old_end)
        d_old = store.record_decision(s, time=old_end, policy="p", params={}, inputs_digest="",
                                      objective=None, duration_s=0, dry_run=False,
                                      targets=[store.TargetIn(done, 1), store.TargetIn(busy, 1)])
        d_kept = store.record_decision(s, time=old_end, policy="p", params={},
                                       inputs_digest="", objective=None, duration_s=0,
                                       dry_run=False, targets=[])
        store.create_action(s, job_id=done, kind="hold", state="done", to_gpus=0, now=old_end,
                            decision_id=d_old)
        store.update_action(s, store.unfinished_actions(s)[0].id, now=old_end, finished=True)
        store.create_action(s, job_id=busy, kind="requeue", state="signal", to_gpus=4,
                            now=old_end, decision_id=d_kept)
    cfg = RetentionConfig(finished_job_days=30)
    report = retention.apply_retention(engine, cfg, NOW)
    assert report.jobs_pruned == 2 and report.decisions_pruned == 1
    with Session() as s:
        left = set(s.scalars(select(Job.id)))
        assert left == {busy, recent, running}
        for model in (ProgressSample, JobEvent, ProgressFile):
            assert set(s.scalars(select(model.job_id))) == left, model
        assert set(s.scalars(select(Decision.id))) == {d_kept}
        assert set(s.scalars(select(Target.job_id))) == set()
        assert [a.job_id for a in s.scalars(select(Action))] == [busy]
    # once its action finishes, the job goes too
    with Session() as s, s.begin():
        store.update_action(s, store.unfinished_actions(s)[0].id, now=NOW, finished=True)
    assert retention.apply_retention(engine, cfg, NOW).jobs_pruned == 1


def test_job_with_unfinished_action_is_not_thinned(engine):
    Session = session_factory(engine)
    with Session() as s, s.begin():
        a = _job(s, "1")
        store.add_progress_samples(s, [store.SampleIn(a, NOW - timedelta(days=1, seconds=i), i,
                                                      i, 1, 8) for i in range(30)])
        act = store.create_action(s, job_id=a, kind="requeue", state="signal", to_gpus=2,
                                  now=NOW)
    assert retention.downsample_progress(engine, NOW, full_s=60, max_per_job=10) == 0
    with Session() as s, s.begin():
        assert store.count_samples(s, a) == 30
        store.update_action(s, act.id, now=NOW, state="done", finished=True)
    assert retention.downsample_progress(engine, NOW, full_s=60, max_per_job=10) == 20


def test_negative_settings_refused(engine):
    with pytest.raises(ValueError, match="days = -1"):
        retention.prune_finished_jobs(engine, NOW, days=-1)
    with pytest.raises(ValueError, match="max_per_job = -5"):
        retention.downsample_progress(engine, NOW, full_s=10, max_per_job=-5)
