"""`store.upsert_jobs` with the caller's kept rows (`store.JobRows`) writes what it writes
without them.

Two real SQLite stores get the same random sequence of polls, as the daemon makes
them (the unfinished jobs it does not see are then marked finished, as
`Daemon._mark_vanished` does; some polls skip records, as one with parse errors
does): one store is upserted with a `JobRows`, the other reads every job each time.
After every poll the results, the ``jobs`` rows and the job events must be equal.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from malleable.daemon.cycle import Daemon, spec_as_dict
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job, JobEvent
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ACTIVE = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
STATES = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING,
          JobState.CONFIGURING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED,
          JobState.REQUEUED, JobState.STOPPED)
COMMENTS = ("", "malleable:gpus=1-4", "malleable:gpus=banana")

job = st.builds(
    lambda i, state, gpus, nodes, held, restarts, comment, sub, reason: SlurmJob(
        job_id=str(i), job_id_num=i, state=state, gpus=gpus, node_count=nodes,
        gpus_per_node=gpus // nodes, held=held, restart_count=restarts, comment=comment,
        submit_time=T0 + timedelta(minutes=sub), user="alice", uid=1000, partition="gpu",
        name=f"job{i}", reason=reason),
    st.integers(1, 6), st.sampled_from(STATES), st.sampled_from((0, 2, 4)),
    st.sampled_from((1, 2)), st.booleans(), st.integers(0, 2), st.sampled_from(COMMENTS),
    st.integers(0, 3), st.sampled_from(("", "Priority", "JobHeldUser")))
# A poll: the jobs Slurm lists (one record per id), whether it skipped some records, and
# whether a job the previous poll listed comes as that poll's very record object (as the
# simulator's client returns an unchanged job: `upsert_jobs` then compares nothing).
poll = st.tuples(st.lists(job, max_size=6, unique_by=lambda j: j.job_id), st.booleans(),
                 st.booleans())


def _store():
    eng = make_engine("sqlite://")
    schema.prepare_schema(eng)
    return eng, session_factory(eng)


def _poll(sessions, jobs, now, skipped, known):
    with sessions() as s, s.begin():
        r = store.upsert_jobs(s, jobs, now, parse_spec=spec_as_dict,
                              unlisted_in=() if skipped else ACTIVE, known=known)
        if not skipped:
            Daemon._mark_vanished(s, list(r.unlisted.values()), now)
    return r


def _rows(sessions):
    with sessions() as s:
        jobs = [{c.name: getattr(j, c.key) for c in Job.__table__.columns}
                for j in s.scalars(select(Job).order_by(Job.id))]
        events = [(e.job_id, e.time, e.kind, e.old_state, e.new_state, e.old_gpus,
                   e.new_gpus, e.old_nodes, e.new_nodes, e.detail)
                  for e in s.scalars(select(JobEvent).order_by(JobEvent.id))]
    return jobs, events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(poll, min_size=1, max_size=12))
def test_kept_rows_give_the_rows_events_and_results_of_reading_them(polls):
    (e1, plain), (e2, kept) = _store(), _store()
    known = store.JobRows()
    before: dict[str, SlurmJob] = {}
    try:
        for n, (jobs, skipped, same_objects) in enumerate(polls):
            now = T0 + timedelta(seconds=30 * (n + 1))
            if same_objects:
                jobs = [before.get(j.job_id, j) for j in jobs]
            before = {j.job_id: j for j in jobs}
            a = _poll(plain, jobs, now, skipped, None)
            b = _poll(kept, jobs, now, skipped, known)
            assert a == b
            assert _rows(plain) == _rows(kept)
            # Kept: exactly the unfinished jobs, as stored (after a poll that read all),
            # every kept column as the database has it (what the policy inputs read).
            if known.complete:
                stored = {r["slurm_job_id"]: r for r in _rows(kept)[0] if r["state"] in ACTIVE}
                assert set(known.rows) == set(stored)
                rows = known.in_states(("PENDING", "RUNNING"))
                assert sorted(r.slurm_job_id for r in rows) == sorted(
                    sid for sid, r in stored.items() if r["state"] in ("PENDING", "RUNNING"))
                for row in known.rows.values():
                    columns = [k for k in row if k not in ("_sig", "_src")]
                    assert {k: row[k] for k in columns} == {
                        k: stored[row.slurm_job_id][k] for k in columns}
                    # (the poll's time, kept once for all: every kept job was in it)
                    assert "last_seen" not in row
                    assert stored[row.slurm_job_id]["last_seen"] == known.seen_at == now
            else:
                assert known.in_states(("PENDING",)) is None
    finally:
        e1.dispose()
        e2.dispose()


def test_a_job_unchanged_in_slurm_is_read_once_and_then_only_touched():
    eng, sessions = _store()
    known = store.JobRows()
    running = SlurmJob(job_id="1", job_id_num=1, state=JobState.RUNNING, gpus=4, node_count=1,
                       gpus_per_node=4, uid=1000, user="alice", partition="gpu")
    statements: list[str] = []

    from sqlalchemy import event

    @event.listens_for(eng, "before_cursor_execute")
    def count(conn, cursor, statement, *_):
        statements.append(statement.split()[0])

    try:
        for n in range(3):
            statements.clear()
            r = _poll(sessions, [running], T0 + timedelta(seconds=30 * n), False, known)
            assert r.ids == {"1": 1}
        # The third poll: no SELECT of jobs, one UPDATE (last_seen and attained service).
        assert statements.count("SELECT") == 0 and statements.count("UPDATE") == 1
        with sessions() as s:
            assert s.get(Job, 1).attained_gpu_s == 4 * 60.0
    finally:
        eng.dispose()


def test_rows_kept_for_other_states_are_not_taken_as_complete():
    known = store.JobRows()
    eng, sessions = _store()
    try:
        _poll(sessions, [SlurmJob(job_id="1", job_id_num=1)], T0, False, known)
        assert known.complete and set(known.rows) == {"1"}
        assert [r.id for r in known.in_states(("PENDING",))] == [1]
        assert known.in_states(("PENDING", "COMPLETED")) is None   # (not kept)
        _poll(sessions, [SlurmJob(job_id="1", job_id_num=1)], T0, True, known)  # skipped
        assert not known.complete and known.in_states(("PENDING",)) is None
        known.clear()
        assert len(known) == 0 and not known.complete
    finally:
        eng.dispose()


def test_a_job_row_reads_its_columns_as_items_and_attributes_and_copies_whole():
    import copy
    import pickle

    row = store.JobRow({"id": 3, "state": "PENDING"}, spec={"min_gpus": 1})
    assert row.state == row["state"] == "PENDING" and row.spec == {"min_gpus": 1}
    assert getattr(row, "last_seen", None) is None
    for other in (copy.copy(row), copy.deepcopy(row), pickle.loads(pickle.dumps(row))):
        assert type(other) is store.JobRow and other == row and other.id == 3
        other["state"] = "RUNNING"
        assert other.state == "RUNNING" and row.state == "PENDING"


