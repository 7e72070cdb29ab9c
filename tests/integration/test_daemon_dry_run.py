"""Issue 8: ``--dry-run`` plans and logs, and changes nothing in Slurm.

The jobs are set up so that a real daemon would act in each of the four ways at
once: shrink S in place, grow A through checkpoint-requeue, resize the pending B
before it starts (admit) and hold the pending C (which does not fit). The
dry-run daemon (``--once`` and then the service for several decide cycles) must log
those plans marked ``[dry run]``, record its decisions as dry runs, record no action,
and leave every job exactly as ``squeue --json`` showed it before: state, sizes,
node lists, restart counts, hold flags, priorities.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.daemon_support import (
    JOBS,
    DaemonProcess,
    environ_for,
    sbatch,
    store_of,
    submit_emulated,
    submit_rigid,
    wait_running,
    write_config,
)

pytestmark = pytest.mark.slurm

# What would show any change the daemon can make (Slurm itself changes other fields,
# e.g. a pending job's reason and expected start time, which are left out).
FIELDS = ("job_state", "node_count", "nodes", "restart_cnt", "tres_per_node", "tres_req_str",
          "tres_alloc_str", "priority", "resize_time", "requeue", "batch_flag")


def snapshot(h) -> dict[int, dict]:
    """Each job's fields from ``squeue --json`` (22.05 shape), plus whether it is held."""
    doc = json.loads(h.run("squeue", "--json").stdout)
    return {j["job_id"]: {**{f: j.get(f) for f in FIELDS},
                          "held": str(j.get("state_reason", "")).startswith("JobHeld")}
            for j in doc["jobs"]}


def test_dry_run_plans_every_kind_of_action_and_changes_nothing(slurm, tmp_path):
    rigid = submit_rigid(slurm, tmp_path, nodes=1, gpus_per_node=4)
    wait_running(slurm, [rigid])
    s = submit_emulated(slurm, tmp_path, "gpus=4-8,step=4,shrink=inplace,grace=20",
                        nodes=2, gpus_per_node=4)
    a = submit_emulated(slurm, tmp_path, "gpus=2-4,step=2,grace=20", nodes=1, gpus_per_node=2)
    wait_running(slurm, [s, a])
    b = submit_emulated(slurm, tmp_path, "gpus=4-8,step=4,grace=20", nodes=2, gpus_per_node=4)
    c = sbatch(slurm, tmp_path, JOBS / "rigid.sbatch", nodes=2, gpus_per_node=4,
               comment="malleable:gpus=8,grace=20,batch=512,restart_cost=0", name="c")
    before = snapshot(slurm)
    assert before[int(c)]["job_state"] == "PENDING" and not before[int(c)]["held"]

    daemon = DaemonProcess(write_config(tmp_path, poll=1, decide=2), tmp_path / "daemon.log",
                           environ_for(slurm))
    daemon.start("--dry-run", "--once")
    assert daemon.wait_exit(60) == 0
    daemon.start("--dry-run")
    try:
        for _ in range(3):
            mark = daemon.size()
            daemon.wait_log(r"decide cycle: ", since=mark, timeout=30)
        assert daemon.stop() == 0
    finally:
        daemon.kill()

    assert snapshot(slurm) == before
    log = daemon.text(whole=True)
    assert log.count("DRY RUN: no change to Slurm") == 2
    for job, plan in ((s, "shrink 8 -> 4"), (a, "requeue 2 -> 4"), (b, "admit 8 -> 4"),
                      (c, "hold 8 -> 0")):
        assert f"job={job} malleable.daemon.cycle: plan: {plan} GPUs" in log, plan
        assert all(ln.endswith("[dry run]") for ln in log.splitlines()
                   if f"job={job} " in ln and "plan:" in ln)
    assert ": done (action" not in log
    store = store_of(tmp_path)
    decisions = store.decisions()
    assert len(decisions) >= 4 and all(d["dry_run"] for d in decisions)
    assert store.targets(decisions[-1]["id"]) == {s: 4, a: 4, b: 4, c: 0}
    assert store.actions() == []
    store.close()
