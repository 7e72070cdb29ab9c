"""What the daemon's integration tests share: the daemon as a subprocess, test jobs, the store.

The daemon runs exactly as an operator runs it, ``malleable daemon --config <toml>``,
as a child process with its stderr in a log file; the tests read its log lines, the
SQLite store it writes (opened read-only here) and Slurm itself (``squeue --json``
through the port's parser). Jobs are the contract's emulated job
(examples/emulated_job.sbatch, time-compressed) and the tiny scripts in
tests/integration/daemon_jobs/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Action, Decision, Job, JobEvent, Target
from malleable.slurm import parse
from malleable.slurm.records import SlurmJob
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
JOBS = Path(__file__).resolve().parent / "daemon_jobs"
MALLEABLE = Path(sys.executable).parent / "malleable"

# The emulated job, time-compressed: 100 emulated seconds per real second, a
# progress line every 0.5 s, a checkpoint save in 0.05 s, and never done.
EMULATED_ARGS = "--speedup 100 --log-every 50 --target-steps 100000000"
# Every test job declares its initial batch size (as examples/emulated_job.sbatch does)
# and a zero restart cost: with min_gain 0 the hysteresis then never holds back a
# change the policy proposes (the tests are about the daemon, not the policy).
SPEC_TAIL = "batch=512,restart_cost=0"


def write_config(tmp: Path, *, policy: str = "equi", poll: float = 2, decide: float = 4,
                 extra: str = "", lease_timeout: float = 30, backoff: float = 600,
                 retries: int = 0) -> Path:
    """A daemon configuration with short intervals, a tmp SQLite and a tmp spool dir."""
    (tmp / "spool").mkdir(exist_ok=True)
    path = tmp / "malleable.toml"
    path.write_text(f"""\
[database]
url = "sqlite:///{tmp / 'm.db'}"
[progress]
spool_dir = "{tmp / 'spool'}"
[slurm]
backend = "cli"
max_retries = {retries}
command_timeout_s = 10
[daemon]
poll_interval_s = {poll}
ingest_interval_s = {poll}
decide_interval_s = {decide}
lease_timeout_s = {lease_timeout}
requeue_backoff_s = {backoff}
[policy]
name = "{policy}"
min_gain = 0.0
cooldown_s = 0
min_run_restarts = 0
{extra}""")
    return path


class DaemonProcess:
    """``malleable daemon`` as a child process; every run appends to one log file.

    Args:
        config: the TOML file.
        log: the log file (stderr of every run).
        env: the environment (SLURM_CONF of the test cluster).
    """

    def __init__(self, config: Path, log: Path, env: dict) -> None:
        self.config = config
        self.log = log
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.offset = 0   # where the current run's lines start in the log

    def start(self, *args: str, extra_env: dict | None = None, ready: bool = True
              ) -> DaemonProcess:
        """Start a run; with ``ready``, return once it holds the lease (database ready)."""
        assert self.proc is None or self.proc.poll() is not None, "the daemon still runs"
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        env = {**self.env, **(extra_env or {})}
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([str(MALLEABLE), "daemon", "--config", str(self.config),
                                          *args], env=env, stdin=subprocess.DEVNULL,
                                          stdout=fh, stderr=fh)
        if ready:
            self.wait_log(r"lease taken by", timeout=60)
        return self

    def text(self, whole: bool = False) -> str:
        """The log of the current run (or of every run)."""
        data = self.log.read_bytes() if self.log.exists() else b""
        return data[0 if whole else self.offset:].decode(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 60, since: int | None = None
                 ) -> re.Match:
        """Wait for a log line matching ``pattern`` (in the current run, or after ``since``)."""
        rx = re.compile(pattern)

        def found():
            data = self.log.read_bytes()[self.offset if since is None else since:]
            m = rx.search(data.decode(errors="replace"))
            if m is None and self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) before logging "
                                     f"{pattern!r}:\n{self.text()[-3000:]}")
            return m
        try:
            return wait_until(found, timeout=timeout, interval=0.2, what=f"log {pattern!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- daemon log ---\n{self.text()[-4000:]}") from None

    def size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"daemon still running after {timeout} s:\n"
                                 f"{self.text()[-3000:]}") from None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        """SIGKILL the current run if it is still alive (test clean-up)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


# ------------------------------------------------------------------ jobs


def job_env(tmp: Path, job_args: str = EMULATED_ARGS) -> tuple[tuple[str, str], ...]:
    """What the emulated job needs (SubmitRequest.env)."""
    (tmp / "ckpt").mkdir(exist_ok=True)
    return (("MALLEABLE_EXAMPLES", str(EXAMPLES)), ("MALLEABLE_PYTHON", sys.executable),
            ("MALLEABLE_SPOOL", str(tmp / "spool")), ("MALLEABLE_CKPT_DIR", str(tmp / "ckpt")),
            ("JOB_ARGS", job_args))


def sbatch(h, tmp: Path, script: Path, *, nodes: int, gpus_per_node: int, comment: str = "",
           env: tuple = (), name: str = "", extra: tuple = ()) -> str:
    """Submit ``script`` with sbatch (no shell; ``extra``: more sbatch options); returns
    the job id."""
    argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--gres=gpu:{gpus_per_node}",
            f"--output={tmp}/job-%j.out", f"--chdir={tmp}", "--requeue", *extra]
    if comment:
        argv.append(f"--comment={comment}")
    if name:
        argv.append(f"--job-name={name}")
    proc = subprocess.run(argv + [str(script)], env={**h.env, **dict(env)}, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def submit_emulated(h, tmp: Path, spec: str, *, nodes: int, gpus_per_node: int,
                    job_args: str = "", extra: tuple = ()) -> str:
    """An emulated malleable job with the spec ``malleable:<spec>,<SPEC_TAIL>``."""
    return sbatch(h, tmp, EXAMPLES / "emulated_job.sbatch", nodes=nodes,
                  gpus_per_node=gpus_per_node, comment=f"malleable:{spec},{SPEC_TAIL}",
                  env=job_env(tmp, f"{EMULATED_ARGS} {job_args}".strip()), name="emulated",
                  extra=extra)


def submit_rigid(h, tmp: Path, *, nodes: int = 1, gpus_per_node: int = 4,
                 extra: tuple = ()) -> str:
    """A rigid job (no spec): sleeps."""
    return sbatch(h, tmp, JOBS / "rigid.sbatch", nodes=nodes, gpus_per_node=gpus_per_node,
                  name="rigid", extra=extra)


def squeue(h) -> dict[str, SlurmJob]:
    """Every job as ``squeue --json`` reports it, through the port's parser."""
    out = h.run("squeue", "--json").stdout
    return {j.job_id: j for j in parse.parse_jobs(json.loads(out))}


def job_view(j: SlurmJob) -> dict:
    """What must not change about a job the daemon leaves alone."""
    return {"state": j.state.value, "gpus": j.gpus, "nodes": j.node_count,
            "gpus_per_node": j.gpus_per_node, "node_list": j.nodes,
            "restart_count": j.restart_count, "held": j.held}


def wait_running(h, ids: list[str], timeout: float = 60) -> dict[str, SlurmJob]:
    def ok():
        jobs = squeue(h)
        return jobs if all(i in jobs and jobs[i].state.value == "RUNNING" for i in ids) else None
    return wait_until(ok, timeout=timeout, interval=0.3, what=f"jobs {ids} running")


def progress(tmp: Path, job_id: str) -> list[dict]:
    """The emulated job's progress lines."""
    path = tmp / "spool" / f"{job_id}.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------ the store


@dataclass
class Store:
    """The daemon's SQLite store, read-only."""

    url: str
    _engine: object = None

    @property
    def sessions(self):
        """Opened on first use (the daemon creates the database)."""
        if self._engine is None:
            self._engine = make_engine(self.url, create=False)
        return session_factory(self._engine, readonly=True)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()

    def job_db_id(self, slurm_id: str) -> int | None:
        with self.sessions() as s:
            return s.scalar(select(Job.id).where(Job.slurm_job_id == slurm_id))

    def actions(self, slurm_id: str | None = None) -> list[dict]:
        with self.sessions() as s:
            q = select(Action, Job.slurm_job_id).join(Job, Job.id == Action.job_id)
            if slurm_id is not None:
                q = q.where(Job.slurm_job_id == slurm_id)
            return [{"id": a.id, "job": sid, "kind": a.kind, "state": a.state,
                     "from_gpus": a.from_gpus, "to_gpus": a.to_gpus, "note": a.note,
                     "decision_id": a.decision_id, "finished": a.finished_at is not None,
                     "created_at": a.created_at, "finished_at": a.finished_at,
                     "signalled_at": a.signalled_at, "last_error": a.last_error}
                    for a, sid in s.execute(q.order_by(Action.id))]

    def decisions(self) -> list[dict]:
        with self.sessions() as s:
            return [{"id": d.id, "policy": d.policy, "dry_run": d.dry_run, "time": d.time}
                    for d in s.scalars(select(Decision).order_by(Decision.id))]

    def targets(self, decision_id: int) -> dict[str, int]:
        with self.sessions() as s:
            rows = s.execute(select(Job.slurm_job_id, Target.gpus)
                             .join(Job, Job.id == Target.job_id)
                             .where(Target.decision_id == decision_id))
            return dict(rows.all())

    def target_reasons(self, decision_id: int) -> dict[str, str]:
        """Each job's target reason in the decision (what the policy or hysteresis said)."""
        with self.sessions() as s:
            rows = s.execute(select(Job.slurm_job_id, Target.reason)
                             .join(Job, Job.id == Target.job_id)
                             .where(Target.decision_id == decision_id))
            return dict(rows.all())

    def events(self, slurm_id: str, kind: str | None = None) -> list[dict]:
        with self.sessions() as s:
            q = (select(JobEvent).join(Job, Job.id == JobEvent.job_id)
                 .where(Job.slurm_job_id == slurm_id))
            if kind is not None:
                q = q.where(JobEvent.kind == kind)
            return [{"kind": e.kind, "time": e.time, "detail": e.detail,
                     "new_state": e.new_state} for e in s.scalars(q.order_by(JobEvent.id))]


def store_of(tmp: Path) -> Store:
    return Store(f"sqlite:///{tmp / 'm.db'}")


def cycle_lines(text: str) -> list[dict]:
    """The daemon's per-cycle log lines, parsed (kind, RPCs by source, jobs)."""
    rx = re.compile(r"cycle=(\d+) job=- \S+: (poll|decide) cycle: [\d.]+ s, (\d+) Slurm RPCs "
                    r"\(jobs (\d+), nodes (\d+), actions (\d+)(?: \[([^\]]*)\])?(?:, other (\d+))?"
                    r"\), (\d+) jobs, (\d+) managed(.*)")
    out = []
    for m in rx.finditer(text):
        calls = {}
        if m.group(7):
            for part in m.group(7).split(", "):
                k, v = part.rsplit(" ", 1)
                calls[k] = int(v)
        out.append({"cycle": int(m.group(1)), "kind": m.group(2), "rpc": int(m.group(3)),
                    "jobs_rpc": int(m.group(4)), "nodes_rpc": int(m.group(5)),
                    "actions_rpc": int(m.group(6)), "calls": calls,
                    "other_rpc": int(m.group(8) or 0), "jobs": int(m.group(9)),
                    "managed": int(m.group(10)), "unavailable": "unavailable" in m.group(11)})
    return out


def environ_for(h) -> dict:
    """The daemon's environment: the test cluster's SLURM_CONF, no inherited hook."""
    env = {k: v for k, v in os.environ.items() if k != "MALLEABLE_TEST_CRASH_AT"}
    env.update(h.env)
    env.pop("MALLEABLE_TEST_CRASH_AT", None)
    env.pop("MALLEABLE_CONFIG", None)
    env.pop("MALLEABLE_DATABASE_URL", None)
    return env
