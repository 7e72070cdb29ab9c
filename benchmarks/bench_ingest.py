#!/usr/bin/env python3
"""Benchmark of progress ingestion: line parsing and whole ingest cycles.

Measures (1) `malleable.progress.lines.parse_line` alone on reporter-written
lines, (2) one `ingest_progress` cycle over J jobs that each appended L new
lines since the last cycle (files written by the real `Reporter`), (3) a cycle
in which nothing changed (the steady state between progress lines: one open
and fstat per job), all into a fresh SQLite state store. Prints sizes, times
and rates.

Usage:
    python benchmarks/bench_ingest.py [--jobs 2000] [--lines 50] [--parse 200000]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.progress.ingest import Cursors, IngestJob, ingest_progress
from malleable.progress.lines import parse_line
from malleable.progress.reporter import Reporter
from malleable.progress.spool import SpoolDir, ensure_spool_dir
from malleable.slurm.records import JobState, SlurmJob

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def write_lines(spool: str, job_ids: list[str], lines: int, start_step: int) -> int:
    clock = NOW.timestamp() - 60
    total = 0
    for jid in job_ids:
        rep = Reporter(jid, spool, gpus=4, nodes=1, batch_size=256, install_handler=False,
                       clock=lambda: clock)
        for i in range(lines):
            step = start_step + i + 1
            rep.log(step, step * 256, metric=1.0 / step, grad_sqr=0.5, grad_var=2.0)
        total += os.path.getsize(rep.path)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--lines", type=int, default=50, help="new lines per job per cycle")
    p.add_argument("--parse", type=int, default=200_000, help="lines for the parse-only run")
    args = p.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {platform.system()} "
          f"{platform.release()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; a VM shared with other test runs: times vary "
          f"by up to 2x between runs")

    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        spool = Path(tmp) / "spool"
        ensure_spool_dir(spool)
        write_lines(str(spool), ["1"], 1, 0)
        line = (spool / "1.jsonl").read_bytes().rstrip(b"\n")
        t0 = time.perf_counter()
        for _ in range(args.parse):
            parse_line(line, now=NOW.timestamp(), job_id="1")
        dt = time.perf_counter() - t0
        print(f"parse_line: {args.parse:,} lines of {len(line)} bytes in {dt:.2f} s "
              f"({args.parse / dt:,.0f} lines/s)")

        engine = make_engine(f"sqlite:///{tmp}/state.db")
        schema.upgrade(engine)
        Session = session_factory(engine)
        ids = [str(1000 + i) for i in range(args.jobs)]
        uid = os.geteuid()
        with Session() as s, s.begin():
            res = store.upsert_jobs(s, [SlurmJob(job_id=i, job_id_num=int(i), uid=uid,
                                                 state=JobState.RUNNING) for i in ids], NOW)
        jobs = [IngestJob(res.ids[i], i, uid) for i in ids]
        cursors = Cursors()
        src = SpoolDir(spool)
        for cycle in (1, 2):
            nbytes = write_lines(str(spool), ids, args.lines, (cycle - 1) * args.lines)
            t0 = time.perf_counter()
            with Session() as s, s.begin():
                rep = ingest_progress(s, jobs, src, now=NOW, cursors=cursors)
            dt = time.perf_counter() - t0
            n = args.jobs * args.lines
            assert rep.samples == n and not rep.rejected, (rep.samples, rep.rejected)
            print(f"cycle {cycle} ({'first read, cursors from the db' if cycle == 1 else 'cursors in memory'}): "
                  f"{args.jobs:,} jobs x {args.lines} new lines = {n:,} lines, "
                  f"{rep.bytes_read / 2**20:.1f} MiB, in {dt:.2f} s ({n / dt:,.0f} lines/s, "
                  f"{dt / args.jobs * 1e3:.2f} ms/job); files now {nbytes / 2**20:.1f} MiB")
        t0 = time.perf_counter()
        with Session() as s, s.begin():
            rep = ingest_progress(s, jobs, src, now=NOW, cursors=cursors)
        dt = time.perf_counter() - t0
        print(f"idle cycle (nothing new): {args.jobs:,} jobs in {dt:.2f} s "
              f"({dt / args.jobs * 1e3:.3f} ms/job), {rep.jobs_read} files read")
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
