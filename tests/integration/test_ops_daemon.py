"""The admin commands and the Prometheus exporter against a running daemon on the real
Slurm harness, then against its database alone after the daemon stopped.

One daemon (``malleable daemon`` as a subprocess, polling every second and deciding
every two, policy ``equi``, metrics on a free port) serves the whole module; emulated
malleable jobs (examples/emulated_job.sbatch at 100x speed) give it work. Commands
run as root in process (click's runner on the real ``malleable`` group: the same code
as the console script, without a second of imports per call), through the installed
console script, and as ``nobody`` through ``setpriv`` (no shell).

Database permissions follow docs/operator-guide.md ("Who may do what"): the state
directory and the database files belong to a group (``users``), with modes 0750/0640
so that members can read (the commands open the file read-only), and for the steering
test 0770/0660 so that members can also write the file; whether they may change
settings is then malleable's own check (``[operator] group = "staff"``).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.ops.schemas import SCHEMAS
from tests.helpers import wait_until
from tests.unit.test_ops_commands import check_schema

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "malleable")
READ_GROUP = "users"
OP_GROUP = "staff"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Live:
    """The module's daemon and its files."""

    base: Path
    cfg: Path
    db: Path
    spool: Path
    port: int
    proc: subprocess.Popen
    log: Path

    def cli(self, *args: str, config: bool = True):
        """``malleable ARGS --config CFG`` in process (root); click's Result."""
        argv = [*args, "--config", str(self.cfg)] if config else list(args)
        return CliRunner().invoke(main, argv, prog_name="malleable")

    def json(self, *args: str) -> dict:
        r = self.cli(*args, "--json")
        assert r.exit_code == 0, r.output
        return check_schema(json.loads(r.stdout))

    def exe(self, *args: str, groups: list[str] | None = None, user: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """The console script, as root or as ``user`` with supplementary ``groups``."""
        argv = [EXE, *args, "--config", str(self.cfg)]
        if user is not None:
            gs = ["--groups=" + ",".join(groups)] if groups else ["--clear-groups"]
            argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", *gs, *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env=env or os.environ.copy())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()

    def submit(self, gpus: str = "2-4") -> str:
        env = {**os.environ, "MALLEABLE_CONFIG": str(self.cfg),
               "MALLEABLE_EXAMPLES": str(ROOT / "examples"), "MALLEABLE_PYTHON": sys.executable,
               "MALLEABLE_CKPT_DIR": str(self.base / "ckpt"),
               "JOB_ARGS": "--speedup 100 --target-steps 10000000"}
        p = subprocess.run([EXE, "submit", "--gpus", gpus, "--restart-cost", "1",
                            f"--output={self.base}/job-%j.out",
                            str(ROOT / "examples" / "emulated_job.sbatch")],
                           capture_output=True, text=True, env=env, cwd=self.base, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format (None if absent)."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                   if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def share_with_group(live: Live, write: bool = False) -> None:
    """What docs/operator-guide.md tells an admin to do to let a group read the store
    (directory 0750, files 0640), or with ``write`` also change it (0770, 0660)."""
    gid = grp.getgrnam(READ_GROUP).gr_gid
    state = live.db.parent
    for p in [state, *state.glob(live.db.name + "*")]:
        os.chown(p, 0, gid)
        if p.is_dir():
            p.chmod(0o770 if write else 0o750)
        else:
            p.chmod(0o660 if write else 0o640)


@pytest.fixture(scope="module")
def live(slurm_cluster):
    base = Path(tempfile.mkdtemp(prefix="malleable-ops-", dir="/tmp"))
    base.chmod(0o755)        # nobody must reach the database (pytest's tmp dirs are 0700)
    port = free_port()
    cfg = base / "malleable.toml"
    db = base / "state" / "malleable.db"
    cfg.write_text(f"""
[database]
url = "sqlite:///{db}"
[progress]
spool_dir = "{base / 'spool'}"
[daemon]
poll_interval_s = 1.0
ingest_interval_s = 1.0
decide_interval_s = 2.0
lease_timeout_s = 20.0
[policy]
name = "equi"
min_gain = 0.0
cooldown_s = 0.0
min_run_restarts = 0.0
[operator]
group = "{OP_GROUP}"
[metrics]
address = "127.0.0.1:{port}"
""")
    cfg.chmod(0o644)
    log = base / "daemon.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([EXE, "daemon", "--config", str(cfg)], stdout=fh,
                                stderr=subprocess.STDOUT, env=os.environ.copy(),
                                stdin=subprocess.DEVNULL)
    lv = Live(base, cfg, db, base / "spool", port, proc, log)
    try:
        wait_until(lambda: _up(lv), timeout=60, what="daemon up with metrics and a decision")
        share_with_group(lv)
        yield lv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        slurm_cluster.cancel_all()
        shutil.rmtree(base, ignore_errors=True)


def _up(lv: Live) -> bool:
    if lv.proc.poll() is not None:
        raise AssertionError(f"daemon exited {lv.proc.returncode}: {lv.log.read_text()[-2000:]}")
    try:
        text = lv.metrics()
    except OSError:
        return False
    return (metric(text, "malleable_cycles_total", kind="decide", outcome="ok") or 0) >= 1


def wait_for(live: Live, pred, what: str, job: str | None = None, timeout: float = 120):
    """`wait_until` whose failure message shows the job's latest targets and the daemon log."""
    try:
        return wait_until(pred, timeout=timeout, interval=1, what=what)
    except AssertionError as exc:
        extra = ""
        if job is not None:
            r = live.cli("job", "show", job, "--json")
            if r.exit_code == 0:
                doc = json.loads(r.stdout)
                extra = json.dumps({"targets": doc["targets"][:5], "actions": doc["actions"],
                                    "job": doc["job"]["state"]}, indent=1)
        raise AssertionError(f"{exc}\n{extra}\ndaemon log:\n"
                             f"{live.log.read_text()[-4000:]}") from None


def _requeued(lv: Live, job: str):
    r = lv.cli("actions", "--job", job, "--json")
    if r.exit_code == 2 and "not in the state store" in r.stderr:
        return None       # not polled yet
    acts = check_schema(json.loads(r.stdout))["actions"]
    return next((a for a in acts if a["kind"] == "requeue" and a["state"] == "done"), None)


# --------------------------------------------------------------------------- a job runs


def test_read_commands_and_metrics_while_a_job_is_resized(live: Live):
    # Paused until the job logs progress: examples/emulated_job.sbatch installs its
    # checkpoint-signal trap only after it started the trainer, and a signal before that
    # kills the batch shell (the daemon may decide within a second of the job's start).
    assert live.json("pause")["paused"]
    job = live.submit()
    wait_for(live, lambda: (j := _status_job(live, job)) and j["throughput"],
             f"job {job} running with progress", job)
    assert live.json("resume")["paused"] is False
    wait_for(live, lambda: _requeued(live, job), f"job {job} checkpoint-requeued from 2 to 4 GPUs",
             job)
    wait_until(lambda: (j := _status_job(live, job)) and j["throughput"] and j["gpus"] == 4,
               timeout=60, interval=1, what=f"job {job} running on 4 GPUs with throughput")

    # status, as root: JSON and text
    doc = live.json("status")
    assert doc["daemon"]["health"] == "healthy"
    assert doc["daemon"]["holder"].endswith(f":{live.proc.pid}")
    assert doc["daemon"]["heartbeat_age_s"] < 20
    assert doc["policy"]["name"] == "equi" and doc["paused"] is False
    j = next(x for x in doc["jobs"] if x["job_id"] == job)
    assert (j["state"], j["gpus"], j["target_gpus"]) == ("RUNNING", 4, 4)
    assert j["throughput"] > 0 and j["remaining_work"] > 0 and j["eta_s"] > 0
    assert j["last_action"]["kind"] == "requeue" and j["last_action"]["state"] == "done"
    assert doc["gpus"]["held"] >= 4 and doc["gpus_per_node_source"] == "slurm.conf"
    text = live.exe("status")       # the installed console script
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith(job + " "))
    assert "RUNNING" in line and "4 -> 4" in line and "requeue 2->4: done" in line
    assert text.stdout.startswith("daemon:        healthy")
    assert live.exe("status", "--check").returncode == 0

    # job show: sizes 2 then 4, the requeue, the checkpoint, the fitted curve, a PNG
    png = live.base / "curve.png"
    doc = live.json("job", "show", job, "--plot", str(png))
    assert [s["gpus"] for s in doc["sizes"]][:1] == [2] and doc["sizes"][-1]["gpus"] == 4
    assert any(e["kind"] == "checkpointed" for e in doc["events"])
    assert [r["restart"] for r in doc["progress"]["runs"]] == [0, 1]
    assert doc["progress"]["runs"][1]["min_gpus"] == 4
    assert [p["gpus"] for p in doc["curve"]["points"]] == [2, 4]
    assert all(p["goodput"] > 0 for p in doc["curve"]["points"])
    assert png.read_bytes()[:4] == b"\x89PNG" and doc["plot"] == str(png)
    out = live.cli("job", "show", job).stdout
    assert "speedup curve" in out and "checkpointed" in out and "requeue" in out

    # actions: the log, filtered
    doc = live.json("actions", "--job", job)
    assert [a["kind"] for a in doc["actions"]] == ["requeue"]
    assert doc["actions"][0]["from_gpus"] == 2 and doc["actions"][0]["to_gpus"] == 4
    assert live.json("actions", "--since", "1h", "--limit", "1")["actions"][-1]["job_id"] == job
    assert "requeue" in live.cli("actions", "--since", "10m").stdout

    # plan with the daemon running: the job is at its target, nothing to do, nothing recorded
    before = live.json("actions")["actions"]
    doc = live.json("plan")
    pj = next(x for x in doc["jobs"] if x["job_id"] == job)
    assert (pj["gpus"], pj["target_gpus"]) == (4, 4) and doc["actions"] == []
    assert doc["recorded"] is False and doc["slurm_rpcs"] >= 1
    assert live.json("actions")["actions"] == before
    assert "dry run: nothing was changed" in live.cli("plan").stdout

    # a rejected progress line, to see it counted
    with (live.spool / f"{job}.jsonl").open("a") as fh:
        fh.write("this is not json\n")
    # the exporter, scraped while the daemon runs
    wait_until(lambda: (metric(live.metrics(), "malleable_progress_lines_rejected_total",
                               reason="not_json") or 0) >= 1, timeout=30, interval=1,
               what="the rejected line counted")
    m = live.metrics()
    assert metric(m, "malleable_up") == 1
    assert metric(m, "malleable_gpus_held") >= 4
    assert metric(m, "malleable_jobs", state="RUNNING") >= 1
    assert metric(m, "malleable_actions_total", kind="requeue", outcome="done") >= 1
    assert metric(m, "malleable_cycle_duration_seconds_count", kind="decide") >= 2
    assert metric(m, "malleable_cycle_duration_seconds_count", kind="poll") >= 2
    assert metric(m, "malleable_slurm_rpcs_per_cycle_count", kind="poll") >= 2
    assert metric(m, "malleable_slurm_rpcs_total") >= 4
    assert metric(m, "malleable_policy_objective", policy="equi") is not None
    assert metric(m, "malleable_progress_lines_accepted_total") > 0
    assert metric(m, "malleable_actions_planned_total", kind="requeue", mode="acting") >= 1

    # status as nobody, a member of the read group: readable, plain and JSON
    r = live.exe("status", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 0, r.stderr
    assert job in r.stdout and "healthy" in r.stdout
    r = live.exe("status", "--json", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 0, r.stderr
    doc = check_schema(json.loads(r.stdout))
    assert any(x["job_id"] == job and x["gpus"] == 4 for x in doc["jobs"])
    r = live.exe("job", "show", job, "--json", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 0 and json.loads(r.stdout)["job"]["job_id"] == job, r.stderr
    # ... and without the group: a clear one-line refusal naming the file and the way out
    r = live.exe("status", user="nobody")
    assert r.returncode == 2
    assert "permission denied" in r.stderr and "operator-guide" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _status_job(live: Live, job: str) -> dict | None:
    return next((x for x in live.json("status")["jobs"] if x["job_id"] == job), None)


# --------------------------------------------------------------------------- steering


def test_pause_resume_and_policy_while_the_daemon_runs(live: Live):
    share_with_group(live, write=True)
    last = live.json("status")["last_decision"]["id"]
    # nobody in the read group (who may even write the file) is refused by malleable
    r = live.exe("pause", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("malleable pause: error: permission denied: you are nobody")
    assert f"operator group '{OP_GROUP}'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = live.exe("policy", "set", "fifo", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 1 and "permission denied" in r.stderr
    assert live.json("status")["paused"] is False

    # a member of the operator group may pause
    r = live.exe("pause", "--json", user="nobody", groups=[READ_GROUP, OP_GROUP])
    assert r.returncode == 0, r.stderr
    doc = check_schema(json.loads(r.stdout))
    assert doc["paused"] and doc["changed"] and doc["by"].startswith("nobody")
    # paused: the daemon keeps deciding, but starts nothing for a new job
    job = live.submit()
    wait_until(lambda: (d := live.json("status"))["last_decision"]["id"] > last + 2
               and any(x["job_id"] == job and x["throughput"] for x in d["jobs"]),
               timeout=60, interval=1, what="decisions while paused, the job logging progress")
    wait_until(lambda: metric(live.metrics(), "malleable_paused") == 1, timeout=20,
               what="paused in the metrics")
    assert live.json("actions", "--job", job)["actions"] == []
    st = live.json("status")
    assert st["paused"] and next(x for x in st["jobs"] if x["job_id"] == job)["gpus"] == 2
    assert "PAUSED" in live.cli("status").stdout
    assert live.json("plan")["paused"] is True

    # policy set (root): the daemon's next decision uses it
    doc = live.json("policy", "set", "srpt", "risk=0.5")
    assert doc["name"] == "srpt" and doc["source"] == "operator" and doc["changed"]
    wait_until(lambda: live.json("status")["last_decision"]["policy"] == "srpt", timeout=30,
               interval=1, what="a decision by srpt")
    assert live.json("policy", "show")["params"] == {"risk": 0.5}
    r = live.cli("policy", "set", "nonsense")
    assert r.exit_code == 2 and "unknown policy 'nonsense'" in r.stderr
    assert "policy: srpt risk=0.5" in live.cli("policy", "show").stdout
    r = live.cli("policy", "set", "equi")
    assert r.exit_code == 0 and r.stdout.startswith("policy set: equi"), r.output
    assert live.json("policy", "show")["name"] == "equi"
    # the commands that need neither the daemon nor the database, with it running
    names = [p["name"] for p in live.json("policy", "list")["policies"]]
    assert "srpt" in names and "srpt" in live.cli("policy", "list").stdout
    conf = live.json("config", "show")
    assert conf["sections"]["metrics"]["address"] == f"127.0.0.1:{live.port}"
    assert 'group = "staff"' in live.cli("config", "show").stdout

    # resume (the operator group member again): the daemon acts on the new job
    r = live.exe("resume", user="nobody", groups=[READ_GROUP, OP_GROUP])
    assert r.returncode == 0 and r.stdout.startswith("resumed"), r.stderr
    wait_for(live, lambda: _requeued(live, job), f"job {job} resized after resume", job)
    assert metric(live.metrics(), "malleable_paused") == 0


# --------------------------------------------------------------------------- database alone


def test_read_commands_on_the_database_after_the_daemon_stopped(live: Live):
    job = live.json("actions")["actions"][0]["job_id"]
    live.proc.send_signal(signal.SIGTERM)
    assert live.proc.wait(timeout=60) == 0, live.log.read_text()[-2000:]
    share_with_group(live)
    doc = live.json("status", "--all")
    assert doc["daemon"]["health"] == "absent" and doc["daemon"]["holder"] is None
    r = live.cli("status", "--check")
    assert r.exit_code == 1 and "daemon absent" in r.stderr
    assert live.json("job", "show", job)["actions"]
    assert live.json("actions")["actions"]
    assert live.json("policy", "show")["name"] == "equi"
    # The last connection removed the -wal/-shm files; nobody (read group, no write access
    # to the file or the directory) opens the checkpointed file read-only all the same.
    assert not live.db.with_name(live.db.name + "-wal").exists()
    for args in (("status", "--all", "--json"), ("actions", "--json"),
                 ("job", "show", job, "--json"), ("policy", "show", "--json")):
        r = live.exe(*args, user="nobody", groups=[READ_GROUP])
        assert r.returncode == 0, (args, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["schema"] in SCHEMAS
        check_schema(doc)
    r = live.exe("status", user="nobody", groups=[READ_GROUP])
    assert r.returncode == 0 and "absent" in r.stdout
    # an operator-group member without write access to the file is told what is missing
    r = live.exe("pause", user="nobody", groups=[READ_GROUP, OP_GROUP])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "read-only for you" in r.stderr and "sudo" in r.stderr
