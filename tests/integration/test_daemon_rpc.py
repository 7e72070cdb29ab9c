"""Issue 8: every Slurm RPC is counted in the log; a cycle costs one squeue plus one per action.

200 jobs: 180 rigid one-GPU sleep jobs (the first 16 fill the 16 GPUs, 164 pend)
and 20 malleable ones that pend. With no GPU left for malleable jobs, `equi` admits
none, so the first decision holds all 20 (one ``scontrol hold`` each); after that the
plan is met and a cycle is one ``squeue``. On SIGTERM the daemon releases its 20
holds.

The count in the log is checked against an independent one: the daemon runs with
PATH starting at a directory of wrappers (squeue, sinfo, scontrol, scancel) that
append their arguments to a file and exec the real command. Every command the
daemon ran must be accounted for by its own log: the start-up line, the cycle
lines and the stop line. The node list is read once at start-up (and every
``nodes_refresh_s``, 300 s, after that), not in the cycles measured here.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import wait_until
from tests.integration.daemon_support import (
    JOBS,
    DaemonProcess,
    cycle_lines,
    environ_for,
    sbatch,
    squeue,
    write_config,
)

pytestmark = pytest.mark.slurm

RIGID, MALLEABLE = 180, 20
COMMANDS = ("squeue", "sinfo", "scontrol", "scancel")


def wrappers(tmp_path, record) -> str:
    """A directory of counting wrappers for the Slurm commands; returns it."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in COMMANDS:
        real = shutil.which(name)
        assert real, name
        w = d / name
        w.write_text(f'#!/bin/sh\necho "{name} $*" >> "{record}"\nexec {real} "$@"\n')
        w.chmod(0o755)
    return str(d)


def test_cycle_rpcs_with_200_jobs_are_one_squeue_plus_one_per_action(slurm, tmp_path):
    def submit(i: int) -> str:
        if i < RIGID:
            return sbatch(slurm, tmp_path, JOBS / "rigid.sbatch", nodes=1, gpus_per_node=1)
        return sbatch(slurm, tmp_path, JOBS / "rigid.sbatch", nodes=1, gpus_per_node=1,
                      comment="malleable:gpus=1-2,grace=20,batch=512,restart_cost=0")
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(submit, range(RIGID)))
        ids += list(pool.map(submit, range(RIGID, RIGID + MALLEABLE)))
    malleable = set(ids[RIGID:])
    wait_until(lambda: sum(j.state.value == "RUNNING" for j in squeue(slurm).values()) == 16,
               timeout=60, what="16 one-GPU jobs running")
    jobs = squeue(slurm)
    active = [j for j in jobs.values() if j.state.value in ("PENDING", "RUNNING")]
    assert len(active) == 200 and all(jobs[j].state.value == "PENDING" for j in malleable)
    # Jobs earlier tests cancelled stay listed for MinJobAge (300 s): squeue reports them too.
    listed = len(jobs)

    record = tmp_path / "commands.log"
    env = environ_for(slurm)
    env["PATH"] = f"{wrappers(tmp_path, record)}:{env['PATH']}"
    daemon = DaemonProcess(write_config(tmp_path, poll=2, decide=3), tmp_path / "daemon.log",
                           env)
    daemon.start()
    try:
        daemon.wait_log(r"actions 20 \[hold 20\]", timeout=60)
        mark = daemon.size()
        for _ in range(3):
            daemon.wait_log(r"decide cycle: ", since=daemon.size(), timeout=30)
        assert daemon.stop() == 0
    finally:
        daemon.kill()

    log = daemon.text()
    cycles = cycle_lines(log)
    assert cycles and all(c["jobs"] == listed for c in cycles), cycles
    for c in cycles:
        # The log's total is its parts; one squeue per cycle; no node list read.
        assert c["rpc"] == c["jobs_rpc"] + c["nodes_rpc"] + c["actions_rpc"] + c["other_rpc"]
        assert (c["jobs_rpc"], c["nodes_rpc"], c["other_rpc"]) == (1, 0, 0), c
        assert c["actions_rpc"] == sum(c["calls"].values())
    acting = [c for c in cycles if c["actions_rpc"]]
    assert len(acting) == 1 and acting[0]["kind"] == "decide"
    assert acting[0]["calls"] == {"hold": MALLEABLE} and acting[0]["rpc"] == 1 + MALLEABLE
    steady = cycle_lines(log[log.index("\n", mark - daemon.offset):])
    assert len([c for c in steady if c["kind"] == "decide"]) >= 3
    assert all(c["rpc"] == 1 for c in steady), steady

    # Independent count: every command the daemon ran is in its log.
    ran = record.read_text().splitlines()
    start_up = int(re.search(r"start-up: (\d+) Slurm RPCs", log).group(1))
    stop = re.search(r"released (\d+) job\(s\) the daemon held \((\d+) Slurm RPCs\)", log)
    assert int(stop.group(1)) == MALLEABLE and int(stop.group(2)) == MALLEABLE
    assert len(ran) == start_up + sum(c["rpc"] for c in cycles) + int(stop.group(2))
    assert sum(r.startswith("squeue --json") for r in ran) == len(cycles)
    assert sum(r.startswith("scontrol hold") for r in ran) == MALLEABLE
    assert sum(r.startswith("scontrol release") for r in ran) == MALLEABLE
    assert not any(j.held for j in squeue(slurm).values())
