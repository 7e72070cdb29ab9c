"""Shared fixtures: the real Slurm harness, brought up once per session.

Tests marked ``slurm`` get a running 4-node x 4-GPU cluster from
``scripts/slurm-harness`` (real munged, slurmctld and slurmd processes), with
``SLURM_CONF`` exported for the whole session. Ports and the state directory
are chosen per session, so two test runs (or a developer's own harness) can
coexist. Set ``MALLEABLE_TEST_SLURM_CONF`` to reuse an already running cluster
instead (it is then neither started nor stopped here).

Every job a ``slurm`` test leaves behind is cancelled after the test.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest_plugins = ["tests.postgres_fixture"]

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "scripts" / "slurm-harness"


def port_block_free(base: int, n: int) -> bool:
    for port in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def free_port_block(n: int, rng: random.Random | None = None) -> int:
    """A base port such that base .. base+n-1 are all free (best effort, no reservation)."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000 - n)
        if port_block_free(base, n):
            return base
    raise RuntimeError(f"no block of {n} free ports found")


@dataclass
class Harness:
    """A running harness cluster and helpers to run Slurm commands against it."""

    dir: Path
    conf: Path
    nodes: int
    gpus_per_node: int
    owned: bool = True
    env: dict = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm command (argv list, no shell) against this cluster."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def job_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def cancel_all(self, timeout: float = 30) -> None:
        ids = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
        if not ids:
            return
        self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.run("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%A",
                            check=False).stdout.split()
            if not left:
                return
            time.sleep(0.3)


def harness_up(directory: Path, nodes: int = 4, gpus_per_node: int = 4,
               ctld_port: int | None = None) -> Harness:
    """Start a harness in ``directory`` on free ports; raises with its stderr on failure."""
    base = ctld_port or free_port_block(nodes + 1)
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "up", "--dir", str(directory), "--nodes", str(nodes),
         "--gpus-per-node", str(gpus_per_node), "--ctld-port", str(base),
         "--node-port-base", str(base + 1)],
        capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"slurm-harness up failed ({proc.returncode}): {proc.stderr.strip()}")
    conf = directory / "slurm.conf"
    return Harness(dir=directory, conf=conf, nodes=nodes, gpus_per_node=gpus_per_node,
                   env={**os.environ, "SLURM_CONF": str(conf)})


def harness_down(h: Harness) -> None:
    subprocess.run([sys.executable, str(HARNESS), "down", "--dir", str(h.dir)],
                   capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The session's Slurm cluster (4 nodes x 4 fake GPUs); SLURM_CONF is exported."""
    existing = os.environ.get("MALLEABLE_TEST_SLURM_CONF")
    if existing:
        conf = Path(existing)
        h = Harness(dir=conf.parent, conf=conf, nodes=4, gpus_per_node=4, owned=False,
                    env={**os.environ, "SLURM_CONF": str(conf)})
    else:
        if os.geteuid() != 0:
            pytest.fail("tests marked `slurm` need root: the harness runs slurmd and munged")
        h = harness_up(tmp_path_factory.mktemp("slurm") / "harness")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(h.conf)
    try:
        yield h
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        if h.owned:
            harness_down(h)


@pytest.fixture
def slurm(request: pytest.FixtureRequest, slurm_cluster: Harness):
    """The cluster for one test; every job left behind is cancelled afterwards."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture(autouse=True)
def _slurm_for_marked_tests(request: pytest.FixtureRequest):
    """Give every test marked ``slurm`` (and only those, even among parameters of one
    test) the cluster, and cancel its jobs afterwards."""
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm")
    yield

