"""Crash safety on a real SQLite file: a writer killed with SIGKILL, 50 times.

Each round forks a writer process that commits batches as fast as it can:
20 progress samples and one action per transaction for job A, and every
fifth transaction a downsampling that thins job B's samples (job A's lie
after its cutoff), so kills also land in the middle of deletes. After each commit returns, the writer reports the batch number
on a pipe. The test kills it with SIGKILL at a random moment (sometimes
before its first commit, mostly during its work), then opens the database
and checks that it passes ``PRAGMA integrity_check``, that every reported
batch is there whole, and that no batch is there in part.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import select
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func
from sqlalchemy import select as sql_select

from malleable.db import retention, schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, ProgressSample
from malleable.slurm.records import JobState, SlurmJob

KILLS = 50
BATCH = 20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
THIN_AT = T0 + timedelta(days=1)     # downsampling runs "now" = THIN_AT with full_s = 0:
RECENT = T0 + timedelta(days=2)      # job A's samples lie after it and are never thinned


def _writer(url: str, round_no: int, job_a: int, job_b: int, wfd: int) -> None:
    engine = make_engine(url)
    Session = session_factory(engine)
    n = 0
    while True:
        batch_id = round_no * 1_000_000 + n
        with Session() as s, s.begin():
            store.add_progress_samples(s, [
                store.SampleIn(job_a, RECENT + timedelta(microseconds=batch_id * BATCH + k),
                               batch_id * BATCH + k, k, 4, 32) for k in range(BATCH)])
            store.add_progress_samples(s, [
                store.SampleIn(job_b, T0 + timedelta(microseconds=batch_id * 5 + k),
                               batch_id, k, 4, 32) for k in range(5)])
            store.create_action(s, job_id=job_a, kind="requeue", state="signal", to_gpus=4,
                                now=T0, note=str(batch_id))
        os.write(wfd, f"{batch_id}\n".encode())     # after the commit returned
        if n % 5 == 4:
            retention.downsample_progress(engine, THIN_AT, full_s=0,
                                          max_per_job=50)
        n += 1


def _read_all(rfd: int) -> bytes:
    data = b""
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            return data
        data += chunk


@pytest.mark.slow
def test_sigkill_at_random_points_loses_no_commit(tmp_path):
    url = f"sqlite:///{tmp_path}/crash.db"
    engine = make_engine(url)
    schema.upgrade(engine)
    with session_factory(engine)() as s, s.begin():
        ids = store.upsert_jobs(s, [SlurmJob(job_id="1", job_id_num=1, state=JobState.RUNNING),
                                    SlurmJob(job_id="2", job_id_num=2, state=JobState.RUNNING)],
                                T0).ids
    engine.dispose()
    job_a, job_b = ids["1"], ids["2"]
    rng = random.Random(20260101)
    ctx = multiprocessing.get_context("fork")
    committed: set[int] = set()
    killed_before_first_commit = 0
    for round_no in range(KILLS):
        rfd, wfd = os.pipe()
        proc = ctx.Process(target=_writer, args=(url, round_no, job_a, job_b, wfd))
        proc.start()
        os.close(wfd)
        if rng.random() < 0.1:
            time.sleep(rng.uniform(0.0, 0.05))     # during start-up / WAL recovery
        else:
            select.select([rfd], [], [], 10)        # first commit seen, then kill mid-work
            time.sleep(rng.uniform(0.0, 0.15))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        reported = {int(x) for x in _read_all(rfd).split()}
        os.close(rfd)
        killed_before_first_commit += not reported
        committed |= reported

        engine = make_engine(url, create=False)
        with session_factory(engine, readonly=True)() as s:
            conn = s.connection()
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
            per_batch = dict(s.execute(
                sql_select(ProgressSample.step // BATCH, func.count())
                .where(ProgressSample.job_id == job_a)
                .group_by(ProgressSample.step // BATCH)).all())
            notes = {int(x) for x in s.scalars(sql_select(Action.note))}
        engine.dispose()
        assert committed <= set(per_batch), f"round {round_no}: committed rows lost"
        assert committed <= notes, f"round {round_no}: committed actions lost"
        assert set(per_batch.values()) <= {BATCH}, f"round {round_no}: a partial batch"
        assert set(per_batch) == notes       # samples and action of a batch: all or nothing
    assert len(committed) > KILLS
    print(f"{KILLS} kills, {len(committed)} committed batches checked, "
          f"{killed_before_first_commit} kills before the round's first commit")
