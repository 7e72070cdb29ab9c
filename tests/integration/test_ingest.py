"""Progress ingestion into a real SQLite state store, including hostile files.

Security cases from the issue: a symlink to another file, a file owned by another
user, a 1 GB (sparse) file, 10,000 malformed lines, lines with NaN. In every case
nothing crashes, nothing outside the spool is read, each rejection is counted
with its reason, and good lines in the same file still land.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import JobEvent, ProgressSample
from malleable.progress.ingest import Cursors, IngestJob, ingest_progress
from malleable.progress.reporter import Reporter
from malleable.progress.spool import SpoolDir, ensure_spool_dir
from malleable.slurm.records import JobState, SlurmJob

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T = NOW.timestamp()
UID = os.geteuid()
OTHER_UID = 4242


@pytest.fixture
def Session(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/state.db")
    schema.upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def spool(tmp_path) -> SpoolDir:
    path = tmp_path / "spool"
    assert ensure_spool_dir(path) == []
    return SpoolDir(path)


def add_jobs(Session, *ids: str, uid: int = UID) -> dict[str, IngestJob]:
    with Session() as s, s.begin():
        res = store.upsert_jobs(s, [SlurmJob(job_id=i, job_id_num=int(i.split("_")[0]),
                                             state=JobState.RUNNING, uid=uid, user="u")
                                    for i in ids], NOW)
        return {i: IngestJob(res.ids[i], i, uid) for i in ids}


def line(job: str, step: int, event: str = "progress", **kw) -> bytes:
    doc = {"v": 1, "t": T - 100 + step / 1000, "job": job, "event": event, "step": step,
           "samples": step * 32, "gpus": 2, "nodes": 1, "batch": 32, "restart": 0, **kw}
    return json.dumps(doc).encode() + b"\n"


def run(Session, jobs, spool, cursors=None, **kw):
    with Session() as s, s.begin():
        return ingest_progress(s, list(jobs), spool, now=NOW, cursors=cursors, **kw)


def samples_of(Session, job: IngestJob) -> list[int]:
    with Session() as s:
        return [r.step for r in s.scalars(select(ProgressSample).where(
            ProgressSample.job_id == job.db_id).order_by(ProgressSample.id))]


def progress_file(Session, job: IngestJob):
    with Session() as s:
        pf = store.get_progress_file(s, job.db_id)
        s.expunge_all()
        return pf


def test_reporter_lines_become_samples_events_and_an_offset(Session, spool):
    jobs = add_jobs(Session, "10", "11_2")
    clock = iter(T - 50 + i for i in range(100))
    rep = Reporter("11_2", spool.path, gpus=4, nodes=1, batch_size=64, restart_count=0,
                   install_handler=False, clock=lambda: next(clock))
    rep.started()
    for i in range(1, 6):
        rep.log(i * 10, i * 640, metric=1.0 / i, grad_sqr=0.5, grad_var=2.0)
    rep.checkpointed("/ck/11_2.pt")
    report = run(Session, jobs.values(), spool)
    assert (report.jobs_read, report.samples, report.events) == (1, 5, 2)
    assert not report.rejected
    job = jobs["11_2"]
    assert samples_of(Session, job) == [10, 20, 30, 40, 50]
    with Session() as s:
        row = s.scalars(select(ProgressSample).where(ProgressSample.job_id == job.db_id)).first()
        assert (row.gpus, row.nodes, row.batch_size, row.metric, row.grad_sqr, row.grad_var) \
            == (4, 1, 64, 1.0, 0.5, 2.0)
        assert row.time.replace(tzinfo=UTC) == datetime.fromtimestamp(T - 49, UTC)
        evs = s.scalars(select(JobEvent).where(JobEvent.job_id == job.db_id,
                                               JobEvent.kind.in_(["started", "checkpointed"]))
                        .order_by(JobEvent.id)).all()
        assert [e.kind for e in evs] == ["started", "checkpointed"]
        assert json.loads(evs[1].detail) == {"step": 50, "samples": 3200, "gpus": 4, "nodes": 1,
                                             "batch": 64, "restart": 0, "path": "/ck/11_2.pt"}
    pf = progress_file(Session, job)
    assert pf.offset == os.path.getsize(rep.path) == pf.size
    assert pf.lines_accepted == 7 and pf.rejected == {}
    # Nothing new: nothing read, nothing written.
    assert run(Session, jobs.values(), spool).jobs_read == 0


def test_partial_last_line_truncation_and_replacement(Session, spool):
    job = add_jobs(Session, "20")["20"]
    path = spool.file_path("20")
    third = line("20", 3)
    with open(path, "wb") as fh:
        fh.write(line("20", 1) + line("20", 2) + third[:15])
    run(Session, [job], spool)
    assert samples_of(Session, job) == [1, 2]
    with open(path, "ab") as fh:
        fh.write(third[15:])
    run(Session, [job], spool)
    assert samples_of(Session, job) == [1, 2, 3]
    # Truncated and rewritten (smaller than the offset): read again from 0.
    with open(path, "wb") as fh:
        fh.write(line("20", 4))
    run(Session, [job], spool)
    assert samples_of(Session, job) == [1, 2, 3, 4]
    # Replaced by a new file (another inode), larger than the offset: from 0 again.
    tmp = spool.file_path("20") + ".new"
    with open(tmp, "wb") as fh:
        fh.write(line("20", 5) + line("20", 6) + line("20", 7))
    os.replace(tmp, path)
    run(Session, [job], spool)
    assert samples_of(Session, job) == [1, 2, 3, 4, 5, 6, 7]


def test_symlink_to_another_file_is_never_followed(Session, spool, tmp_path):
    jobs = add_jobs(Session, "30", "31")
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(line("30", 1) * 5)
    os.symlink(outside, spool.file_path("30"))
    with open(spool.file_path("31"), "wb") as fh:
        fh.write(line("31", 1))
    for _ in range(3):
        report = run(Session, jobs.values(), spool)
    assert samples_of(Session, jobs["30"]) == []
    assert samples_of(Session, jobs["31"]) == [1]            # the other job is unaffected
    assert "symbolic link" in report.problems["30"]
    assert progress_file(Session, jobs["30"]).rejected == {"file_symlink": 1}  # once, not per cycle


def test_file_owned_by_another_user_is_refused(Session, spool):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    mine = add_jobs(Session, "40")["40"]
    theirs = add_jobs(Session, "41", uid=OTHER_UID)["41"]
    for job in ("40", "41"):
        with open(spool.file_path(job), "wb") as fh:
            fh.write(line(job, 1) + line(job, 2))
    os.chown(spool.file_path("40"), OTHER_UID, OTHER_UID)   # planted under my job's name
    os.chown(spool.file_path("41"), OTHER_UID, OTHER_UID)   # their own file: fine
    run(Session, [mine, theirs], spool)
    run(Session, [mine, theirs], spool)
    assert samples_of(Session, mine) == []
    assert progress_file(Session, mine).rejected == {"file_wrong_owner": 1}
    assert samples_of(Session, theirs) == [1, 2]


def test_one_gigabyte_sparse_file_is_read_in_capped_slices(Session, spool):
    job = add_jobs(Session, "50")["50"]
    path = spool.file_path("50")
    with open(path, "wb") as fh:
        fh.write(line("50", 1) + line("50", 2))
        fh.truncate(1 << 30)                      # a 1 GiB hole of zero bytes
    with open(path, "ab") as fh:
        fh.write(b"\n" + line("50", 3))
    cap = 64 << 20
    reads = []
    for _ in range(40):
        report = run(Session, [job], spool, max_bytes_per_job=cap)
        reads.append(report.bytes_read)
        if samples_of(Session, job) == [1, 2, 3]:
            break
    assert max(reads) <= cap
    assert samples_of(Session, job) == [1, 2, 3]         # the good line after the hole lands
    pf = progress_file(Session, job)
    assert pf.rejected == {"too_long": 1}                 # the hole is one over-long "line"
    assert pf.offset == os.path.getsize(path)


def test_ten_thousand_malformed_lines_and_nan(Session, spool):
    job = add_jobs(Session, "60")["60"]
    bad = [b"{not json", b"[]", json.dumps({"v": 9}).encode(), b"\xff\xfe",
           line("60", 5, metric=float("nan")).rstrip(), line("60", 5, gpus="two").rstrip(),
           line("60", -1).rstrip(), line("60", 5, t=T + 10_000).rstrip(),
           line("61", 5).rstrip(), b"x" * 5000]
    reasons = ["not_json", "not_object", "unknown_schema", "not_json", "nan_or_inf",
               "bad_type", "negative_step", "future_time", "wrong_job", "too_long"]
    with open(spool.file_path("60"), "wb") as fh:
        for i in range(10_000):
            fh.write(bad[i % len(bad)] + b"\n")
            if i % 1000 == 999:
                fh.write(line("60", i + 1))
        fh.write(line("60", 1, metric=float("inf")))
    total = {}
    for _ in range(20):
        report = run(Session, [job], spool)
        for k, n in report.rejected.items():
            total[k] = total.get(k, 0) + n
        if progress_file(Session, job).offset == os.path.getsize(spool.file_path("60")):
            break
    expected = {}
    for r in reasons:
        expected[r] = expected.get(r, 0) + 1000
    expected["nan_or_inf"] += 1
    assert total == expected
    assert progress_file(Session, job).rejected == expected
    assert samples_of(Session, job) == list(range(1000, 10_001, 1000))


def test_ordering_survives_a_daemon_restart(Session, spool):
    job = add_jobs(Session, "70")["70"]
    path = spool.file_path("70")
    with open(path, "wb") as fh:
        fh.write(line("70", 1) + line("70", 50, "started", restart=1) + line("70", 60, restart=1))
    run(Session, [job], spool, cursors=Cursors())
    with open(path, "ab") as fh:   # a stale line of the first run, then a good one
        fh.write(line("70", 70, restart=0) + line("70", 55, restart=1) + line("70", 61, restart=1))
    report = run(Session, [job], spool, cursors=Cursors())   # fresh cursors: a new daemon
    assert dict(report.rejected) == {"stale_restart": 1, "decreasing_step": 1}
    assert samples_of(Session, job) == [1, 60, 61]


def test_a_line_with_a_restart_count_above_slurms_does_not_freeze_the_job(Session, spool):
    """Slurm's restart count bounds a line's ``restart`` (plus one, `RESTART_SLACK`): a
    bogus 999 is counted as future_restart and the job's real lines still land, also
    after a daemon restart (fresh cursors)."""
    add_jobs(Session, "95")
    path = spool.file_path("95")
    with open(path, "wb") as fh:
        fh.write(line("95", 1) + line("95", 2, restart=999) + line("95", 3)
                 + line("95", 4, "started", restart=1) + line("95", 5, restart=1))
    with Session() as s, s.begin():
        (job,) = [IngestJob.of(j) for j in store.active_jobs(s)]
    assert job.max_restart == 1   # Slurm's count 0, plus one
    report = run(Session, [job], spool)
    assert dict(report.rejected) == {"future_restart": 1}
    assert samples_of(Session, job) == [1, 3, 5]
    with open(path, "ab") as fh:
        fh.write(line("95", 6, restart=2) + line("95", 7, restart=1))
    report = run(Session, [job], spool, cursors=Cursors())
    assert dict(report.rejected) == {"future_restart": 1}
    assert samples_of(Session, job) == [1, 3, 5, 7]
    unbounded = IngestJob(job.db_id, "95", UID)   # no bound: the old behaviour
    with open(path, "ab") as fh:
        fh.write(line("95", 8, restart=5) + line("95", 9, restart=1))
    report = run(Session, [unbounded], spool)
    assert dict(report.rejected) == {"stale_restart": 1}
    # The bogus restart=5 is now stored, as a malleable without the bound stored such
    # lines: a new daemon's cursor comes back at 5, and the real run is not held to it.
    with open(path, "ab") as fh:
        fh.write(line("95", 10, restart=1) + line("95", 11, restart=1))
    report = run(Session, [job], spool, cursors=Cursors())
    assert not report.rejected
    assert samples_of(Session, job) == [1, 3, 5, 7, 8, 10, 11]


def test_jobs_straight_from_the_store(Session, spool):
    add_jobs(Session, "90")
    with open(spool.file_path("90"), "wb") as fh:
        fh.write(line("90", 4))
    with Session() as s, s.begin():
        jobs = [IngestJob.of(j) for j in store.active_jobs(s)]
        assert ingest_progress(s, jobs, spool, now=NOW).samples == 1


def test_the_simulator_uses_the_same_function_on_its_own_spool(Session, tmp_path):
    sim_spool = SpoolDir(tmp_path / "sim-spool")
    os.makedirs(sim_spool.path)
    job = add_jobs(Session, "80")["80"]
    rep = Reporter("80", sim_spool.path, gpus=1, batch_size=8, install_handler=False,
                   clock=lambda: T - 1)
    rep.log(3, 24)
    assert run(Session, [job], sim_spool).samples == 1
    assert samples_of(Session, job) == [3]
