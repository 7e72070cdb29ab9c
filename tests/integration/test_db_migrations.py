"""Migrations and the store on real SQLite and a real (private) PostgreSQL server.

Each test runs twice: on an SQLite file and on a fresh database of the
session's private PostgreSQL server (tests/postgres_fixture.py).
"""

from __future__ import annotations

import multiprocessing
import os
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import inspect, select, text

from malleable.cli import main
from malleable.config import RetentionConfig
from malleable.db import retention, schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.errors import LeaseHeld, SchemaTooNew
from malleable.db.lease import acquire_lease, read_lease
from malleable.db.models import Base, Job, Lease
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TABLES = {"jobs", "job_events", "progress_samples", "estimates", "decisions", "targets",
          "actions", "settings", "lease", "progress_files", "alembic_version"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/m.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def engine(url):
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _tables(engine) -> set[str]:
    with engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        conn.rollback()
    return names


def test_upgrade_from_empty_to_head(engine):
    assert _tables(engine) == set()
    assert schema.upgrade(engine) == (None, schema.head_revision())
    assert _tables(engine) == TABLES
    assert schema.check_schema(engine) == schema.head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
        assert conn.execute(select(Lease.id, Lease.holder)).all() == [(1, None)]
        conn.rollback()
    assert diff == []


def test_downgrade_upgrade_round_trip(engine):
    schema.upgrade(engine)
    with session_factory(engine)() as s, s.begin():
        jid = store.upsert_jobs(s, [SlurmJob(job_id="7", job_id_num=7)], T0).ids["7"]
        store.add_progress_samples(s, [store.SampleIn(jid, T0, 1, 2, 3, 4)])
    assert schema.downgrade(engine, "base") == (schema.head_revision(), None)
    assert _tables(engine) <= {"alembic_version"}
    assert schema.schema_status(engine).empty
    assert schema.upgrade(engine) == (None, schema.head_revision())
    assert _tables(engine) == TABLES
    with session_factory(engine)() as s, s.begin():   # usable again, and empty
        assert store.count_samples(s) == 0
        jid = store.upsert_jobs(s, [SlurmJob(job_id="7", job_id_num=7)], T0).ids["7"]
        store.add_progress_samples(s, [store.SampleIn(jid, T0, 1, 2, 3, 4)])
    assert schema.downgrade(engine, schema.head_revision()) == (schema.head_revision(),) * 2


def test_cli_upgrade_current_downgrade(url):
    runner = CliRunner()
    r = runner.invoke(main, ["db", "upgrade", "--database-url", url])
    assert r.exit_code == 0, r.output
    assert f"schema upgraded from empty to {schema.head_revision()}" in r.output
    r = runner.invoke(main, ["db", "current", "--database-url", url])
    assert r.exit_code == 0 and r.output.strip().endswith(f"{schema.head_revision()} (head)")
    r = runner.invoke(main, ["db", "downgrade", "base", "--database-url", url])
    assert r.exit_code == 0 and "to base" in r.output
    r = runner.invoke(main, ["db", "current", "--database-url", url])
    assert r.exit_code == 0 and "empty: run `malleable db upgrade`" in r.output
    # A downgrade to where the store already is says so (not "from empty to base").
    r = runner.invoke(main, ["db", "downgrade", "base", "--database-url", url])
    assert r.exit_code == 0 and "already at base (empty): nothing to downgrade" in r.output
    r = runner.invoke(main, ["db", "upgrade", "--to", schema.head_revision(),
                             "--database-url", url])
    assert r.exit_code == 0


def test_newer_schema_refused(engine):
    schema.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    with pytest.raises(SchemaTooNew, match="schema revision 0999 was written by another build "
                                           "of malleable"):
        schema.check_schema(engine)
    r = CliRunner().invoke(main, ["db", "current", "--database-url", str(engine.url
                                                                        .render_as_string(
                                                                            hide_password=False))])
    assert r.exit_code == 2 and "schema revision 0999" in r.output


def test_store_and_retention(engine):
    schema.upgrade(engine)
    Session = session_factory(engine)
    old = T0 - timedelta(days=60)
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [
            SlurmJob(job_id="1", job_id_num=1, state=JobState.RUNNING, gpus=4, node_count=1),
            SlurmJob(job_id="2_1", job_id_num=3, state=JobState.COMPLETED, end_time=old)],
            old).ids
        store.add_progress_samples(s, [store.SampleIn(ids["1"], T0 - timedelta(seconds=i), i,
                                                      i * 8, 4, 8) for i in range(50)])
        store.set_setting(s, "paused", True, T0)
        store.set_setting(s, "paused", False, T0)
        store.set_policy(s, "hesrpt", {"p": 0.6}, T0)
        d = store.record_decision(s, time=T0, policy="hesrpt", params={"p": 0.6},
                                  inputs_digest="d", objective=1.0, duration_s=0.1,
                                  dry_run=False, targets=[store.TargetIn(ids["1"], 8, 128, "x")])
        store.create_action(s, job_id=ids["1"], kind="requeue", state="signal", to_gpus=8,
                            from_gpus=4, now=T0, decision_id=d)
    with Session() as s, s.begin():
        r = store.upsert_jobs(s, [SlurmJob(job_id="1", job_id_num=1, state=JobState.RUNNING,
                                           gpus=8, node_count=2)], T0)
        assert r.events == 1
    with session_factory(engine, readonly=True)() as s:
        latest = store.latest_samples(s, [ids["1"], ids["2_1"]], 10)
        assert [x.step for x in latest[ids["1"]]] == list(range(9, -1, -1))
        assert latest[ids["1"]][-1].time == T0 and latest[ids["2_1"]] == []
        assert not store.is_paused(s)
        assert store.active_policy(s, "default") == ("hesrpt", {"p": 0.6})
        assert len(store.unfinished_actions(s)) == 1
        assert [e.kind for e in store.job_events(s, ids["1"])] == ["new", "size"]
    cfg = RetentionConfig(finished_job_days=30, progress_full_s=10, progress_max_per_job=5)
    rep = retention.apply_retention(engine, cfg, T0)
    assert rep.jobs_pruned == 1 and rep.samples_deleted == 0   # job 1 has an unfinished action
    with Session() as s, s.begin():
        store.update_action(s, store.unfinished_actions(s)[0].id, now=T0, state="done",
                            finished=True)
    rep = retention.apply_retention(engine, cfg, T0)
    assert rep.samples_deleted == 50 - 11 - 5


def _race(url: str, holder: str, barrier, results) -> None:
    eng = make_engine(url)
    barrier.wait()
    try:
        acquire_lease(eng, holder, timeout_s=300, now=T0)
        results.put((holder, "won"))
    except LeaseHeld as exc:
        results.put((holder, f"held by {exc.holder}"))
    finally:
        eng.dispose()


def test_lease_race_has_one_winner(engine, url):
    schema.upgrade(engine)
    ctx = multiprocessing.get_context("fork")
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(url, f"host:{i}", barrier, results))
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = dict(results.get(timeout=5) for _ in range(n))
    winners = [h for h, o in outcomes.items() if o == "won"]
    assert len(winners) == 1
    assert all(o == f"held by {winners[0]}" for h, o in outcomes.items() if h != winners[0])
    assert read_lease(engine).holder == winners[0]
    # stale: a later daemon takes it over
    later = T0 + timedelta(seconds=301)
    assert acquire_lease(engine, "new:1", timeout_s=300, now=later).holder == "new:1"


@pytest.mark.postgres
def test_session_database_is_usable(postgres_session_url):
    eng = make_engine(postgres_session_url)
    with eng.connect() as conn:
        assert conn.execute(text("SELECT current_database()")).scalar() == "malleable"
        conn.rollback()
    eng.dispose()


def test_daemon_reads_on_both_databases(engine):
    """The decide cycle's indexed reads (latest run per job, unfinished actions, the
    finished jobs' key) give the same answers on SQLite and PostgreSQL."""
    from malleable.daemon.cycle import spec_as_dict
    from malleable.daemon.estimates import ESTIMATOR_MODEL, EstimatorBook
    from malleable.daemon.history import reporting_runs
    from malleable.daemon.inputs import _MANAGED_ROWS

    schema.upgrade(engine)
    Session = session_factory(engine)
    spec = "malleable:gpus=1-4,batch=128,model=resnet"

    def job(i: str, state: JobState) -> SlurmJob:
        return SlurmJob(job_id=i, job_id_num=int(i), state=state, gpus=2, node_count=1,
                        comment=spec, user="alice", uid=1000, partition="gpu",
                        restart_count=2 if i == "1" else 0)   # job 1 logs in run 2

    u = [0.1, -5.0, 0.2, -1.0, 0.5, -2.0, 0.0]
    with Session() as s, s.begin():
        ids = store.upsert_jobs(s, [job(i, JobState.RUNNING) for i in "123"], T0,
                                parse_spec=spec_as_dict).ids
        store.add_progress_samples(s, [
            store.SampleIn(ids["1"], T0, 1, 10, 2, 10, restart=0),
            store.SampleIn(ids["1"], T0, 2, 20, 2, 10, restart=2),
            store.SampleIn(ids["2"], T0, 1, 10, 2, 10, restart=None)])
        made = [store.create_action(s, job_id=ids["1"], kind="hold", state="hold", to_gpus=0,
                                    now=T0).id for _ in range(3)]
        store.update_action(s, made[1], now=T0, state="done", finished=True)
        for i in "12":
            store.record_estimate(s, job_id=ids[i], time=T0, model=ESTIMATOR_MODEL,
                                  params={"u": u, "log_sd": [0.5] * 7, "progress": 100.0},
                                  remaining_work=1.0, remaining_work_sd=0.1, flags={})
    book = EstimatorBook()
    with Session() as s:
        # The managed jobs' specs as the decide cycle reads them (`SharedJSON`): the
        # stored documents, one shared dict for one text.
        rows = store.run_core(s, _MANAGED_ROWS).all()
        assert [r.spec for r in rows] == [s.get(Job, r.id).spec for r in rows]
        assert rows[0].spec["model"] == "resnet" and rows[0].spec["max_gpus"] == 4
        assert reporting_runs(s, ids.values()) == {ids["1"]: 2, ids["2"]: 0}
        assert [a.id for a in store.unfinished_action_rows(s)] == [made[0], made[2]]
        book._learn_finished(s)
        assert book.finished.seen == set()
    with Session() as s, s.begin():
        store.upsert_jobs(s, [job("1", JobState.COMPLETED)], T0, parse_spec=spec_as_dict)
    with Session() as s:
        book._learn_finished(s)
        assert book.finished.seen == {ids["1"]}
        book._learn_finished(s)                      # nothing new: the same knowledge
        assert book.finished.seen == {ids["1"]} and len(book.finished.group) == 1
    with Session() as s, s.begin():
        store.upsert_jobs(s, [job("2", JobState.COMPLETED)], T0, parse_spec=spec_as_dict)
    with Session() as s:
        book._learn_finished(s)
        assert book.finished.seen == {ids["1"], ids["2"]}


def test_cli_upgrade_says_what_it_creates_and_removes_it_on_failure(tmp_path):
    """A new SQLite file and its missing directories are named on stdout; a failed
    upgrade removes them again (a directory only while it is empty)."""
    runner = CliRunner()
    db = tmp_path / "a" / "b" / "s.db"
    r = runner.invoke(main, ["db", "upgrade", "--database-url", f"sqlite:///{db}"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[1:] == [f"created directory {tmp_path / 'a'} (mode 0700)",
                                         f"created directory {tmp_path / 'a' / 'b'} (mode 0700)",
                                         f"created {db} (mode 0600)"]
    assert (db.parent.stat().st_mode & 0o777, db.stat().st_mode & 0o777) == (0o700, 0o600)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700   # every one, not the last only
    r = runner.invoke(main, ["db", "upgrade", "--database-url", f"sqlite:///{db}"])
    assert r.exit_code == 0 and "created" not in r.output          # nothing new this time
    bad = tmp_path / "x" / "y" / "s.db"
    r = runner.invoke(main, ["db", "upgrade", "--to", "nosuchrev",
                             "--database-url", f"sqlite:///{bad}"])
    assert r.exit_code == 2 and "created" not in r.output, r.output
    assert not (tmp_path / "x").exists()


def test_cli_upgrade_through_a_symbolic_link_creates_its_target(tmp_path):
    """A dangling link names the file to create (0600, in 0700 directories); a failed
    upgrade removes that file and its directories, and leaves the link."""
    link = tmp_path / "link.db"
    target = tmp_path / "real" / "r.db"
    link.symlink_to(target)
    runner = CliRunner()
    old = os.umask(0)
    try:
        r = runner.invoke(main, ["db", "upgrade", "--to", "nosuchrev",
                                 "--database-url", f"sqlite:///{link}"])
        assert r.exit_code == 2, r.output
        assert link.is_symlink() and not (tmp_path / "real").exists()
        r = runner.invoke(main, ["db", "upgrade", "--database-url", f"sqlite:///{link}"])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[1:] == [f"created directory {tmp_path / 'real'} (mode 0700)",
                                         f"created {target} (mode 0600)"]
    assert target.stat().st_mode & 0o777 == 0o600 and link.is_symlink()


def test_upgrade_refuses_another_applications_database(engine):
    """`malleable db upgrade` wrote malleable's tables beside another application's, and
    failed with a traceback on a `jobs` table of another shape (a new-user tester)."""
    from malleable.db.engine import describe_url
    from malleable.db.errors import NotMalleableDatabase

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE jobs (x TEXT)"))
        conn.execute(text("CREATE TABLE customers (id INTEGER)"))
        conn.execute(text("INSERT INTO jobs (x) VALUES ('theirs')"))
    for run in (schema.upgrade, schema.prepare_schema):
        with pytest.raises(NotMalleableDatabase) as info:
            run(engine)
        assert str(info.value) == (
            f"{describe_url(engine.url)}: not a malleable database: it holds tables "
            f"(customers, jobs) but no malleable schema version (alembic_version); malleable "
            f"writes its tables only into an empty database or its own: give a new file or "
            f"an empty database")
    assert _tables(engine) == {"jobs", "customers"}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT x FROM jobs")).all() == [("theirs",)]
        conn.rollback()
