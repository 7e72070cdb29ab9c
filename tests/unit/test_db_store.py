"""The repository API on a real SQLite database migrated to head."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.exc import IntegrityError

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import (
    Action,
    Job,
    JobEvent,
    ProgressFile,
    ProgressSample,
    Setting,
    Target,
)
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/store.db")
    schema.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def Session(engine):
    return session_factory(engine)


def sj(job_id: str, state=JobState.PENDING, gpus=4, nodes=1, comment="", restarts=0, **kw):
    return SlurmJob(job_id=job_id, job_id_num=int(job_id.split("_")[0]), state=state, gpus=gpus,
                    node_count=nodes, gpus_per_node=gpus // max(nodes, 1), comment=comment,
                    restart_count=restarts, user="alice", uid=1000, partition="gpu", **kw)


def parse(comment: str):
    if not comment.startswith("malleable:"):
        return None
    body = comment.split(":", 1)[1]
    if body == "bad":
        raise ValueError("malleable spec: gpus = 'x': expected a range like 1-8")
    lo, hi = body.split("-")
    return {"min_gpus": int(lo), "max_gpus": int(hi)}


def test_upsert_records_new_state_size_and_restart_events(Session):
    with Session() as s, s.begin():
        r = store.upsert_jobs(s, [sj("101", comment="malleable:1-8"), sj("102_3")], T0,
                              parse_spec=parse)
        assert (r.new, r.changed, r.events) == (2, 0, 2)
        assert set(r.ids) == {"101", "102_3"}
    t1 = T0 + timedelta(seconds=30)
    with Session() as s, s.begin():
        r = store.upsert_jobs(s, [sj("101", JobState.RUNNING, gpus=8, nodes=2,
                                     comment="malleable:1-8", restarts=1),
                                  sj("102_3")], t1, parse_spec=parse)
        assert (r.new, r.changed, r.events) == (0, 1, 3)
    with Session() as s:
        job = store.get_job(s, "101")
        assert job.state == "RUNNING" and (job.gpus, job.nodes, job.gpus_per_node) == (8, 2, 4)
        assert job.malleable and job.spec == {"min_gpus": 1, "max_gpus": 8}
        assert job.spec_text == "malleable:1-8" and job.spec_error is None
        assert job.first_seen == T0 and job.last_seen == t1 and job.restart_count == 1
        assert job.user == "alice" and job.uid == 1000 and job.partition == "gpu"
        evs = [(e.kind, e.old_state, e.new_state, e.old_gpus, e.new_gpus, e.time)
               for e in store.job_events(s, job.id)]
        assert evs == [("new", None, "PENDING", None, 4, T0),
                       ("state", "PENDING", "RUNNING", None, None, t1),
                       ("size", None, None, 4, 8, t1),
                       ("restart", None, None, None, None, t1)]
        assert not store.get_job(s, "102_3").malleable
        assert [e.kind for e in store.job_events(s, store.get_job(s, "102_3").id)] == ["new"]


def test_bad_spec_is_stored_and_does_not_stop_the_others(Session):
    with Session() as s, s.begin():
        store.upsert_jobs(s, [sj("1", comment="malleable:bad"), sj("2", comment="malleable:2-4")],
                          T0, parse_spec=parse)
    with Session() as s:
        bad, good = store.get_job(s, "1"), store.get_job(s, "2")
        assert not bad.malleable and bad.spec is None and "gpus = 'x'" in bad.spec_error
        assert good.malleable and good.spec == {"min_gpus": 2, "max_gpus": 4}


def test_jobs_by_state_and_ids(Session):
    with Session() as s, s.begin():
        store.upsert_jobs(s, [sj("1", comment="malleable:1-2"), sj("2", JobState.RUNNING),
                              sj("3", JobState.COMPLETED)], T0, parse_spec=parse)
    with Session() as s:
        assert [j.slurm_job_id for j in store.jobs_in_states(s, {"PENDING", "RUNNING"})] == \
            ["1", "2"]
        assert [j.slurm_job_id for j in store.jobs_in_states(s, {"PENDING"}, malleable=True)] \
            == ["1"]
        assert [j.slurm_job_id for j in store.active_jobs(s)] == ["1", "2"]
        ids = store.job_ids(s, ["3", "1", "nope"])
        assert set(ids) == {"1", "3"}


def _samples(job_id: int, n: int, start=T0, every=10.0):
    return [store.SampleIn(job_id=job_id, time=start + timedelta(seconds=every * i), step=i,
                           samples=i * 64, gpus=4, batch_size=64, nodes=1, metric=1.0 / (i + 1),
                           grad_sqr=0.5, grad_var=2.0) for i in range(n)]


def test_samples_bulk_and_latest_n(Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("1"), sj("2"), sj("3")], T0).ids
        a, b = ids["1"], ids["2"]
        assert store.add_progress_samples(s, _samples(a, 250)) == 250
        assert store.add_progress_samples(s, [dict(job_id=b, time=T0, step=7, samples=1, gpus=1,
                                                   batch_size=8)]) == 1
        assert store.add_progress_samples(s, []) == 0
    with Session() as s:
        got = store.latest_samples(s, [a, b, ids["3"]], 100)
        assert [r.step for r in got[a]] == list(range(150, 250))
        assert got[a][-1].time == T0 + timedelta(seconds=2490)
        assert got[a][0].grad_var == 2.0 and got[a][0].nodes == 1
        assert [r.step for r in got[b]] == [7] and got[b][0].metric is None
        assert got[ids["3"]] == []
        assert store.count_samples(s) == 251 and store.count_samples(s, a) == 250
        with pytest.raises(ValueError, match="n = 0"):
            store.latest_samples(s, [a], 0)


def test_sample_for_unknown_job_and_naive_time_refused(Session):
    with Session() as s, pytest.raises(IntegrityError), s.begin():
        store.add_progress_samples(s, _samples(999, 1))
    with Session() as s, pytest.raises(Exception, match="naive datetime"), s.begin():
        jid = store.upsert_jobs(s, [sj("1")], T0).ids["1"]
        store.add_progress_samples(s, [dict(job_id=jid, time=datetime(2026, 1, 1), step=0,
                                            samples=0, gpus=1, batch_size=1)])


def test_decision_with_targets_and_estimates(Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("1"), sj("2")], T0).ids
        d = store.record_decision(
            s, time=T0, policy="hesrpt", params={"p": 0.7}, inputs_digest="abc", objective=12.5,
            duration_s=0.03, dry_run=True,
            targets=[store.TargetIn(ids["1"], 8, 256, "largest share"),
                     store.TargetIn(ids["2"], 0, None, "waits")])
        store.record_estimate(s, job_id=ids["1"], time=T0, model="amdahl", params={"p": 0.5},
                              remaining_work=1e6, remaining_work_sd=1e5)
        store.record_estimate(s, job_id=ids["1"], time=T0 + timedelta(minutes=1),
                              model="amdahl", params={"p": 0.6}, remaining_work=9e5,
                              remaining_work_sd=8e4, flags={"extrapolated": True})
    with Session() as s:
        latest = store.latest_decision(s)
        assert latest.id == d and latest.dry_run and latest.params == {"p": 0.7}
        assert sorted((t.gpus, t.batch_size, t.reason) for t in latest.targets) == \
            [(0, None, "waits"), (8, 256, "largest share")]
        est = store.latest_estimates(s, [ids["1"], ids["2"]])
        assert list(est) == [ids["1"]] and est[ids["1"]].params == {"p": 0.6}
        assert est[ids["1"]].flags == {"extrapolated": True}
    with Session() as s, pytest.raises(IntegrityError), s.begin():
        store.record_decision(s, time=T0, policy="x", params={}, inputs_digest="", objective=None,
                              duration_s=0, dry_run=False,
                              targets=[store.TargetIn(ids["1"], 1), store.TargetIn(ids["1"], 2)])
    with Session() as s, pytest.raises(ValueError, match="gpus = -1"):
        store.record_decision(s, time=T0, policy="x", params={}, inputs_digest="", objective=None,
                              duration_s=0, dry_run=False, targets=[store.TargetIn(ids["1"], -1)])


def test_action_lifecycle(Session):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("1", JobState.RUNNING)], T0).ids["1"]
        a = store.create_action(s, job_id=jid, kind="requeue", state="signal", from_gpus=4,
                                to_gpus=8, from_nodes=1, to_nodes=2, now=T0,
                                restart_count_at_start=0)
        b = store.create_action(s, job_id=jid, kind="hold", state="hold", to_gpus=0, now=T0)
    t1 = T0 + timedelta(seconds=5)
    with Session() as s, s.begin():
        store.update_action(s, a.id, now=t1, state="wait_checkpoint", add_attempt=True,
                            signalled_at=t1, last_error="Slurm said no",
                            next_attempt_at=t1 + timedelta(seconds=60))
        store.update_action(s, b.id, now=t1, state="done", finished=True)
        assert [x.id for x in store.unfinished_actions(s)] == [a.id]
    with Session() as s:
        got = s.get(Action, a.id)
        assert (got.state, got.attempts, got.signalled_at, got.updated_at, got.created_at) == \
            ("wait_checkpoint", 1, t1, t1, T0)
        assert got.last_error == "Slurm said no" and got.finished_at is None
        assert s.get(Action, b.id).finished_at == t1
        assert store.unfinished_actions(s, job_id=jid)[0].id == a.id
        with pytest.raises(LookupError, match="action 999"):
            store.update_action(s, 999, now=t1)
        with pytest.raises(ValueError, match="to_gpus = -2"):
            store.create_action(s, job_id=jid, kind="shrink", state="shrink", to_gpus=-2, now=t1)


def test_unfinished_action_rows_oldest_first_through_the_partial_index(Session, engine):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("1", JobState.RUNNING)], T0).ids["1"]
        made = [store.create_action(s, job_id=jid, kind="hold", state="hold", to_gpus=0,
                                    now=T0).id for _ in range(6)]
        for a in made[::2]:
            store.update_action(s, a, now=T0, state="done", finished=True)
    with Session() as s:
        rows = store.unfinished_action_rows(s)
        assert [r.id for r in rows] == made[1::2]
        assert [a.id for a in store.unfinished_actions(s)] == made[1::2]
        assert rows[0].kind == "hold" and rows[0].finished_at is None
    # The read must not walk the whole table (it did with ORDER BY id in SQL).
    with engine.connect() as c:
        sql = str(store._UNFINISHED_ACTIONS.compile(dialect=engine.dialect))
        plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
    assert "ix_actions_unfinished" in plan, plan


def test_settings_pause_and_policy(Session):
    with Session() as s:
        assert store.get_setting(s, "missing", 5) == 5
        assert not store.is_paused(s)
        assert store.active_policy(s, "default", {"a": 1}) == ("default", {"a": 1})
        assert store.operator_settings(s) == (False, None)
    with Session() as s, s.begin():
        store.set_paused(s, True, T0)
        store.set_policy(s, "hesrpt", {"p": 0.7}, T0)
        store.set_setting(s, "x", {"nested": [1, 2]}, T0)
        store.set_setting(s, "x", [3], T0)
    with Session() as s:
        assert store.is_paused(s)
        assert store.active_policy(s, "default") == ("hesrpt", {"p": 0.7})
        assert store.operator_settings(s) == (True, ("hesrpt", {"p": 0.7}))
        assert store.get_setting(s, "x") == [3]


def test_progress_file_offsets_and_rejections(Session):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("1")], T0).ids["1"]
        assert store.get_progress_file(s, jid) is None
        store.save_progress_file(s, job_id=jid, path="/spool/1.jsonl", device=2049, inode=77,
                                 offset=100, size=120, now=T0, accepted=3,
                                 rejected={"not_json": 1})
        pf = store.save_progress_file(s, job_id=jid, path="/spool/1.jsonl", device=2049,
                                      inode=77, offset=220, size=220, now=T0, accepted=2,
                                      rejected={"not_json": 2, "future_time": 1})
        assert (pf.offset, pf.size, pf.lines_accepted) == (220, 220, 5)
        assert pf.rejected == {"not_json": 3, "future_time": 1}
        with pytest.raises(ValueError, match="offset = -1"):
            store.save_progress_file(s, job_id=jid, path="p", device=None, inode=None,
                                     offset=-1, size=0, now=T0)


def test_deleting_a_job_cascades_to_its_rows(Session):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("1")], T0).ids["1"]
        store.add_progress_samples(s, _samples(jid, 3))
        store.record_decision(s, time=T0, policy="x", params={}, inputs_digest="",
                              objective=None, duration_s=0, dry_run=False,
                              targets=[store.TargetIn(jid, 1)])
        store.create_action(s, job_id=jid, kind="hold", state="hold", to_gpus=0, now=T0)
    with Session() as s, s.begin():
        s.delete(s.get(Job, jid))
    with Session() as s:
        for model in (JobEvent, ProgressSample, Target, Action):
            assert s.scalars(select(model)).first() is None, model


def test_attained_service_accrues_while_running_and_arrival_survives_requeue(Session):
    submit = T0 - timedelta(seconds=100)
    with Session() as s, s.begin():
        store.upsert_jobs(s, [sj("301", submit_time=submit)], T0)
    steps = [  # (seconds after T0, state, gpus, Slurm's submit time after a requeue)
        (30, JobState.RUNNING, 4, submit),       # started between polls: nothing yet
        (90, JobState.RUNNING, 4, submit),       # 60 s x 4 GPUs
        (120, JobState.PENDING, 8, T0 + timedelta(seconds=110)),  # requeued: 30 s x 4 more
        (300, JobState.PENDING, 8, T0 + timedelta(seconds=110)),  # pending accrues nothing
        (330, JobState.RUNNING, 8, T0 + timedelta(seconds=110)),
        (360, JobState.RUNNING, 8, T0 + timedelta(seconds=110)),  # 30 s x 8
    ]
    for dt, state, gpus, st in steps:
        with Session() as s, s.begin():
            store.upsert_jobs(s, [sj("301", state, gpus=gpus, nodes=gpus // 4,
                                     submit_time=st)], T0 + timedelta(seconds=dt))
    with Session() as s:
        job = store.get_job(s, "301")
        assert job.attained_gpu_s == pytest.approx(60 * 4 + 30 * 4 + 30 * 8)
        assert job.arrival_time == submit          # not Slurm's reset submit time
        assert job.submit_time == T0 + timedelta(seconds=110)


def test_samples_carry_their_run(Session):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("401")], T0).ids["401"]
        store.add_progress_samples(s, [store.SampleIn(jid, T0, 10, 320, 4, 32, restart=2)])
    with Session() as s:
        (row,) = store.latest_samples(s, [jid], 5)[jid]
        assert row.restart == 2


def test_record_estimates_in_bulk_equals_one_by_one(Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("501"), sj("502")], T0).ids
        n = store.record_estimates(s, [
            {"job_id": ids["501"], "time": T0, "model": "pollux", "params": {"p": 0.5},
             "remaining_work": 10.0, "remaining_work_sd": 1.0, "flags": {"bits": 1}},
            {"job_id": ids["502"], "time": T0, "model": "pollux", "params": {"p": 0.7},
             "remaining_work": None, "remaining_work_sd": None, "flags": None}])
        assert n == 2
    with Session() as s:
        got = store.latest_estimates(s, ids.values())
        assert got[ids["501"]].params == {"p": 0.5} and got[ids["501"]].flags == {"bits": 1}
        assert got[ids["502"]].remaining_work is None and got[ids["502"]].flags is None


class Statements:
    """The SQL statements the engine runs while counting (``with Statements(engine) as st``)."""

    def __init__(self, engine):
        self.engine, self.sql = engine, []

    def _record(self, conn, cursor, statement, parameters, context, executemany):
        self.sql.append(" ".join(statement.split()))

    def __enter__(self):
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *exc):
        event.remove(self.engine, "before_cursor_execute", self._record)

    def count(self, prefix: str) -> int:
        return sum(s.startswith(prefix) for s in self.sql)


def jobs_table(Session) -> list[tuple]:
    with Session() as s:
        return [tuple(r) for r in s.execute(select(Job.__table__).order_by(Job.id))]


def test_upsert_unlisted_in_returns_the_active_jobs_not_listed(Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("1", JobState.RUNNING), sj("2"), sj("3"),
                                    sj("4", JobState.COMPLETED)], T0).ids
    t1 = T0 + timedelta(seconds=30)
    with Session() as s, s.begin():
        r = store.upsert_jobs(s, [sj("2", JobState.RUNNING), sj("5")], t1,
                              unlisted_in=("PENDING", "RUNNING"))
        assert r.unlisted == {"1": ids["1"], "3": ids["3"]}
        assert (r.new, set(r.ids)) == (1, {"2", "5"})
        # Not asked: nothing read beyond the jobs given.
        assert store.upsert_jobs(s, [], t1).unlisted == {}
        assert store.upsert_jobs(s, [], t1, unlisted_in=["RUNNING"]).unlisted == {
            "1": ids["1"], "2": ids["2"]}
    with Session() as s:   # the unlisted jobs are left as they were
        assert store.get_job(s, "1").last_seen == T0 and store.get_job(s, "3").state == "PENDING"


def test_upsert_of_unchanged_jobs_is_two_updates_and_keeps_attained_service(engine, Session):
    with Session() as s, s.begin():
        store.upsert_jobs(s, [sj("1", JobState.RUNNING, gpus=2), sj("2"),
                              sj("3", JobState.SUSPENDED)], T0)
    t1 = T0 + timedelta(seconds=10)
    with Session() as s, s.begin(), Statements(engine) as st:
        store.upsert_jobs(s, [sj("1", JobState.RUNNING, gpus=2), sj("2"),
                              sj("3", JobState.SUSPENDED)], t1)
    # Jobs whose only change is the poll's time: the running one's attained service
    # grows (an executemany), the idle ones get last_seen by one UPDATE ... IN.
    assert st.count("UPDATE jobs") == 2
    updates = [q for q in st.sql if q.startswith("UPDATE jobs")]
    assert any(q.startswith("UPDATE jobs SET last_seen=?, attained_gpu_s=?") for q in updates)
    assert any(q.startswith("UPDATE jobs SET last_seen=? WHERE jobs.id IN") for q in updates)
    with Session() as s:
        got = {j.slurm_job_id: (j.last_seen, j.attained_gpu_s) for j in s.scalars(select(Job))}
    assert got == {"1": (t1, 20.0), "2": (t1, 0.0), "3": (t1, 0.0)}


@pytest.mark.parametrize("json_each", [True, False])
def test_upsert_touches_many_idle_jobs_in_one_statement_or_chunks_of_500(
        engine, Session, monkeypatch, json_each):
    # SQLite 3.38+ (json_each): the ids as one JSON array; otherwise IN lists of 500.
    monkeypatch.setattr(store, "_SQLITE_JSON", json_each)
    queue = [sj(str(i)) for i in range(1, 1202)]
    with Session() as s, s.begin():
        store.upsert_jobs(s, queue, T0)
    t1 = T0 + timedelta(seconds=30)
    with Session() as s, s.begin(), Statements(engine) as st:
        store.upsert_jobs(s, queue, t1)
    if json_each:
        assert st.count("UPDATE jobs SET last_seen=? WHERE jobs.id IN (SELECT value FROM "
                        "json_each(?))") == 1
    else:
        assert st.count("UPDATE jobs SET last_seen=? WHERE jobs.id IN") == 3   # 500+500+201
    with Session() as s:
        assert set(s.scalars(select(Job.last_seen))) == {t1}


def test_set_setting_is_one_statement_and_expires_a_loaded_setting(engine, Session):
    with Session() as s, s.begin():
        store.set_setting(s, "k", {"a": 1}, T0)
    with Session() as s, s.begin():
        loaded = s.get(Setting, "k")
        assert loaded.value == {"a": 1}
        with Statements(engine) as st:
            store.set_setting(s, "k", None, T0 + timedelta(seconds=1))
        assert len(st.sql) == 1 and st.sql[0].startswith("INSERT INTO settings")
        assert loaded.value is None and loaded.updated_at == T0 + timedelta(seconds=1)
    with Session() as s:
        # JSON null, as before (not SQL NULL): the key is set, to None.
        assert s.execute(text("SELECT value FROM settings WHERE key = 'k'")).scalar() == "null"
        assert store.get_setting(s, "k", "default") is None


def test_add_job_events_in_bulk_equals_one_by_one(Session):
    with Session() as s, s.begin():
        jid = store.upsert_jobs(s, [sj("1")], T0).ids["1"]
    events = [(jid, T0 + timedelta(seconds=i), kind, f'{{"step":{i}}}')
              for i, kind in enumerate(["started", "checkpointed", "finished"])]

    def rows(s):
        return [(e.job_id, e.time, e.kind, e.old_state, e.new_state, e.old_gpus, e.new_gpus,
                 e.old_nodes, e.new_nodes, e.detail)
                for e in store.job_events(s, jid) if e.kind != "new"]

    with Session() as s, s.begin():
        assert store.add_job_events(s, events) == 3
        assert store.add_job_events(s, []) == 0
        bulk = rows(s)
        ids = [e.id for e in store.job_events(s, jid) if e.kind != "new"]
        assert ids == sorted(ids)
        s.rollback()
    with Session() as s, s.begin():
        for e in events:
            store.add_job_event(s, *e)
        s.flush()
        assert rows(s) == bulk


def test_progress_files_joined_to_jobs_equal_progress_file_rows(Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("1"), sj("2"), sj("3")], T0).ids
        store.save_progress_file(s, job_id=ids["1"], path="/spool/1.jsonl", device=1, inode=2,
                                 offset=10, size=12, now=T0, accepted=1, rejected={"x": 1})
        store.save_progress_file(s, job_id=ids["3"], path="/spool/3.jsonl", device=1, inode=3,
                                 offset=0, size=0, now=T0)
    query = store.with_progress_files(select(Job.id, Job.slurm_job_id).order_by(Job.id))
    with Session() as s:
        rows = store.run_core(s, query).all()
        assert [r.slurm_job_id for r in rows] == ["1", "2", "3"]
        assert store.progress_files_of(rows) == store.progress_file_rows(s, ids.values())
        assert set(store.progress_files_of(rows)) == {ids["1"], ids["3"]}


def test_save_progress_files_writes_only_changed_columns_and_the_same_rows(engine, Session):
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [sj("1"), sj("2"), sj("3")], T0).ids
        for k in ("1", "2"):
            store.save_progress_file(s, job_id=ids[k], path=f"/spool/{k}.jsonl", device=1,
                                     inode=int(k), offset=10, size=10, now=T0, accepted=1,
                                     rejected={"not_json": 1})

    def read_all(s):
        files = store.progress_file_rows(s, ids.values())
        before = {j: dict(r) for j, r in files.items()}
        t1 = T0 + timedelta(seconds=5)
        rows = [store.read_progress_file(files[ids["1"]], job_id=ids["1"], path="/spool/1.jsonl",
                                         device=1, inode=1, offset=20, size=25, now=t1,
                                         accepted=2),
                # replaced file, new rejection
                store.read_progress_file(files[ids["2"]], job_id=ids["2"], path="/spool/2.jsonl",
                                         device=1, inode=9, offset=5, size=5, now=t1,
                                         rejected={"too_long": 1}),
                store.read_progress_file(None, job_id=ids["3"], path="/spool/3.jsonl",
                                         device=1, inode=3, offset=7, size=7, now=t1, accepted=1)]
        return rows, before

    def table(s):
        return sorted(tuple(r) for r in s.execute(select(ProgressFile.__table__)))

    with Session() as s, s.begin():
        rows, _ = read_all(s)
        store.save_progress_files(s, rows)          # every column written
        every = table(s)
        s.rollback()
    with Session() as s, s.begin(), Statements(engine) as st:
        rows, before = read_all(s)
        store.save_progress_files(s, rows, before)  # only what changed
        assert table(s) == every
    updates = [q for q in st.sql if q.startswith("UPDATE progress_files")]
    assert sorted(updates) == [
        'UPDATE progress_files SET "offset"=?, size=?, last_read_at=?, lines_accepted=? '
        'WHERE progress_files.id = ?',
        'UPDATE progress_files SET inode=?, "offset"=?, size=?, last_read_at=?, '
        'rejected=? WHERE progress_files.id = ?']
    assert st.count("INSERT INTO progress_files") == 1


def test_an_id_slurm_gives_to_a_new_job_starts_a_new_row(Session):
    # Slurm's job ids start again after its state is reset: a new job "5" after the
    # finished one. The finished job keeps its rows under "5~<id>"; the new one starts
    # with no attained service, and reads the spool file from where the old one stopped.
    T1 = T0 + timedelta(hours=2)
    with Session() as s, s.begin():
        old = store.upsert_jobs(s, [sj("5", JobState.RUNNING, submit_time=T0)], T0).ids["5"]
        store.upsert_jobs(s, [sj("5", JobState.RUNNING, submit_time=T0)], T0 + timedelta(hours=1))
        store.upsert_jobs(s, [sj("5", JobState.COMPLETED, submit_time=T0)],
                          T0 + timedelta(hours=1, seconds=30))
        store.save_progress_file(s, job_id=old, path="/spool/5.jsonl", device=1, inode=2,
                                 offset=900, size=900, now=T0, accepted=9)
    with Session() as s, s.begin():
        new = store.upsert_jobs(s, [sj("5", submit_time=T1)], T1).ids["5"]
    assert new != old
    with Session() as s:
        rows = {j.id: j for j in s.scalars(select(Job))}
        assert rows[old].slurm_job_id == f"5~{old}" and rows[old].state == "COMPLETED"
        assert rows[old].attained_gpu_s == pytest.approx(4 * 3630.0)
        assert rows[new].slurm_job_id == "5" and rows[new].state == "PENDING"
        assert rows[new].attained_gpu_s == 0.0 and rows[new].arrival_time == T1
        assert store.get_progress_file(s, old) is None
        assert store.get_progress_file(s, new).offset == 900
        kinds = {(e.job_id, e.kind) for e in s.scalars(select(JobEvent))}
        assert (old, "renamed") in kinds and (new, "new") in kinds


def test_a_finished_job_slurm_requeues_keeps_its_row(Session):
    # `scontrol requeue` of a finished job: the same job again, its restart count up.
    T1 = T0 + timedelta(hours=2)
    with Session() as s, s.begin():
        first = store.upsert_jobs(s, [sj("6", JobState.COMPLETED, submit_time=T0)], T0).ids["6"]
        again = store.upsert_jobs(s, [sj("6", submit_time=T1, restarts=1)], T1).ids["6"]
        # Still listed as finished, the same submit time: the same job.
        same = store.upsert_jobs(s, [sj("7", JobState.FAILED, submit_time=T0)], T0).ids["7"]
        assert store.upsert_jobs(s, [sj("7", JobState.FAILED, submit_time=T0)], T1).ids["7"] \
            == same
    assert again == first


def test_reparse_specs_applies_this_versions_rules_to_stored_specs(Session):
    """A spec stored by an older malleable (batch=2**63-1, accepted then) kept that
    version's reading: the poll parses a comment only when it changes. The daemon now
    parses every active job's comment again at start."""
    from malleable.daemon.cycle import spec_as_dict
    from malleable.db.models import Job

    big = "malleable:gpus=1-4,batch=9223372036854775807"
    ok = "malleable:gpus=1-4,batch=64"
    old = {"min_gpus": 1, "max_gpus": 4, "batch_size": 2**63 - 1}   # the old reading
    with Session() as s, s.begin():
        store.upsert_jobs(s, [SlurmJob(job_id=i, job_id_num=int(i), comment=c,
                                       state=JobState.RUNNING)
                              for i, c in (("1", big), ("2", ok))], T0,
                          parse_spec=lambda c: old if c == big else spec_as_dict(c))
    with Session() as s, s.begin():
        invalid = store.reparse_specs(s, spec_as_dict)
    assert list(invalid) == ["1"] and "batch=9223372036854775807: too large" in invalid["1"]
    with Session() as s:
        one, two = s.scalars(select(Job).order_by(Job.id))
        assert (one.malleable, one.spec, one.spec_error) == (False, None, invalid["1"])
        assert two.malleable and two.spec["batch_size"] == 64 and two.spec_error is None
    with Session() as s, s.begin():
        assert store.reparse_specs(s, spec_as_dict) == {}   # nothing new the second time
