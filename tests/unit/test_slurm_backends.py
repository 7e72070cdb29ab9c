"""Backend logic that the harness cannot show: the commands the cli backend issues for
releases other than 22.05, backend selection by `connect`, and pyslurm value shapes.

This machine runs only Slurm 22.05, so for 23.02-25.11 the cli backend is driven
by a runner that records each argv and answers with the fixture documents of that
release (tests/fixtures/slurm). Everything 22.05 does for real is tested against
the harness in tests/integration/.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from malleable.config import SlurmConfig
from malleable.slurm import (
    SignalTarget,
    SlurmError,
    SlurmParseError,
    SlurmUnavailable,
    SubmitRequest,
    connect,
)
from malleable.slurm.backend_cli import CliSlurmClient
from malleable.slurm.backend_pyslurm import PyslurmSlurmClient, _gpus_in_gres_dict, job_record
from malleable.slurm.parse import parse_jobs
from malleable.slurm.runner import CommandResult, CommandRunner
from tests.fakes.pyslurm_fake import make_pyslurm
from tests.fixtures.slurm.shapes import RELEASES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


class ScriptedRunner(CommandRunner):
    """A `CommandRunner` whose commands are answered by ``answer(argv)`` instead of Slurm:
    (returncode, stdout, stderr). Every argv is recorded in ``argvs``."""

    def __init__(self, answer, **kw):
        super().__init__(max_retries=kw.pop("max_retries", 1), backoff_s=0, sleep=lambda s: None)
        self.answer = answer
        self.argvs: list[list[str]] = []

    def _once(self, argv, extra_env):
        self.rpc_count += 1
        self.argvs.append(list(argv))
        code, out, err = self.answer(list(argv))
        return CommandResult(tuple(argv), code, out, err)


def fixture_text(release: str) -> str:
    return (FIXTURES / f"squeue-{release}.json").read_text()


def nodes_doc(release: str) -> str:
    meta = json.loads(fixture_text(release))["meta"]
    if release == "22.05":
        node = {"name": "node1", "state": "mixed", "state_flags": [], "gres": "gpu:4",
                "gres_used": "gpu:2", "partitions": ["gpu"]}
    else:
        node = {"name": "node1", "state": ["MIXED"], "gres": "gpu:4", "gres_used": "gpu:2",
                "partitions": ["gpu"]}
    return json.dumps({"meta": meta, "errors": [], "nodes": [node]})


def slurm_of(release: str):
    """Answers as Slurm ``release`` would, from the fixtures."""
    version = ".".join(str(x) for x in RELEASES[release][1])

    def answer(argv):
        if argv[1:] == ["--version"]:
            return 0, f"slurm {version}\n", ""
        if argv[:3] == ["scontrol", "show", "config"]:
            return 0, f"SLURM_VERSION           = {version}\n", ""
        if argv[0] == "squeue":
            return 0, fixture_text(release), ""
        if argv[0] == "sinfo" or argv[-2:] == ["show", "nodes"]:
            return 0, nodes_doc(release), ""
        if argv[0] == "scontrol" and "show" in argv and "job" in argv:
            doc = json.loads(fixture_text(release))
            want = argv[-1]
            doc["jobs"] = [j for j in doc["jobs"] if str(j["job_id"]) == want]
            if not doc["jobs"]:
                return 1, "", "slurm_load_jobs error: Invalid job id specified"
            return 0, json.dumps(doc), ""
        if argv[:3] == ["scontrol", "show", "partition"]:
            return 0, "PartitionName=gpu Default=YES State=UP Nodes=node[1-4]\n", ""
        return 0, "", ""
    return answer


def cli(release: str, answer=None, **kw) -> tuple[CliSlurmClient, ScriptedRunner]:
    runner = ScriptedRunner(answer or slurm_of(release), **kw)
    return CliSlurmClient(runner=runner), runner


@pytest.mark.parametrize("release", [r for r in RELEASES if r != "22.05"])
def test_cli_commands_and_records_for_releases_not_on_this_machine(release):
    client, runner = cli(release)
    parser = RELEASES[release][0]
    pin = "--json" if release == "23.02" else f"--json={parser}"
    jobs = client.jobs()
    assert jobs == parse_jobs(json.loads(fixture_text("22.05")))  # same jobs, any shape
    assert runner.argvs[-1] == ["squeue", pin]
    assert client.job("23") == jobs[1]
    assert runner.argvs[-1] == ["scontrol", pin, "show", "job", "23"]
    assert client.job("999") is None
    assert client.nodes()[0].gpus_allocated == 2
    assert runner.argvs[-1] == ["scontrol", pin, "show", "nodes"]
    client.resize_pending("24", 3, 2)
    assert runner.argvs[-1] == ["scontrol", "update", "JobId=24", "NumNodes=3-3",
                                "TresPerNode=gres/gpu:2"]
    info = client.cluster()
    assert info.version_tuple == RELEASES[release][1] and info.default_partition == "gpu"


def test_cli_commands_for_22_05():
    client, runner = cli("22.05")
    client.jobs()
    assert runner.argvs[:2] == [["squeue", "--version"], ["squeue", "--json"]]
    client.nodes()
    assert runner.argvs[-1] == ["sinfo", "--json"]
    client.resize_pending("24", 3, 2)
    assert runner.argvs[-2:] == [["scontrol", "show", "config"],
                                 ["scontrol", "update", "JobId=24", "NumNodes=3-3",
                                  "TresPerNode=gres:gpu:2"]]
    client.shrink_running("23", 1)
    client.hold("24")
    client.release("24")
    client.cancel("23")
    assert runner.argvs[-4:] == [["scontrol", "update", "JobId=23", "NumNodes=1"],
                                 ["scontrol", "hold", "24"], ["scontrol", "release", "24"],
                                 ["scancel", "23"]]
    for target, extra in ((SignalTarget.BATCH, ["--batch"]), (SignalTarget.STEPS, []),
                          (SignalTarget.FULL, ["--full"])):
        client.signal("23", "USR1", target)
        assert runner.argvs[-1] == ["scancel", "--signal=USR1", *extra, "23"]


def test_start_now_waits_out_the_credential_of_a_fresh_requeue():
    client, runner = cli("22.05")
    waits = []
    runner.sleep = waits.append
    client.requeue_hold("23")
    client.start_now("23")
    assert runner.argvs[-2:] == [["scontrol", "requeuehold", "23"],
                                 ["scontrol", "update", "JobId=23", "StartTime=now"]]
    assert len(waits) == 1 and 1.5 < waits[0] <= 2.0
    client.start_now("23")  # not requeued by this client just now: no wait
    assert len(waits) == 1


def test_submit_builds_sbatch_options_and_passes_the_environment(tmp_path):
    seen = {}

    def answer(argv):
        seen["argv"] = argv
        return 0, "4242;gpucluster\n", ""
    client, runner = cli("22.05", answer)
    envs = []
    orig = runner._once
    runner._once = lambda argv, extra_env: (envs.append(extra_env), orig(argv, extra_env))[1]
    job_id = client.submit(SubmitRequest(script="train.sh", nodes=2, gpus_per_node=4,
                                         comment="malleable: min=4 $(rm -rf /)", name="resnet",
                                         output="/o/%j.out", workdir="/w", hold=True,
                                         env=(("MALLEABLE_SPEC", "x"),)))
    assert job_id == "4242"
    assert seen["argv"] == ["sbatch", "--parsable", "--nodes=2", "--gres=gpu:4", "--requeue",
                            "--hold", "--open-mode=append",
                            "--comment=malleable: min=4 $(rm -rf /)", "--job-name=resnet",
                            "--output=/o/%j.out", "--chdir=/w", str(Path("train.sh").resolve())]
    assert envs[-1] == {"MALLEABLE_SPEC": "x"}


def test_json_refused_falls_back_to_scontrol_text_with_a_log_line(caplog):
    line = (FIXTURES / "scontrol-jobs-22.05.txt").read_text()

    def answer(argv):
        if argv[1:] == ["--version"]:
            return 0, "slurm 22.05.8\n", ""
        if argv[0] == "squeue":
            return 1, "", "squeue: error: unable to load serializer plugin for application/json"
        return 0, line, ""
    client, runner = cli("22.05", answer)
    with caplog.at_level(logging.WARNING, logger="malleable.slurm.backend_cli"):
        jobs = client.jobs()
    assert "JSON output refused" in caplog.text
    assert runner.argvs[-1] == ["scontrol", "--all", "show", "job", "-d", "-o"]
    assert [j.job_id for j in jobs] == [j.job_id for j in parse_jobs(json.loads(
        fixture_text("22.05")))]
    client.jobs()
    assert runner.argvs[-1][0] == "scontrol"  # decided once


def test_document_with_errors_is_unavailable_not_an_empty_queue():
    down = json.dumps({"meta": json.loads(fixture_text("22.05"))["meta"], "jobs": [],
                       "errors": [{"error": "Unspecified error", "error_number": -1,
                                   "description": "Failed while looking for jobs",
                                   "source": "slurm_load_jobs"}]})
    client, runner = cli("22.05", lambda argv: (0, down, "") if argv[0] == "squeue"
                         and "--json" in argv else (0, "slurm 22.05.8", ""), max_retries=2)
    with pytest.raises(SlurmUnavailable, match="Failed while looking for jobs"):
        client.jobs()
    assert runner.argvs.count(["squeue", "--json"]) == 3


def test_one_bad_job_is_reported_in_parse_errors():
    doc = json.loads(fixture_text("24.11"))
    doc["jobs"][0]["job_state"] = ["NOT_A_STATE"]
    text = json.dumps(doc)
    client, _ = cli("24.11", lambda argv: (0, text, "") if argv[0] == "squeue"
                    else (0, "slurm 24.11.5", ""))
    jobs = client.jobs()
    assert len(jobs) == len(doc["jobs"]) - 1
    assert [e.field for e in client.parse_errors] == ["jobs[0].job_state"]


# ------------------------------------------------------------------ connect()

@pytest.fixture
def fake_pyslurm(monkeypatch):
    mod = make_pyslurm()
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    return mod


def with_controller(monkeypatch, version):
    monkeypatch.setattr(CliSlurmClient, "controller_version", lambda self: version)


def test_connect_picks_pyslurm_when_it_matches_the_controller(fake_pyslurm, monkeypatch):
    with_controller(monkeypatch, (25, 11, 2))
    client = connect(SlurmConfig())
    assert isinstance(client, PyslurmSlurmClient) and client.cluster().version == "25.11.2"


def test_connect_falls_back_to_cli_and_says_why(fake_pyslurm, monkeypatch, caplog):
    with_controller(monkeypatch, (22, 5, 8))
    with caplog.at_level(logging.INFO, logger="malleable.slurm"):
        client = connect(SlurmConfig())
    assert isinstance(client, CliSlurmClient)
    assert ("Slurm backend: cli, because pyslurm 25.11.0 is built for Slurm 25.11, "
            "slurmctld is 22.05.8") in caplog.text
    with pytest.raises(SlurmError, match="backend pyslurm configured but unusable"):
        connect(SlurmConfig(backend="pyslurm"))


def test_connect_without_pyslurm_or_with_an_old_one(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    with caplog.at_level(logging.INFO, logger="malleable.slurm"):
        assert isinstance(connect(SlurmConfig()), CliSlurmClient)
    assert "pyslurm does not import" in caplog.text
    old = make_pyslurm()
    old.__version__ = "24.5.1"
    monkeypatch.setitem(sys.modules, "pyslurm", old)
    with_controller(monkeypatch, (24, 5, 3))
    with caplog.at_level(logging.INFO, logger="malleable.slurm"):
        assert isinstance(connect(SlurmConfig()), CliSlurmClient)
    assert "older than 25.11" in caplog.text
    with pytest.raises(SlurmError, match="older than 25.11"):
        PyslurmSlurmClient(module=old)


def test_connect_cli_is_configurable_without_touching_pyslurm(fake_pyslurm, monkeypatch):
    def boom(self):
        raise AssertionError("cli must not ask the controller")
    monkeypatch.setattr(CliSlurmClient, "controller_version", boom)
    assert isinstance(connect(SlurmConfig(backend="cli")), CliSlurmClient)


# ------------------------------------------------------------------ pyslurm shapes

@pytest.mark.parametrize("value, gpus", [
    ({"gpu": 4}, 4), ({"gpu:a100": 2, "gpu:h100": 1}, 3), ({"gres/gpu": 4}, 4),
    ({"gres:gpu:a100": 2}, 2), ({"gpu": {"count": "4", "indexes": "0-3"}}, 4),
    ({"shard": 2}, None), ({}, None), (None, None),
])
def test_pyslurm_gres_dicts(value, gpus):
    assert _gpus_in_gres_dict(value, "x") == gpus


def test_pyslurm_job_record_for_array_and_het_and_bad_values():
    mod = make_pyslurm()
    client = PyslurmSlurmClient(module=mod, controller_version="25.11.0")
    job_id = client.submit(SubmitRequest(script="/x.sh", nodes=1, gpus_per_node=2))
    job = mod.Job(int(job_id))

    class ArrayTask:
        def __getattr__(self, name):
            return {"array_id": 40, "array_task_id": 3, "id": 43}.get(name, getattr(job, name))
    assert job_record(ArrayTask()).job_id == "40_3"

    class HetComponent(ArrayTask):
        def __getattr__(self, name):
            return {"heterogeneous_id": 50, "heterogeneous_offset": 1, "id": 51}.get(
                name, getattr(job, name))
    assert job_record(HetComponent()).job_id == "50+1"

    class Broken(ArrayTask):
        def __getattr__(self, name):
            return {"num_nodes": "two"}.get(name, getattr(job, name))
    with pytest.raises(SlurmParseError, match=r"num_nodes"):
        job_record(Broken())
    record = job_record(job)
    assert (record.gpus, record.gpus_per_node, record.node_count) == (2, 2, 1)
