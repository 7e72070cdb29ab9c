"""Concurrency on a real SQLite file: one writer, four admin-like readers, 30 seconds.

The writer process (the daemon's role) commits progress samples and actions
continuously. Four reader processes act as admin commands would: each
iteration opens a fresh engine, reads the latest samples, the unfinished
actions and the sample count in a read-only session, and every fifth
iteration writes a setting (as `malleable pause` would). No error of any kind
may reach a caller (in particular no "database is locked"), and at the end
every row the writer and the readers reported committed is in the database.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, ProgressSample
from malleable.slurm.records import JobState, SlurmJob

DURATION_S = 30.0
READERS = 4
JOBS = 20
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _writer(url: str, job_ids: list[int], deadline: float, out: Path) -> None:
    result = {"samples": 0, "actions": 0, "finished": 0, "commits": 0, "errors": []}
    try:
        engine = make_engine(url)
        Session = session_factory(engine)
        rng = random.Random(1)
        step = 0
        open_actions: list[int] = []
        while time.monotonic() < deadline:
            try:
                with Session() as s, s.begin():
                    jid = rng.choice(job_ids)
                    batch = [store.SampleIn(jid, T0 + timedelta(seconds=step + k), step + k,
                                            (step + k) * 32, 4, 32, 1, 0.5, 1.0, 2.0)
                             for k in range(10)]
                    store.add_progress_samples(s, batch)
                    a = store.create_action(s, job_id=jid, kind="requeue", state="signal",
                                            to_gpus=8, now=T0)
                    new_action = a.id
                    finish = open_actions.pop(0) if len(open_actions) > 5 else None
                    if finish is not None:
                        store.update_action(s, finish, now=T0, state="done", finished=True)
                # counted only after the commit returned
                step += 10
                result["samples"] += 10
                result["actions"] += 1
                result["finished"] += finish is not None
                result["commits"] += 1
                open_actions.append(new_action)
            except Exception as exc:  # noqa: BLE001 - every error is a test failure, recorded
                result["errors"].append(f"{type(exc).__name__}: {exc}")
                if len(result["errors"]) > 20:
                    break
        engine.dispose()
    except Exception:  # noqa: BLE001
        result["errors"].append(traceback.format_exc())
    out.write_text(json.dumps(result))


def _reader(url: str, idx: int, job_ids: list[int], deadline: float, out: Path) -> None:
    result = {"reads": 0, "writes": 0, "errors": [], "decreased": 0}
    last_count = 0
    while time.monotonic() < deadline:
        try:
            engine = make_engine(url, create=False)   # a fresh process would do this
            with session_factory(engine, readonly=True)() as s:
                latest = store.latest_samples(s, job_ids, 50)
                assert all(len(v) <= 50 for v in latest.values())
                store.unfinished_actions(s)
                count = store.count_samples(s)
                if count < last_count:
                    result["decreased"] += 1
                last_count = count
            result["reads"] += 1
            if result["reads"] % 5 == 0:
                with session_factory(engine)() as s, s.begin():
                    store.set_setting(s, f"reader.{idx}", result["writes"] + 1)
                result["writes"] += 1
            engine.dispose()
        except Exception as exc:  # noqa: BLE001 - every error is a test failure, recorded
            result["errors"].append(f"{type(exc).__name__}: {exc}")
            if len(result["errors"]) > 20:
                break
    out.write_text(json.dumps(result))


@pytest.mark.slow
def test_one_writer_four_readers_30s(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    engine = make_engine(url)
    schema.upgrade(engine)
    with session_factory(engine)() as s, s.begin():
        ids = list(store.upsert_jobs(s, [SlurmJob(job_id=str(i), job_id_num=i,
                                                  state=JobState.RUNNING)
                                         for i in range(1, JOBS + 1)], T0).ids.values())
    engine.dispose()

    ctx = multiprocessing.get_context("fork")
    deadline = time.monotonic() + DURATION_S
    outs = [tmp_path / "writer.json"] + [tmp_path / f"reader{i}.json" for i in range(READERS)]
    procs = [ctx.Process(target=_writer, args=(url, ids, deadline, outs[0]))]
    procs += [ctx.Process(target=_reader, args=(url, i, ids, deadline, outs[i + 1]))
              for i in range(READERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(DURATION_S + 60)
        assert p.exitcode == 0
    w = json.loads(outs[0].read_text())
    readers = [json.loads(o.read_text()) for o in outs[1:]]

    assert w["errors"] == []
    for i, r in enumerate(readers):
        assert r["errors"] == [], f"reader {i}"
        assert r["decreased"] == 0 and r["reads"] > 10
    assert w["commits"] > 100

    engine = make_engine(url, create=False)
    with session_factory(engine, readonly=True)() as s:
        assert s.scalar(select(func.count()).select_from(ProgressSample)) == w["samples"]
        assert s.scalar(select(func.count()).select_from(Action)) == w["actions"]
        assert s.scalar(select(func.count()).select_from(Action)
                        .where(Action.finished_at.is_not(None))) == w["finished"]
        for i, r in enumerate(readers):
            assert store.get_setting(s, f"reader.{i}", 0) == r["writes"]
        assert s.connection().exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    engine.dispose()
    print(f"writer: {w['commits']} commits, {w['samples']} samples, {w['actions']} actions; "
          f"readers: {[r['reads'] for r in readers]} reads, {[r['writes'] for r in readers]} "
          "writes")
