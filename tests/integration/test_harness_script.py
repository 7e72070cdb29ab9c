"""scripts/slurm-harness itself: lifecycle, idempotence, and refusal of bad input.

These start their own small harnesses (separate directories and ports) beside
the session's cluster, which also shows that two harnesses coexist.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import HARNESS, free_port_block

pytestmark = pytest.mark.slow

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the harness runs as root only")


def harness(*args: str, user: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(HARNESS), *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def processes_under(directory: Path) -> list[str]:
    """Command lines of live processes that mention ``directory``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name == str(os.getpid()) or str(HARNESS) in argv:
            continue
        if str(directory) in argv:
            found.append(argv.strip())
    return found


@needs_root
def test_up_down_twice_leaves_nothing(tmp_path):
    d = tmp_path / "h"
    base = free_port_block(3)
    try:
        _up_down_twice(d, base)
    finally:  # a failed assertion must not leave daemons running
        harness("down", "--dir", str(d))


def _up_down_twice(d: Path, base: int) -> None:
    for _ in range(2):
        up = harness("up", "--dir", str(d), "--nodes", "2", "--gpus-per-node", "2",
                     "--ctld-port", str(base), "--node-port-base", str(base + 1))
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export SLURM_CONF={d}/slurm.conf"
        # Idempotent: a second `up` finds it running and only prints the line again.
        again = harness("up", "--dir", str(d), "--nodes", "2", "--gpus-per-node", "2",
                        "--ctld-port", str(base), "--node-port-base", str(base + 1))
        assert again.returncode == 0 and again.stdout == up.stdout
        assert harness("env", "--dir", str(d)).stdout == up.stdout
        status = harness("status", "--dir", str(d))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "node1" in status.stdout and "gpu:2" in status.stdout
        assert len(processes_under(d)) >= 4  # munged, slurmctld, 2 x slurmd
        run_dir = run_dir_of(d)
        assert (run_dir / "munge.socket").exists()
        down = harness("down", "--dir", str(d))
        assert down.returncode == 0, down.stderr
        assert processes_under(d) == []
        assert not d.exists() and not run_dir.exists()
        down = harness("down", "--dir", str(d))
        assert down.returncode == 0 and "stopped nothing" in down.stdout


def assert_refused(proc: subprocess.CompletedProcess, *words: str, d: Path) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert processes_under(d) == []
    assert not d.exists()


@needs_root
@pytest.mark.parametrize("args,words", [
    (["--nodes", "0"], ["--nodes", "0"]),
    (["--gpus-per-node", "-1"], ["--gpus-per-node", "-1"]),
    (["--nodes", "many"], ["--nodes", "many"]),
])
def test_bad_sizes_refused(tmp_path, args, words):
    d = tmp_path / "h"
    assert_refused(harness("up", "--dir", str(d), *args), *words, d=d)


@needs_root
def test_port_in_use_refused(tmp_path):
    d = tmp_path / "h"
    base = free_port_block(5)
    with socket.socket() as s:
        s.bind(("0.0.0.0", base + 2))
        s.listen()
        proc = harness("up", "--dir", str(d), "--ctld-port", str(base),
                       "--node-port-base", str(base + 1))
    assert_refused(proc, f"port {base + 2}", "in use", d=d)


@needs_root
def test_non_root_refused(tmp_path):
    d = tmp_path / "h"
    proc = harness("up", "--dir", str(d), user="nobody")
    assert_refused(proc, "root", d=d)


def run_dir_of(d: Path) -> Path:
    return Path(json.loads((d / "harness.json").read_text())["run_dir"])


@needs_root
@pytest.mark.parametrize("case", ["deep-dir", "stdin-closed"])
def test_jobs_launch_from_a_deep_dir_and_without_stdin(tmp_path, case):
    """Two ways the harness once started a cluster on which every job failed to launch
    ("launch failed requeued held"), which failed the short demo in CI:
    * deep-dir: slurmstepd's socket <spool>/<node>_<job>.<step> under a directory as
      deep as pytest's tmp_path exceeded Linux's 107-byte socket path limit;
    * stdin-closed: started with descriptor 0 closed (CI has no standard input),
      slurmctld held a socket on descriptor 0 and its job launches failed."""
    d = tmp_path / "h" if case == "stdin-closed" else tmp_path / ("deep" * 5) / "h"
    base = free_port_block(2)
    argv = [sys.executable, str(HARNESS), "up", "--dir", str(d), "--nodes", "1",
            "--gpus-per-node", "1", "--ctld-port", str(base), "--node-port-base", str(base + 1)]
    if case == "stdin-closed":
        argv = ["sh", "-c", 'exec 0<&-; exec "$@"', "sh", *argv]
    try:
        up = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stderr
        env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        mark = tmp_path / "ran"
        sub = subprocess.run(["sbatch", "--parsable", "-N1", "--gres=gpu:1", "-o", "/dev/null",
                              "--wrap", f"echo $SLURM_JOB_ID > {mark}"], env=env,
                             capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.strip()
        deadline = time.monotonic() + 30
        while not (mark.exists() and mark.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], env=env,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        assert mark.exists() and mark.read_text().strip() == job_id, f"job {job_id}: {state}"
        run_dir = run_dir_of(d)
    finally:
        harness("down", "--dir", str(d))
    assert processes_under(d) == [] and not d.exists()
    assert not run_dir.exists()


@needs_root
def test_up_on_a_harness_with_slurmctld_down_restarts_it_and_keeps_the_jobs(tmp_path):
    """`up` once tore down a half-running harness and started afresh (-i, a new cluster
    name): every job was lost, and a running job's processes went on outside Slurm."""
    d = tmp_path / "h"
    base = free_port_block(3)
    args = ["up", "--dir", str(d), "--nodes", "2", "--gpus-per-node", "2",
            "--ctld-port", str(base), "--node-port-base", str(base + 1)]
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}

    def squeue() -> str:
        return subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True,
                              text=True, timeout=30).stdout.strip()
    try:
        assert harness(*args).returncode == 0
        job = subprocess.run(["sbatch", "--parsable", "-N1", "--gres=gpu:1", "-o", "/dev/null",
                              "--wrap", "sleep 300"], env=env, capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout.strip()
        deadline = time.monotonic() + 30
        while squeue() != f"{job} RUNNING" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert squeue() == f"{job} RUNNING"
        ctld = int((d / "slurmctld.pid").read_text().split()[0])
        os.kill(ctld, signal.SIGTERM)
        while Path(f"/proc/{ctld}").exists() and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        again = harness(*args)
        assert again.returncode == 0, again.stderr
        assert "restarted slurmctld" in again.stderr
        assert squeue() == f"{job} RUNNING"          # the same job, still running
    finally:
        harness("down", "--dir", str(d))
    assert processes_under(d) == [] and not d.exists()
