"""Ingestion given the jobs' progress_files rows by its caller (the daemon's one joined
read) stores exactly what it stores when it reads them itself."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job, JobEvent, ProgressFile, ProgressSample
from malleable.progress.ingest import Cursors, IngestJob, ingest_progress
from malleable.progress.spool import SpoolDir
from malleable.slurm.records import JobState, SlurmJob

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
UID = os.geteuid()


def line(job: str, step: int, event: str = "progress", **kw) -> bytes:
    doc = {"v": 1, "t": NOW.timestamp() - 100 + step, "job": job, "event": event,
           "step": step, "samples": step * 32, "gpus": 2, "nodes": 1, "batch": 32,
           "restart": 0, **kw}
    return json.dumps(doc).encode() + b"\n"


def store_at(path) -> tuple:
    engine = make_engine(f"sqlite:///{path}")
    schema.upgrade(engine)
    Session = session_factory(engine)
    with Session() as s, s.begin():
        store.upsert_jobs(s, [SlurmJob(job_id=i, job_id_num=int(i), state=JobState.RUNNING,
                                       uid=UID, user="u") for i in ("1", "2", "3")], NOW)
    return engine, Session


def ingest(Session, spool, now, cursors, joined: bool):
    with Session() as s, s.begin():
        query = select(Job.id, Job.slurm_job_id, Job.uid).order_by(Job.id)
        if not joined:
            jobs = [IngestJob.of(r) for r in store.run_core(s, query)]
            return ingest_progress(s, jobs, spool, now=now, cursors=cursors)
        rows = store.run_core(s, store.with_progress_files(query)).all()
        return ingest_progress(s, [IngestJob.of(r) for r in rows], spool, now=now,
                               cursors=cursors, files=store.progress_files_of(rows))


def tables(Session) -> list:
    with Session() as s:
        return [[tuple(r) for r in s.execute(select(m.__table__).order_by(m.id))]
                for m in (ProgressFile, ProgressSample, JobEvent)]


def test_ingest_with_the_callers_rows_stores_the_same(tmp_path):
    spool = SpoolDir(tmp_path / "spool")
    os.mkdir(spool.path)
    runs = {joined: (store_at(tmp_path / f"{joined}.db"), Cursors()) for joined in (False, True)}
    steps = [
        {"1": line("1", 1, "started") + line("1", 2), "2": line("2", 1) + b"not json\n"},
        {"1": line("1", 3) + line("1", 4, "checkpointed", path="/ck"), "3": line("3", 5)},
        {},                                                   # nothing new
        {"2": "truncate", "3": line("3", 6) + b'{"v": 1, "t'},  # a partial last line
        {"1": "replace", "3": b'": 1}\n'},
    ]
    reports = {False: [], True: []}
    for i, writes in enumerate(steps):
        for job, data in writes.items():
            path = spool.file_path(job)
            if data == "truncate":
                open(path, "wb").close()
            elif data == "replace":
                os.replace(path, path + ".old")
                with open(path, "wb") as f:
                    f.write(line(job, 9))
            else:
                with open(path, "ab") as f:
                    f.write(data)
        for joined, ((_, Session), cursors) in runs.items():
            r = ingest(Session, spool, NOW + timedelta(seconds=30 * i), cursors, joined)
            reports[joined].append((r.jobs_read, r.samples, r.events, dict(r.rejected)))
    assert reports[True] == reports[False]
    assert reports[False][0] == (2, 2, 1, {"not_json": 1})
    assert tables(runs[True][0][1]) == tables(runs[False][0][1])
    for (engine, _), _ in runs.values():
        engine.dispose()


def test_a_restarted_daemon_still_refuses_a_line_stamped_before_the_runs_last(tmp_path):
    """The cursor a restarted daemon rebuilds from the store carries the newest accepted
    line's time: a line stamped 40 s before it was accepted after a restart (a helper
    on the harness), and rejected by a daemon that kept running."""
    engine, Session = store_at(tmp_path / "m.db")
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "1.jsonl"
    path.write_bytes(line("1", 10) + line("1", 20, event="checkpointed", path="/c"))
    ingest(Session, SpoolDir(spool), NOW, Cursors(), joined=False)
    # The daemon restarts (new cursors); the job writes a line stamped before step 20's.
    with open(path, "ab") as fh:
        fh.write(line("1", 30, t=NOW.timestamp() - 100 + 15))
        fh.write(line("1", 31, t=NOW.timestamp() - 100 + 20))   # as old as the last: in order
    report = ingest(Session, SpoolDir(spool), NOW, Cursors(), joined=False)
    assert report.rejected == {"decreasing_time": 1}
    with Session() as s:
        steps = [r.step for r in s.scalars(select(ProgressSample).order_by(ProgressSample.id))]
    assert steps == [10, 31]
