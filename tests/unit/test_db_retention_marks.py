"""Retention's thinning with its marks (`retention.ThinMark`) deletes what a full pass
deletes.

Two real SQLite stores get the same random sequence of writes: progress samples and
estimates with times around the clock (late ones with old times too), actions
started and finished, and retention runs at later and later times. One store keeps
the mark each run leaves (so a run checks only the jobs that can have gained old
rows); in the other the mark is deleted before every run (a full pass over every
job). After every run both must hold exactly the same rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from malleable.db import retention, schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, Estimate, ProgressSample, Setting
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 6, 1, tzinfo=UTC)
FULL_S, MAX_PER_JOB = 600.0, 4
JOBS = 3

write = st.one_of(
    # (kind, job, seconds from the clock (negative: the past), count)
    st.tuples(st.sampled_from(("sample", "estimate")), st.integers(0, JOBS - 1),
              st.integers(-4000, 60), st.integers(1, 12)),
    st.tuples(st.sampled_from(("act", "done")), st.integers(0, JOBS - 1), st.just(0),
              st.just(0)),
    # a retention run after the clock moves on by this many seconds
    st.tuples(st.just("run"), st.just(0), st.integers(0, 1500), st.just(0)))


def _store():
    eng = make_engine("sqlite://")
    schema.prepare_schema(eng)
    sessions = session_factory(eng)
    with sessions() as s, s.begin():
        ids = store.upsert_jobs(s, [SlurmJob(job_id=str(i + 1), job_id_num=i + 1,
                                             state=JobState.RUNNING) for i in range(JOBS)],
                                T0).ids
    return eng, sessions, [ids[str(i + 1)] for i in range(JOBS)]


def _apply(sessions, jobs, op, now):
    kind, j, dt, n = op
    with sessions() as s, s.begin():
        if kind == "sample":
            store.add_progress_samples(s, [store.SampleIn(
                jobs[j], now + timedelta(seconds=dt + i), i, i, 1, 8) for i in range(n)])
        elif kind == "estimate":
            for i in range(n):
                store.record_estimate(s, job_id=jobs[j], time=now + timedelta(seconds=dt + i),
                                      model="m", params={}, remaining_work=None,
                                      remaining_work_sd=None)
        elif kind == "act":
            store.create_action(s, job_id=jobs[j], kind="requeue", state="signal", to_gpus=1,
                                now=now)
        else:   # "done": the job's unfinished actions finish
            for a in s.scalars(select(Action).where(Action.job_id == jobs[j],
                                                    Action.finished_at.is_(None))):
                store.update_action(s, a.id, now=now, state="done", finished=True)


def _run(eng, sessions, now, full_pass):
    if full_pass:
        with sessions() as s, s.begin():
            s.execute(delete(Setting).where(Setting.key.like("retention.thinned.%")))
    return (retention.downsample_progress(eng, now, full_s=FULL_S, max_per_job=MAX_PER_JOB),
            retention.downsample_estimates(eng, now, full_s=FULL_S, max_per_job=MAX_PER_JOB))


def _rows(sessions):
    with sessions() as s:
        return (s.scalars(select(ProgressSample.id).order_by(ProgressSample.id)).all(),
                s.scalars(select(Estimate.id).order_by(Estimate.id)).all())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(write, min_size=1, max_size=30))
# rows that were recent at the last run and are old now (the mark's ``recent``) ...
@example([("sample", 0, -300, 12), ("run", 0, 0, 0), ("run", 0, 700, 0)])
# ... rows inserted since the last run with old times (ids above its ``max_id``) ...
@example([("run", 0, 0, 0), ("sample", 1, -4000, 12), ("run", 0, 0, 0)])
# ... and a job the last run could not thin (``carry``)
@example([("act", 2, 0, 0), ("sample", 2, -4000, 12), ("run", 0, 0, 0), ("done", 2, 0, 0),
          ("run", 0, 0, 0)])
def test_a_run_with_marks_deletes_what_a_full_pass_deletes(ops):
    (e1, marked, jobs1), (e2, full, jobs2) = _store(), _store()
    now = T0
    try:
        for op in ops:
            if op[0] == "run":
                now += timedelta(seconds=op[2])
                assert _run(e1, marked, now, False) == _run(e2, full, now, True)
                assert _rows(marked) == _rows(full)
                with marked() as s:   # (the mark the next run starts from)
                    mark = retention.ThinMark.from_json(store.get_setting(
                        s, retention.THIN_MARK_KEY.format(table="progress_samples")))
                assert mark is not None and mark.cutoff == now - timedelta(seconds=FULL_S)
            else:
                _apply(marked, jobs1, op, now)
                _apply(full, jobs2, op, now)
        now += timedelta(seconds=FULL_S)
        assert _run(e1, marked, now, False) == _run(e2, full, now, True)
        assert _rows(marked) == _rows(full)
    finally:
        e1.dispose()
        e2.dispose()


def test_a_run_checks_every_job_when_the_settings_change_or_a_day_has_passed(tmp_path):
    eng, sessions, (a, b, _c) = _store()
    try:
        with sessions() as s, s.begin():
            store.add_progress_samples(s, [store.SampleIn(a, T0 - timedelta(hours=2, seconds=i),
                                                          i, i, 1, 8) for i in range(20)])
        assert retention.downsample_progress(eng, T0, full_s=FULL_S, max_per_job=10) == 10
        # Nothing new: with the same settings the next run counts no job ...
        assert retention.downsample_progress(eng, T0, full_s=FULL_S, max_per_job=10) == 0
        # ... with fewer rows allowed it checks every job (a full pass).
        assert retention.downsample_progress(eng, T0, full_s=FULL_S, max_per_job=4) == 6
        key = retention.THIN_MARK_KEY.format(table="progress_samples")
        with sessions() as s:
            mark = retention.ThinMark.from_json(store.get_setting(s, key))
        assert mark.full_at == T0 and mark.max_per_job == 4 and mark.carry == ()
        # A mark it cannot read, or one whose full pass is a day old: a full pass.
        for value, at in (({"cutoff": "yesterday"}, T0),
                          (mark.as_json(), T0 + timedelta(seconds=retention.FULL_PASS_S))):
            with sessions() as s, s.begin():
                store.set_setting(s, key, value, T0)
            retention.downsample_progress(eng, at, full_s=FULL_S, max_per_job=4)
            with sessions() as s:
                assert retention.ThinMark.from_json(store.get_setting(s, key)).full_at == at
        with sessions() as s, s.begin():   # (b gained no row: a full pass finds it unchanged)
            assert store.count_samples(s, a) == 4 and store.count_samples(s, b) == 0
    finally:
        eng.dispose()
