"""``malleable plan`` on the real Slurm harness with no daemon running: it shows what the
active policy would do, and changes nothing, neither in Slurm nor in the database.

The cluster is filled by a rigid job (16 of 16 GPUs), then a malleable job is
submitted and stays pending: the policy (``equi``) can give it no GPUs, so the
daemon would hold it. ``plan`` must say so, and afterwards the job must still be
pending and not held, and the database as empty as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, Decision, Estimate, Job
from malleable.slurm import connect
from malleable.slurm.records import JobState
from tests.helpers import wait_until
from tests.unit.test_ops_commands import check_schema

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "malleable")


def cli(*args: str):
    return CliRunner().invoke(main, list(args), prog_name="malleable")


@pytest.fixture
def setup(tmp_path, slurm):
    cfg = tmp_path / "malleable.toml"
    db = tmp_path / "m.db"
    cfg.write_text(f'[database]\nurl = "sqlite:///{db}"\n'
                   f'[progress]\nspool_dir = "{tmp_path / "spool"}"\n'
                   '[policy]\nname = "equi"\nmin_gain = 0.0\ncooldown_s = 0.0\n'
                   'min_run_restarts = 0\n')
    r = cli("db", "upgrade", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    (tmp_path / "spool").mkdir(mode=0o1733)
    rigid = slurm.run("sbatch", "--parsable", "-N4", "--gres=gpu:4", f"--chdir={tmp_path}",
                      "--output=/dev/null", "--wrap", "sleep 300").stdout.strip()
    env = {**os.environ, "MALLEABLE_CONFIG": str(cfg), "MALLEABLE_PYTHON": sys.executable,
           "MALLEABLE_EXAMPLES": str(ROOT / "examples"), "JOB_ARGS": "--speedup 100"}
    wait_until(lambda: connect().job(rigid).state == JobState.RUNNING, what="rigid job running")
    p = subprocess.run([EXE, "submit", "--gpus", "2-4", f"--output={tmp_path}/job-%j.out",
                        str(ROOT / "examples" / "emulated_job.sbatch")], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    return cfg, db, p.stdout.strip()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_plan_shows_the_hold_and_changes_nothing(setup):
    cfg, db, job = setup
    client = connect()
    wait_until(lambda: client.job(job).state == JobState.PENDING, what="malleable job pending")
    before = digest(db)

    r = cli("plan", "--config", str(cfg), "--json")
    assert r.exit_code == 0, r.output
    doc = check_schema(json.loads(r.stdout))
    assert doc["recorded"] is False and doc["policy"]["name"] == "equi"
    assert doc["capacity"] == {"gpus_per_node": 4, "free_gpus": 0, "nodes": 4}
    (j,) = doc["jobs"]
    assert (j["job_id"], j["state"], j["requested_gpus"], j["target_gpus"]) == \
        (job, "PENDING", 2, 0)
    assert [(a["job_id"], a["kind"], a["from_gpus"], a["to_gpus"]) for a in doc["actions"]] \
        == [(job, "hold", 2, 0)]
    assert doc["slurm_rpcs"] == 3      # squeue; scontrol show node; scontrol show partition

    text = cli("plan", "--config", str(cfg))
    assert text.exit_code == 0, text.output
    assert "dry run: nothing was changed in Slurm and nothing was recorded" in text.stdout
    assert f"hold  {job}" in text.stdout

    # Slurm: still pending, not held; the database: byte for byte as before, still empty.
    sj = client.job(job)
    assert sj.state == JobState.PENDING and not sj.held
    assert digest(db) == before
    eng = make_engine(f"sqlite:///{db}", create=False)
    with session_factory(eng, readonly=True)() as s:
        assert [s.query(m).count() for m in (Job, Decision, Estimate, Action)] == [0, 0, 0, 0]
    eng.dispose()


def test_plan_fails_with_exit_1_when_slurm_does_not_answer(tmp_path, monkeypatch):
    cfg = tmp_path / "malleable.toml"
    cfg.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/m.db"\n'
                   '[slurm]\nbackend = "cli"\nmax_retries = 5\ncommand_timeout_s = 1.5\n')
    assert cli("db", "upgrade", "--config", str(cfg)).exit_code == 0
    bad = tmp_path / "slurm.conf"
    bad.write_text("ClusterName=gone\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                   "AuthType=auth/none\n")
    monkeypatch.setenv("SLURM_CONF", str(bad))
    r = cli("plan", "--config", str(cfg))
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("malleable plan: error: Slurm did not answer the poll")
    assert "(after 1 attempt(s))" in r.stderr       # at a prompt: no retries with back-off
    assert len(r.stderr.strip().splitlines()) == 1


def test_submit_too_asks_slurm_once_when_it_does_not_answer(tmp_path, monkeypatch):
    """The other command at a prompt: no retries with back-off either (with
    ``max_retries = 3`` it printed three retry lines and took 40 s)."""
    cfg = tmp_path / "malleable.toml"
    cfg.write_text('[slurm]\nbackend = "cli"\nmax_retries = 5\ncommand_timeout_s = 1.5\n')
    bad = tmp_path / "slurm.conf"
    bad.write_text("ClusterName=gone\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                   "AuthType=auth/none\n")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    monkeypatch.setenv("SLURM_CONF", str(bad))
    r = cli("submit", "--config", str(cfg), "--dry-run", "--gpus", "2-8", str(script))
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("malleable submit: error: scontrol show config")
    assert "(after 1 attempt(s))" in r.stderr and "retry" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
