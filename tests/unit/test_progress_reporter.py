"""The job-side reporter: environment, line format, signal flag, plan file, checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from malleable.config import ProgressConfig
from malleable.progress import reporter as rmod
from malleable.progress.reporter import (
    CheckpointError,
    Plan,
    Reporter,
    atomic_write,
    format_plan,
    gpus_per_node_from_env,
    job_id_from_env,
    read_checkpoint,
    write_checkpoint,
)

REPORTER_FILE = Path(rmod.__file__)


def lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def test_default_spool_matches_config_default():
    assert ProgressConfig().spool_dir == rmod.DEFAULT_SPOOL


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "17"}, "17"),
    ({"SLURM_JOB_ID": "19", "SLURM_ARRAY_JOB_ID": "17", "SLURM_ARRAY_TASK_ID": "2"}, "17_2"),
    ({"SLURM_JOBID": "5"}, "5"),
    ({}, None),
])
def test_job_id_from_env(env, expected):
    assert job_id_from_env(env) == expected


@pytest.mark.parametrize("env, gpus", [
    ({"SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": ""}, 2),
    ({"SLURM_JOB_GPUS": "0,1,3"}, 3),
    ({"SLURM_JOB_GPUS": "0-3"}, 4),
    ({"SLURM_TRES_PER_NODE": "gres/gpu:4"}, 4),
    ({"SLURM_TRES_PER_NODE": "cpu=2,gres:gpu:tesla:2"}, 2),
    ({"SLURM_GPUS_PER_NODE": "gpu:3"}, 3),
    ({"GPU_DEVICE_ORDINAL": "0,1"}, 2),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}, 6),
    ({}, 0),
    # Not counts, passed over (a tester: "²" passed str.isdigit and int() raised; a
    # reversed range counted -1 GPUs; 10**12 went into the line).
    ({"SLURM_GPUS_ON_NODE": "\u00b2", "SLURM_JOB_GPUS": "0,1"}, 2),
    ({"SLURM_GPUS_ON_NODE": "1000000000000", "SLURM_TRES_PER_NODE": "gres/gpu:\u0663"}, 0),
    ({"SLURM_JOB_GPUS": "3-1"}, 0),
    ({"SLURM_JOB_GPUS": "0-99999"}, 0),
    ({"GPU_DEVICE_ORDINAL": "0," + "9" * 5000}, 0),
])
def test_gpus_per_node_from_env(env, gpus):
    assert gpus_per_node_from_env(env) == gpus


def test_malformed_counts_in_the_environment_are_their_defaults():
    """Training must not stop over a report: nodes 1, restart 0 (never a traceback)."""
    for bad in ("\u0663", "9" * 5000, "-1", "0", "2000000", "1e2", "1_000"):
        assert rmod.nodes_from_env({"SLURM_JOB_NUM_NODES": bad, "SLURM_NNODES": "x"}) == 1
    assert rmod.nodes_from_env({"SLURM_JOB_NUM_NODES": "x", "SLURM_NNODES": " 3 "}) == 3
    for bad in ("\u0663", "9" * 5000, "-1", "2147483648", "1e2"):
        assert rmod.restart_count_from_env({"SLURM_RESTART_COUNT": bad}) == 0
    assert rmod.restart_count_from_env({"SLURM_RESTART_COUNT": "2147483647"}) == 2**31 - 1


@pytest.mark.parametrize("value", ["abc", "0", "-4", "\u00b2", "2147483648", "9" * 5000])
def test_a_malformed_batch_size_in_the_environment_is_an_error(tmp_path, value):
    """It was read as unset: the job logged no batch, and the daemon priced it at the
    spec's batch without a word."""
    env = {"SLURM_JOB_ID": "3", "MALLEABLE_BATCH_SIZE": value}
    with pytest.raises(ValueError, match=f"^MALLEABLE_BATCH_SIZE={value!r}: expected an "
                                         f"integer from 1 to 2147483647"):
        Reporter.from_env(env, spool_dir=tmp_path, install_handler=False)
    rep = Reporter.from_env({**env, "MALLEABLE_BATCH_SIZE": "  "}, spool_dir=tmp_path,
                            install_handler=False)
    assert rep.batch_size is None


def test_from_env_reads_slurm_and_writes_the_documented_line(tmp_path):
    env = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
           "CUDA_VISIBLE_DEVICES": "", "MALLEABLE_SPOOL": str(tmp_path),
           "MALLEABLE_BATCH_SIZE": "256"}
    clock = iter([100.0, 101.5, 102.0, 103.0])
    rep = Reporter.from_env(env, install_handler=False, clock=lambda: next(clock))
    assert (rep.job_id, rep.restart_count, rep.nodes, rep.gpus) == ("40_1", 2, 2, 8)
    assert rep.path == str(tmp_path / "40_1.jsonl")
    rep.started(1000, 256000)
    rep.log(1010, 258560, metric=0.5, grad_sqr=1.25, grad_var=3)
    rep.checkpointed(tmp_path / "ckpt")
    rep.finished()
    got = lines(rep.path)
    assert got[0] == {"v": 1, "t": 100.0, "job": "40_1", "event": "started", "step": 1000,
                      "samples": 256000, "gpus": 8, "nodes": 2, "batch": 256, "restart": 2}
    assert got[1] == {**got[0], "t": 101.5, "event": "progress", "step": 1010,
                      "samples": 258560, "metric": 0.5, "grad_sqr": 1.25, "grad_var": 3.0}
    assert got[2]["event"] == "checkpointed" and got[2]["step"] == 1010
    assert got[2]["path"] == str(tmp_path / "ckpt")
    assert got[3]["event"] == "finished" and got[3]["samples"] == 258560
    raw = Path(rep.path).read_bytes()
    assert raw.count(b"\n") == 4 and raw.endswith(b"\n")


def test_first_run_has_restart_zero_and_outside_slurm_is_an_error(tmp_path):
    rep = Reporter.from_env({"SLURM_JOB_ID": "3"}, spool_dir=tmp_path, install_handler=False)
    assert rep.restart_count == 0 and rep.nodes == 1
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        Reporter.from_env({}, spool_dir=tmp_path, install_handler=False)


def test_bad_arguments_raise_and_nan_metrics_are_left_out(tmp_path, capsys):
    rep = Reporter("9", tmp_path, install_handler=False)
    with pytest.raises(ValueError, match="batch_size"):
        rep.log(1, 1)
    with pytest.raises(TypeError, match="step"):
        rep.log(1.5, 1, batch_size=8)
    with pytest.raises(ValueError, match="samples"):
        rep.log(1, -1, batch_size=8)
    with pytest.raises(ValueError, match=r"step=9223372036854775808: too large; expected an "
                                         r"integer <= 9223372036854775807 \(2\*\*63 - 1\)"):
        rep.log(2**63, 1, batch_size=8)
    with pytest.raises(ValueError, match="job_id"):
        Reporter("../etc/passwd", tmp_path, install_handler=False)
    rep.log(2, 16, batch_size=8, metric=float("nan"), grad_var=float("inf"), grad_sqr=0.25)
    (line,) = lines(rep.path)
    assert "metric" not in line and "grad_var" not in line and line["grad_sqr"] == 0.25
    assert "not finite" in capsys.readouterr().err


def test_a_step_that_goes_back_is_written_with_one_warning(tmp_path, capsys):
    """The daemon rejects it (decreasing_step); the reporter never stops training, so it
    writes the line and says so once. A started() line may go back (a reload)."""
    rep = Reporter("9", tmp_path, install_handler=False)
    rep.log(5, 40, batch_size=8)
    rep.log(3, 10)
    rep.log(2, 8)
    rep.started(1, 8)
    assert [x["step"] for x in lines(rep.path)] == [5, 3, 2, 1]
    err = capsys.readouterr().err
    assert err.count("go back within a run") == 1
    assert "step=3, samples=10 after step=5, samples=40: the daemon rejects" in err


def test_a_relative_spool_is_warned_about(tmp_path, capsys, monkeypatch):
    """`malleable report` refuses a relative MALLEABLE_SPOOL; the reporter (which never
    stops training) used it silently, relative to wherever the job runs."""
    monkeypatch.chdir(tmp_path)
    rep = Reporter.from_env({"SLURM_JOB_ID": "7", "MALLEABLE_SPOOL": "rel/spool"},
                            install_handler=False)
    assert rep.path == os.path.join("rel/spool", "7.jsonl")
    err = capsys.readouterr().err
    assert f"spool 'rel/spool' is a relative path: lines go to {tmp_path}/rel/spool/7.jsonl" \
        in err


def test_numpy_and_other_integral_counts_are_written_as_plain_ints(tmp_path):
    """np.int64 (what a numpy or torch training loop holds) raised TypeError; any
    object with __index__ is an integer now, and the line is the same as for an int.
    Floats (even 10.0), bools and strings are still refused."""
    import numpy as np

    class Steps:
        def __index__(self) -> int:
            return 40

    class BoolTensor:                   # torch.tensor(True): __index__ gives 1
        dtype = "torch.bool"

        def __index__(self) -> int:
            return 1

    def written(tmp: Path, *calls) -> bytes:
        rep = Reporter("9", tmp, install_handler=False, clock=lambda: 100.0)
        for step, samples, batch in calls:
            rep.log(step, samples, batch_size=batch, metric=0.5)
        rep.checkpointed(tmp / "ck")
        return Path(rep.path).read_bytes()

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ints = written(tmp_path / "a", (30, 960, 32), (40, 1280, 32))
    numpy = written(tmp_path / "b", (np.int64(30), np.int64(960), np.int64(32)),
                    (Steps(), np.uint32(1280), None))
    assert numpy.replace(str(tmp_path / "b").encode(), b"") == \
        ints.replace(str(tmp_path / "a").encode(), b"")
    assert [(x["step"], x["samples"], x["batch"]) for x in lines(tmp_path / "b" / "9.jsonl")] \
        == [(30, 960, 32), (40, 1280, 32), (40, 1280, 32)]
    rep = Reporter("9", tmp_path, batch_size=8, install_handler=False)
    for value in (1.5, 10.0, True, "10", np.float64(10.0), np.True_, np.array([3]),
                  BoolTensor()):
        with pytest.raises(TypeError, match=r"step=.*: expected an int"):
            rep.log(value, 8)
    with pytest.raises(ValueError, match=r"samples=np.int64\(-1\): expected an integer >= 0"):
        rep.log(1, np.int64(-1))
    with pytest.raises(ValueError, match="batch_size"):
        rep.log(1, 8, batch_size=np.float64(8.0))
    assert not (tmp_path / "9.jsonl").exists()


def test_signal_sets_checkpoint_requested_and_chains(tmp_path):
    seen = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        rep = Reporter("5", tmp_path, signal="SIGUSR2")
        assert not rep.checkpoint_requested
        os.kill(os.getpid(), signal.SIGUSR2)
        assert rep.checkpoint_requested
        assert seen == [signal.SIGUSR2]
        rep.clear_checkpoint_request()
        assert not rep.checkpoint_requested
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_unwritable_or_foreign_progress_file_drops_lines_with_one_warning(tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "7.jsonl").symlink_to(target)
    rep = Reporter("7", tmp_path, batch_size=4, install_handler=False)
    rep.log(1, 4)
    rep.log(2, 8)
    assert rep.dropped == 2 and target.read_text() == ""
    assert capsys.readouterr().err.count("cannot write progress") == 1
    # A spool that does not exist yet is created (the user's own MALLEABLE_SPOOL).
    rep = Reporter("8", tmp_path / "new" / "spool", batch_size=4, install_handler=False)
    rep.log(1, 4)
    assert lines(rep.path)[0]["step"] == 1


def test_a_torn_last_line_is_ended_before_the_next_line(tmp_path):
    """A writer killed mid-line leaves a fragment without a newline: the next line is
    written after a newline, so ingestion rejects the fragment alone and reads the new
    line whole (before, the two made one line rejected as not_json)."""
    from malleable.progress.lines import LineValidator, ProgressRecord, Reason, split_lines
    rep = Reporter("9", tmp_path, batch_size=4, install_handler=False)
    rep.log(1, 4)
    whole = Path(rep.path).read_bytes()
    Path(rep.path).write_bytes(whole + whole[:25])          # the torn second line
    rep2 = Reporter("9", tmp_path, batch_size=4, restart_count=1, install_handler=False)
    rep2.started(1, 4)
    got, rest = split_lines(Path(rep.path).read_bytes())
    assert rest == b""
    v = LineValidator("9")
    results = [v.feed(x, now=1e12) for x in got]
    assert [type(r).__name__ for r in results] == ["ProgressRecord", "Rejection",
                                                   "ProgressRecord"]
    assert results[1].reason is Reason.NOT_JSON
    assert isinstance(results[2], ProgressRecord) and results[2].event == "started"
    rep2.log(2, 8)                                          # a whole file: nothing added
    assert Path(rep.path).read_bytes().count(b"\n") == 4


def test_concurrent_appends_never_interleave(tmp_path):
    """Eight processes append 200 lines each to one file: every line stays whole."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from reporter import Reporter\n"
            "r = Reporter('77', sys.argv[2], batch_size=8, install_handler=False)\n"
            "for i in range(200): r.log(i, i * 8, metric=float(sys.argv[3]))\n")
    shutil.copy(REPORTER_FILE, tmp_path / "reporter.py")
    procs = [subprocess.Popen([sys.executable, "-I", "-S", "-c", code, str(tmp_path),
                               str(tmp_path / "spool"), str(w)]) for w in range(8)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    got = lines(tmp_path / "spool" / "77.jsonl")
    assert len(got) == 1600
    for w in range(8):
        steps = [x["step"] for x in got if x["metric"] == w]
        assert steps == list(range(200))


def test_reporter_imports_with_the_standard_library_alone(tmp_path):
    """Copied next to a script, in an isolated interpreter without site-packages."""
    shutil.copy(REPORTER_FILE, tmp_path / "reporter.py")
    code = ("import importlib.util, sys; sys.path.insert(0, sys.argv[1])\n"
            "assert importlib.util.find_spec('click') is None  # really no site-packages\n"
            "import reporter\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('malleable', 'click', 'numpy', 'sqlalchemy', 'torch'))\n"
            "assert not bad, bad\n"
            "r = reporter.Reporter('1', sys.argv[1] + '/spool', batch_size=2)\n"
            "r.log(1, 2)\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    # And as part of the package, from a source tree with no dependencies on sys.path.
    root = Path(rmod.__file__).parents[2]
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import malleable.progress.reporter as r\n"
            "assert 'click' not in sys.modules and 'numpy' not in sys.modules\nprint(r.FORMAT_VERSION)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(root)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def write_plan_file(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc))


def test_plan_gives_recommended_batch_for_the_current_size(tmp_path):
    rep = Reporter("12", tmp_path, gpus=4, nodes=1, install_handler=False)
    assert rep.plan is None and rep.recommended_batch_size is None
    (tmp_path / "12.plan.json").write_bytes(
        format_plan(Plan(job="12", t=5.0, gpus=4, nodes=1, batch=512)))
    rep = Reporter("12", tmp_path, gpus=4, nodes=1, install_handler=False)
    assert rep.plan == Plan(job="12", t=5.0, gpus=4, nodes=1, batch=512)
    assert rep.recommended_batch_size == 512
    # A plan made for another size does not apply to this run.
    rep = Reporter("12", tmp_path, gpus=2, nodes=1, install_handler=False)
    assert rep.plan.gpus == 4 and rep.recommended_batch_size is None


@pytest.mark.parametrize("doc", [
    {"v": 2, "job": "12", "t": 1, "gpus": 4, "nodes": 1, "batch": 8},
    {"v": 1, "job": "13", "t": 1, "gpus": 4, "nodes": 1, "batch": 8},
    {"v": 1, "job": "12", "t": 1, "gpus": 0, "nodes": 1, "batch": 8},
    {"v": 1, "job": "12", "t": 1, "gpus": 4, "nodes": 1, "batch": "8"},
    [1, 2],
])
def test_unusable_plans_are_ignored_with_a_warning(tmp_path, doc, capsys):
    write_plan_file(tmp_path / "12.plan.json", doc)
    rep = Reporter("12", tmp_path, gpus=4, install_handler=False)
    assert rep.plan is None and rep.recommended_batch_size is None
    assert "ignoring" in capsys.readouterr().err


def test_plan_from_another_user_is_ignored(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a file owned by another uid")
    os.chmod(tmp_path, 0o755)
    p = tmp_path / "12.plan.json"
    p.write_bytes(format_plan(Plan(job="12", t=5.0, gpus=4, nodes=1, batch=512)))
    os.chown(p, 4242, 4242)
    rep = Reporter("12", tmp_path, gpus=4, install_handler=False)
    assert rep.plan is None
    assert "uid 4242" in capsys.readouterr().err


def test_checkpoint_round_trip_and_damage_detected(tmp_path):
    p = tmp_path / "model.ckpt"
    assert read_checkpoint(p) is None
    write_checkpoint(p, b"state-1" * 1000)
    write_checkpoint(p, b"state-2" * 1000)
    assert read_checkpoint(p) == b"state-2" * 1000
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert [x.name for x in tmp_path.iterdir()] == ["model.ckpt"]
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(p)
    p.write_bytes(data[:-1] + b"X")
    with pytest.raises(CheckpointError, match="checksum"):
        read_checkpoint(p)
    p.write_bytes(b"plain file")
    with pytest.raises(CheckpointError, match="not a malleable checkpoint"):
        read_checkpoint(p)


def test_killed_mid_save_keeps_the_previous_checkpoint(tmp_path):
    """SIGKILL while a slow save is writing its temporary file: the old checkpoint stays."""
    shutil.copy(REPORTER_FILE, tmp_path / "reporter.py")
    p = tmp_path / "c.ckpt"
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import reporter as r\n"
            "r.write_checkpoint(sys.argv[2], b'old' * 1000)\n"
            "def slow(done, total):\n"
            "    print(done, flush=True); time.sleep(30)\n"
            "r.write_checkpoint(sys.argv[2], b'new' * 100000, chunk_size=1000, on_chunk=slow)\n")
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, str(tmp_path), str(p)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1000"   # the new save is under way
    proc.kill()
    proc.wait(timeout=30)
    assert read_checkpoint(p) == b"old" * 1000
    assert any(x.name.endswith(".tmp") for x in tmp_path.iterdir())  # the torn temp file
    write_checkpoint(p, b"next")
    assert read_checkpoint(p) == b"next"
    assert not any(x.name.endswith(".tmp") for x in tmp_path.iterdir())


def test_stale_temporary_files_go_and_the_directory_is_listed_once(tmp_path, monkeypatch):
    """A dead writer's ``.<name>.<pid>.tmp`` is removed by the next write of that name;
    other names' temporary files stay until their own write; and a directory is listed
    once per process, not on every write (a spool holds a file per job)."""
    for i in range(50):
        (tmp_path / f"{i}.jsonl").write_text("")
    (tmp_path / ".a.plan.json.999999.tmp").write_text("torn")   # a killed writer's
    (tmp_path / ".b.plan.json.999999.tmp").write_text("torn")
    listed = []
    real = os.listdir
    monkeypatch.setattr(rmod.os, "listdir", lambda d: listed.append(d) or real(d))
    for i in range(5):
        atomic_write(tmp_path / "a.plan.json", f"{i}".encode())
    assert (tmp_path / "a.plan.json").read_text() == "4"
    assert not (tmp_path / ".a.plan.json.999999.tmp").exists()
    assert (tmp_path / ".b.plan.json.999999.tmp").exists()   # not this write's name
    atomic_write(tmp_path / "b.plan.json", b"b")
    assert not (tmp_path / ".b.plan.json.999999.tmp").exists()
    assert listed == [str(tmp_path)]
    assert sorted(p.name for p in tmp_path.glob(".*")) == []


def test_daemon_writes_a_plan_the_reporter_reads(tmp_path):
    from malleable.progress.plan import write_plan
    (tmp_path / "elsewhere").write_text("keep")
    (tmp_path / "21.plan.json").symlink_to(tmp_path / "elsewhere")
    path = write_plan(tmp_path, Plan(job="21", t=1.0, gpus=8, nodes=2, batch=None))
    assert (tmp_path / "elsewhere").read_text() == "keep"    # the symlink was replaced
    assert not os.path.islink(path)
    rep = Reporter("21", tmp_path, gpus=8, nodes=2, install_handler=False)
    assert rep.plan == Plan(job="21", t=1.0, gpus=8, nodes=2, batch=None)
    assert rep.recommended_batch_size is None
    with pytest.raises(ValueError, match="job_id"):
        write_plan(tmp_path, Plan(job="../x", t=1.0, gpus=1, nodes=1, batch=1))


def test_wait_for_requeue_without_a_requeue_lets_training_go_on(tmp_path):
    rep = Reporter("3", tmp_path, install_handler=False)
    rep.request_checkpoint()
    assert rep.checkpoint_requested
    rep.wait_for_requeue(0.01)
    assert not rep.checkpoint_requested


def test_finished_ignores_a_late_checkpoint_signal(tmp_path):
    # A checkpoint request that reaches a job while it exits must not kill it (Python
    # restores the default action, "terminate", during its shutdown): after finished()
    # the signal is ignored. A subprocess, so that this process keeps its handlers.
    code = (
        "import os, signal, sys\n"
        "from malleable.progress.reporter import Reporter\n"
        f"rep = Reporter('7', {str(tmp_path)!r})\n"
        "rep.started(0, 0, batch_size=8)\n"
        "rep.finished(step=1, samples=8)\n"
        "assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "sys.exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert [x["event"] for x in lines(tmp_path / "7.jsonl")] == ["started", "finished"]


@pytest.mark.parametrize("env", [{"SLURM_JOB_ID": "1\n2"}, {"SLURM_JOB_ID": "12a"},
                                 {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "5",
                                  "SLURM_ARRAY_TASK_ID": "\u00b2"}])
def test_a_job_id_slurm_never_gives_is_an_error(tmp_path, env):
    """'1\\n2' and '5_²' made progress files the daemon never reads (a tester)."""
    with pytest.raises(ValueError, match=r"^job id .*: expected a Slurm job id such as 123"):
        Reporter.from_env(env, spool_dir=tmp_path, install_handler=False)
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_count_in_the_environment_is_said_once(tmp_path, capsys):
    """Read as its default (training must not stop), but no longer silently: a restart
    count of 0 after a requeue gets the job's lines refused as stale (a tester)."""
    env = {"SLURM_JOB_ID": "3", "SLURM_RESTART_COUNT": "\u00b2", "SLURM_NNODES": "0",
           "SLURM_GPUS_ON_NODE": "9" * 5000}
    rep = Reporter.from_env(env, spool_dir=tmp_path, install_handler=False)
    assert (rep.restart_count, rep.nodes, rep.gpus) == (0, 1, 0)
    err = capsys.readouterr().err.splitlines()
    assert "malleable reporter: SLURM_RESTART_COUNT='\u00b2' is not a count from 0 to " \
        "2147483647: ignored (using restart 0)" in err
    assert "malleable reporter: SLURM_NNODES='0' is not a count from 1 to 1048576: ignored " \
        "(using 1 node(s))" in err
    assert any(x.startswith("malleable reporter: SLURM_GPUS_ON_NODE='99999999999999999999... "
                            "(5000 characters)'") for x in err)
    Reporter.from_env({"SLURM_JOB_ID": "3", "SLURM_RESTART_COUNT": "0", "SLURM_NNODES": "2",
                       "SLURM_GPUS_ON_NODE": "0"}, spool_dir=tmp_path, install_handler=False)
    assert capsys.readouterr().err == ""
