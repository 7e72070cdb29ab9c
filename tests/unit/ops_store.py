"""A state store with known contents for the admin commands' tests (a database alone:
no daemon, no Slurm).

It is filled through the store's own functions and the daemon's estimator
bookkeeping (`malleable.daemon.estimates`), the way the daemon fills it:

* job 101: malleable (2-8 GPUs, step 2, m0 512, target 2,000,000 samples), ran on
  2 GPUs at 1,000 samples/s (run 0), was checkpoint-requeued to 4 GPUs and runs at
  1,800 samples/s (run 1); the latest decision targets 8 GPUs;
* job 102: malleable, pending on 2 GPUs, held by an in-flight HOLD action; target 0;
* job 103: malleable, completed;
* job 104: rigid, running on 4 GPUs;
* a decision by ``equi`` with targets, estimates for 101 and 102, a requeue action
  (done) and a hold (in flight), two rejected progress lines of 101, and a lease
  whose heartbeat is 5 s before ``NOW``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select

from malleable.daemon.cycle import spec_as_dict
from malleable.daemon.estimates import ESTIMATOR_MODEL, EstimatorBook, estimate_params
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.lease import acquire_lease
from malleable.db.models import Job
from malleable.estimators.table import SpeedupTable
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=300)
SPEC_101 = "malleable:gpus=2-8,step=2,batch=512,model=cifar10,target_samples=2000000"
SPEC_102 = "malleable:gpus=2-4,batch=256"
G = 4


def _job(job_id: str, state: JobState, gpus: int, nodes: int = 1, comment: str = "",
         restarts: int = 0, name: str = "train", **kw) -> SlurmJob:
    return SlurmJob(job_id=job_id, job_id_num=int(job_id), name=name, user="alice", uid=1000,
                    partition="gpu", state=state, gpus=gpus, node_count=nodes,
                    gpus_per_node=gpus // max(nodes, 1), comment=comment,
                    restart_count=restarts, requeueable=True, submit_time=T0,
                    reason="None" if state == JobState.RUNNING else "Resources", **kw)


@dataclass
class Built:
    """What the tests need to know about the built store."""

    path: Path | str
    url: str
    table: SpeedupTable          # the daemon's speedup table for [101, 102] at g = 4
    remaining_101: float          # remaining work of 101's estimate, samples at m0
    decision_id: int
    requeue_id: int
    hold_id: int


def build_store(path: Path | str) -> Built:
    """Create and fill the store at ``path`` (an SQLite file) or at an SQLAlchemy URL
    (e.g. PostgreSQL's); see the module docstring."""
    url = path if isinstance(path, str) else f"sqlite:///{path}"
    engine: Engine = make_engine(url)
    schema.upgrade(engine)
    S = session_factory(engine)
    with S() as s, s.begin():
        store.upsert_jobs(s, [
            _job("101", JobState.RUNNING, 2, comment=SPEC_101, name="resnet"),
            _job("102", JobState.PENDING, 2, comment=SPEC_102, name="bert", held=True),
            _job("103", JobState.RUNNING, 2, comment=SPEC_102, name="done-job"),
            _job("104", JobState.RUNNING, 4, name="rigid"),
        ], T0, parse_spec=spec_as_dict)
    with S() as s, s.begin():
        ids = store.job_ids(s, ["101", "102", "103"])
        # run 0: 2 GPUs, 1000 samples/s, every 10 s for 100 s
        rows = [store.SampleIn(ids["101"], T0 + timedelta(seconds=10 * i), step=i * 20,
                               samples=10_000 * i, gpus=2, batch_size=512, nodes=1, restart=0)
                for i in range(11)]
        # run 1: 4 GPUs from T0+130 s, 1800 samples/s
        base = 100_000
        rows += [store.SampleIn(ids["101"], T0 + timedelta(seconds=130 + 10 * i),
                                step=200 + i * 35, samples=base + 18_000 * i, gpus=4,
                                batch_size=512, nodes=1, restart=1) for i in range(13)]
        store.add_progress_samples(s, rows)
        store.save_progress_file(s, job_id=ids["101"], path="/spool/101.jsonl", device=1,
                                 inode=2, offset=4000, size=4000, now=NOW, accepted=24,
                                 rejected={"not_json": 2})
        a = store.create_action(s, job_id=ids["101"], kind="requeue", state="signal",
                                from_gpus=2, to_gpus=4, from_nodes=1, to_nodes=1,
                                now=T0 + timedelta(seconds=100))
        store.update_action(s, a.id, now=T0 + timedelta(seconds=125), state="done",
                            signalled_at=T0 + timedelta(seconds=101), note="running on 4 GPUs",
                            finished=True)
        h = store.create_action(s, job_id=ids["102"], kind="hold", state="hold", to_gpus=0,
                                from_gpus=2, now=T0 + timedelta(seconds=200))
        store.add_job_event(s, ids["101"], T0 + timedelta(seconds=110), "checkpointed",
                            '{"step": 200}')
    with S() as s, s.begin():
        store.upsert_jobs(s, [
            _job("101", JobState.RUNNING, 4, comment=SPEC_101, name="resnet", restarts=1),
            _job("102", JobState.PENDING, 2, comment=SPEC_102, name="bert", held=True),
            _job("103", JobState.COMPLETED, 2, comment=SPEC_102, name="done-job"),
            _job("104", JobState.RUNNING, 4, name="rigid"),
        ], T0 + timedelta(seconds=125), parse_spec=spec_as_dict)
    with S() as s, s.begin():
        jobs = [s.scalars(select(Job).where(Job.slurm_job_id == x)).one() for x in ("101", "102")]
        est, table = EstimatorBook().run(s, jobs, G, 16)
        for i, j in enumerate(jobs):
            store.record_estimate(s, job_id=j.id, time=T0 + timedelta(seconds=250),
                                  model=ESTIMATOR_MODEL, params=estimate_params(est, i),
                                  remaining_work=float(est.remaining_work[i]),
                                  remaining_work_sd=float(est.remaining_std[i]),
                                  flags={"bits": int(est.flags[i])})
        d = store.record_decision(
            s, time=T0 + timedelta(seconds=250), policy="equi", params={},
            inputs_digest="x", objective=2.5, duration_s=0.012, dry_run=False,
            targets=[store.TargetIn(jobs[0].id, 8, 512, "equal share 8"),
                     store.TargetIn(jobs[1].id, 0, None, "no room")])
        remaining = float(est.remaining_work[0])
        decision_id = d
    acquire_lease(engine, "testhost:4242", timeout_s=300, now=NOW - timedelta(seconds=5))
    engine.dispose()
    return Built(path, url, table, remaining, decision_id, a.id, h.id)


def write_config(path: Path, url: str, **sections: dict) -> Path:
    """A malleable.toml with the database ``url`` and more ``[section] key = value`` tables."""
    from malleable.ops.config import toml_value

    lines = ["[database]", f"url = {toml_value(url)}"]
    for name, keys in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
