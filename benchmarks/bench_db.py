#!/usr/bin/env python3
"""Benchmark of the state store: bulk progress inserts, latest-N reads, bytes per row.

Inserts 1,000,000 progress samples for 10,000 jobs (100 each, in
transactions of 10,000 rows), reads the latest 100 samples of each of the
10,000 jobs (`malleable.db.store.latest_samples`, and, for comparison, one
indexed ``ORDER BY time DESC LIMIT 100`` query per job), then measures the
bytes per row of each table that grows (file size after a WAL checkpoint,
divided by the rows added), which docs/state-store.md uses for its size
bound. Prints times, rates and sizes.

Usage:
    python benchmarks/bench_db.py [--jobs 10000] [--per-job 100] [--latest 100]
                                  [--url sqlite:////tmp/x.db]   (default: a temporary file)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from malleable.config import RetentionConfig
from malleable.db import retention, schema, store
from malleable.db.engine import make_engine, session_factory, sqlite_path
from malleable.db.models import ProgressSample
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def file_size(engine) -> int | None:
    """Bytes of the SQLite file after moving the WAL into it (None for other backends)."""
    path = sqlite_path(engine.url)
    if path is None:
        return None
    raw = engine.raw_connection()   # outside a transaction: a checkpoint cannot run inside one
    try:
        raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        raw.close()
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def used_bytes(engine) -> int:
    """Bytes in use inside the SQLite file: (pages - free pages) x page size."""
    file_size(engine)
    raw = engine.raw_connection()
    try:
        c = raw.driver_connection
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        free = c.execute("PRAGMA freelist_count").fetchone()[0]
        page = c.execute("PRAGMA page_size").fetchone()[0]
    finally:
        raw.close()
    return (pages - free) * page


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    return str(n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--per-job", type=int, default=100)
    ap.add_argument("--latest", type=int, default=100)
    ap.add_argument("--url", default="")
    args = ap.parse_args()

    tmp = None
    if not args.url:
        tmp = tempfile.TemporaryDirectory(prefix="bench-db-")
        args.url = f"sqlite:///{tmp.name}/bench.db"
    engine = make_engine(args.url)
    schema.upgrade(engine)
    Session = session_factory(engine)
    print(f"database: {args.url} (SQLAlchemy {__import__('sqlalchemy').__version__}, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    size0 = used_bytes(engine) if sqlite_path(engine.url) else None

    # ---- jobs
    jobs = [SlurmJob(job_id=str(i), job_id_num=i, state=JobState.RUNNING, gpus=4, node_count=1,
                     gpus_per_node=4, user="user", uid=1000, partition="gpu",
                     comment='{"gpus": "1-8", "checkpoint": "USR1@120"}',
                     submit_time=T0, start_time=T0) for i in range(1, args.jobs + 1)]
    t = time.perf_counter()
    with Session() as s, s.begin():
        ids = list(store.upsert_jobs(s, jobs, T0, parse_spec=lambda c: {"gpus": [1, 8]}).ids
                   .values())
    dt = time.perf_counter() - t
    size_jobs = used_bytes(engine) if size0 is not None else None
    print(f"upsert {args.jobs:,} new jobs (+1 event each): {dt:.2f} s "
          f"({args.jobs / dt:,.0f} jobs/s)")
    t = time.perf_counter()
    with Session() as s, s.begin():
        r = store.upsert_jobs(s, jobs, T0 + timedelta(seconds=30))
    dt = time.perf_counter() - t
    print(f"upsert {args.jobs:,} unchanged jobs (one poll): {dt:.2f} s, {r.events} events")

    # ---- progress samples
    total = args.jobs * args.per_job
    jobs_per_tx = max(1, 10_000 // args.per_job)
    t = time.perf_counter()
    commits = 0
    for i in range(0, len(ids), jobs_per_tx):
        rows = [store.SampleIn(jid, T0 + timedelta(seconds=10 * k), k, k * 256, 4, 256, 1,
                               2.5 - k * 1e-3, 0.01 * k, 1.5)
                for jid in ids[i:i + jobs_per_tx] for k in range(args.per_job)]
        with Session() as s, s.begin():
            store.add_progress_samples(s, rows)
        commits += 1
    dt_ins = time.perf_counter() - t
    size_samples = used_bytes(engine) if size0 is not None else None
    print(f"insert {total:,} progress samples ({args.per_job} per job, {commits} "
          f"transactions): {dt_ins:.2f} s ({total / dt_ins:,.0f} samples/s)")

    # ---- latest N for every job
    t = time.perf_counter()
    with session_factory(engine, readonly=True)() as s:
        got = store.latest_samples(s, ids, args.latest)
    dt = time.perf_counter() - t
    n_rows = sum(len(v) for v in got.values())
    print(f"latest {args.latest} samples of each of {len(ids):,} jobs "
          f"(store.latest_samples, window function, chunks of 500 jobs): {dt:.2f} s, "
          f"{n_rows:,} rows ({n_rows / dt:,.0f} rows/s)")
    cols = [getattr(ProgressSample, c) for c in store.SAMPLE_COLUMNS]
    t = time.perf_counter()
    with session_factory(engine, readonly=True)() as s:
        n2 = 0
        for jid in ids:
            n2 += len(s.execute(select(*cols).where(ProgressSample.job_id == jid)
                                .order_by(ProgressSample.time.desc()).limit(args.latest)).all())
    dt = time.perf_counter() - t
    print(f"same, one indexed LIMIT query per job: {dt:.2f} s, {n2:,} rows")
    t = time.perf_counter()
    with session_factory(engine, readonly=True)() as s:
        one = store.latest_samples(s, [ids[len(ids) // 2]], args.latest)
    print(f"latest {args.latest} samples of one job: {(time.perf_counter() - t) * 1e3:.1f} ms "
          f"({len(next(iter(one.values())))} rows)")

    # ---- bytes per row of the other growing tables
    per_row: dict[str, float] = {}
    if size0 is not None:
        per_row["job (row + 'new' event + index entries)"] = (size_jobs - size0) / args.jobs
        per_row["progress sample (row + index)"] = (size_samples - size_jobs) / total
        n = 5_000
        before = used_bytes(engine)
        with Session() as s, s.begin():
            for k in range(n):
                store.record_estimate(s, job_id=ids[k % len(ids)], time=T0 + timedelta(seconds=k),
                                      model="pollux", params={"alpha_c": 0.012, "beta_c": 0.0031,
                                                              "alpha_n": 0.05, "beta_n": 0.001,
                                                              "gamma": 1.4, "phi": 512.0},
                                      remaining_work=1.2e7, remaining_work_sd=3.4e5,
                                      flags={"extrapolated": False})
        after = used_bytes(engine)
        per_row["estimate (6 fitted parameters as JSON)"] = (after - before) / n
        before = after
        n_dec, targets_per = 200, 50
        with Session() as s, s.begin():
            for k in range(n_dec):
                store.record_decision(
                    s, time=T0 + timedelta(minutes=k), policy="pollux",
                    params={"p": 0.7, "interval_s": 60}, inputs_digest="ab" * 32,
                    objective=1234.5, duration_s=0.05, dry_run=False,
                    targets=[store.TargetIn(ids[(k + j) % len(ids)], 4, 256, "goodput")
                             for j in range(targets_per)])
        after = used_bytes(engine)
        with_targets = (after - before) / n_dec
        before = after
        with Session() as s, s.begin():
            for k in range(n_dec * 5):
                store.record_decision(
                    s, time=T0 + timedelta(minutes=k), policy="pollux",
                    params={"p": 0.7, "interval_s": 60}, inputs_digest="ab" * 32,
                    objective=1234.5, duration_s=0.05, dry_run=False, targets=[])
        after = used_bytes(engine)
        per_row["decision without targets"] = (after - before) / (n_dec * 5)
        per_row[f"target (from decisions with {targets_per})"] = (
            (with_targets - per_row["decision without targets"]) / targets_per)
        before = after
        with Session() as s, s.begin():
            for k in range(n):
                a = store.create_action(s, job_id=ids[k % len(ids)], kind="requeue",
                                        state="signal", from_gpus=4, to_gpus=8, from_nodes=1,
                                        to_nodes=2, now=T0)
                if k % 2:
                    store.update_action(s, a.id, now=T0, state="done", finished=True,
                                        note="running on 8 GPUs")
        after = used_bytes(engine)
        per_row["action"] = (after - before) / n
        before = after
        with Session() as s, s.begin():
            for jid in ids[:n // 4]:
                for kind in ("state", "size", "restart", "checkpointed"):
                    store.add_job_event(s, jid, T0, kind, "x")
        after = used_bytes(engine)
        per_row["job event"] = (after - before) / (len(ids[:n // 4]) * 4)
        print("bytes per row (file growth / rows added):")
        for name, b in per_row.items():
            print(f"  {name:45s} {b:8.1f}")
        print(f"file size after all inserts: {fmt_bytes(file_size(engine))} "
              f"({file_size(engine):,} bytes)")

    # ---- retention on this database
    cfg = RetentionConfig(finished_job_days=30, progress_full_s=3600, progress_max_per_job=50)
    t = time.perf_counter()
    rep = retention.apply_retention(engine, cfg, T0 + timedelta(days=1))
    dt = time.perf_counter() - t
    with session_factory(engine, readonly=True)() as s:
        busy = len({a.job_id for a in store.unfinished_actions(s)})
    print(f"retention (thin {total:,} samples to 50 per job; the {busy:,} jobs with an "
          f"unfinished action are left alone): {dt:.2f} s, {rep.samples_deleted:,} samples and "
          f"{rep.estimates_deleted:,} estimates deleted")
    engine.dispose()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
