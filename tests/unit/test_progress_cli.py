"""`malleable report ...`: the shell-friendly reporter writes what the Python one writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.progress.lines import LineValidator, ProgressRecord, Rejection


def run(args, env):
    return CliRunner().invoke(main, ["report", *args], env=env)


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_shell_jobs_lifecycle(tmp_path):
    env = {"SLURM_JOB_ID": "31", "SLURM_ARRAY_JOB_ID": "30", "SLURM_ARRAY_TASK_ID": "4",
           "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2",
           "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}
    assert run(["started", "--step", "100", "--samples", "6400", "--batch", "64"],
               env).exit_code == 0
    assert run(["progress", "--step", "110", "--samples", "7040", "--metric", "0.5",
                "--grad-sqr", "1", "--grad-var", "2"], env).exit_code == 0
    assert run(["checkpointed", str(tmp_path / "ck")], env).exit_code == 0
    assert run(["finished"], env).exit_code == 0
    got = read(tmp_path / "30_4.jsonl")
    assert [g["event"] for g in got] == ["started", "progress", "checkpointed", "finished"]
    assert all(g["batch"] == 64 and g["gpus"] == 2 and g["restart"] == 1 for g in got)
    assert got[1]["metric"] == 0.5 and got[1]["grad_var"] == 2.0
    assert got[2]["step"] == 110 and got[2]["samples"] == 7040  # from the last line
    assert got[2]["path"] == str(tmp_path / "ck")
    assert got[3]["step"] == 110
    v = LineValidator("30_4")
    assert all(isinstance(v.feed(line, 2e9), ProgressRecord)
               for line in (tmp_path / "30_4.jsonl").read_bytes().splitlines())


def test_bad_input_exits_2_with_one_line(tmp_path):
    env = {"SLURM_JOB_ID": "5", "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}
    no_batch = run(["progress", "--step", "1", "--samples", "2"], env)
    assert no_batch.exit_code == 2
    assert no_batch.output.strip().splitlines() == [
        "malleable report: error: --batch: the global batch size is not known yet "
        "(give --batch or set MALLEABLE_BATCH_SIZE)"]
    outside = run(["started", "--batch", "4"], {"SLURM_JOB_ID": "", "SLURM_JOBID": "",
                                                "SLURM_ARRAY_JOB_ID": ""})
    assert outside.exit_code == 2 and "SLURM_JOB_ID is not set" in outside.output
    nan = run(["progress", "--step", "1", "--samples", "2", "--batch", "4", "--metric", "nan"],
              env)
    assert nan.exit_code == 2 and "not a finite number" in nan.output
    big = run(["progress", "--step", "1", "--samples", "2", "--batch", "4", "--grad-sqr",
               "1e400"], env)                   # named as given, not as the inf it became
    assert big.exit_code == 2 and "'--grad-sqr': 1e400: not a finite number" in big.output
    neg = run(["progress", "--step", "-1", "--samples", "2", "--batch", "4"], env)
    assert neg.exit_code == 2
    assert not (tmp_path / "5.jsonl").exists()


def test_unwritable_progress_file_exits_1(tmp_path):
    (tmp_path / "6.jsonl").symlink_to(tmp_path / "other")
    res = run(["started", "--batch", "4"], {"SLURM_JOB_ID": "6", "MALLEABLE_SPOOL": str(tmp_path)})
    assert res.exit_code == 1
    assert not (tmp_path / "other").exists()


def test_console_script(tmp_path):
    exe = Path(sys.executable).parent / "malleable"
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "8", "MALLEABLE_SPOOL": str(tmp_path)}
    proc = subprocess.run([str(exe), "report", "started", "--batch", "16"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert read(tmp_path / "8.jsonl")[0]["batch"] == 16


# The time of lines written by hand: after those `report` writes in a test (stamped
# now), as a run's time never goes back.
HAND_T = float(int(time.time()) + 86400)


def line(step: int, *, event: str = "progress", restart: int = 0, job: str = "40",
         samples: int | None = None, t: float = HAND_T) -> bytes:
    doc = {"v": 1, "t": t, "job": job, "event": event, "step": step,
           "samples": step * 8 if samples is None else samples, "gpus": 1, "nodes": 1,
           "batch": 8, "restart": restart}
    if event == "checkpointed":
        doc["path"] = "/scratch/40.ckpt"
    return (json.dumps(doc) + "\n").encode()


def step_env(tmp_path, restart: int = 0) -> dict:
    return {"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "", "SLURM_RESTART_COUNT": str(restart),
            "MALLEABLE_SPOOL": str(tmp_path), "MALLEABLE_BATCH_SIZE": ""}


def progress_at(step: int, env: dict, *extra: str):
    return run(["progress", "--step", str(step), "--samples", str(step * 8), *extra], env)


def ingested_steps(path: Path) -> list[int | str]:
    """What ingestion makes of the file: each line's step, or its rejection reason."""
    v = LineValidator("40")
    return [r.step if isinstance(r, ProgressRecord) else r.reason.value
            for r in (v.feed(x, 2e9) for x in path.read_bytes().splitlines())]


def test_progress_below_the_runs_last_step_is_refused_and_nothing_written(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    assert run(["started", "--batch", "8"], env).exit_code == 0
    assert progress_at(120, env).exit_code == 0
    before = path.read_bytes()
    res = progress_at(90, env)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        f"malleable report: error: --step=90: below step 120 of this run's last line in "
        f"{path} (the daemon would reject it as decreasing_step)"]
    assert path.read_bytes() == before
    # A checkpointed line counts too; and the step is that of the last line ingestion
    # accepts: a line it rejects (90 after 120, written by hand) does not lower it.
    path.write_bytes(before + line(130, event="checkpointed") + line(90))
    assert ingested_steps(path) == [0, 120, 130, "decreasing_step"]
    res = progress_at(100, env)
    assert res.exit_code == 2 and "below step 130 of this run's last line" in res.stderr
    # A large file: only its tail is read, and still decides.
    path.write_bytes(b"".join(line(s) for s in range(2000)))
    assert path.stat().st_size > 4 * 64 * 1024
    before = path.read_bytes()
    res = progress_at(1500, env)
    assert res.exit_code == 2 and "below step 1999 " in res.stderr
    assert path.read_bytes() == before


def test_progress_at_an_equal_or_higher_step_is_written(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    assert run(["started", "--step", "100", "--samples", "800", "--batch", "8"],
               env).exit_code == 0
    assert progress_at(100, env).exit_code == 0     # equal: ingestion accepts it
    assert progress_at(120, env).exit_code == 0
    assert progress_at(120, env).exit_code == 0
    assert ingested_steps(path) == [100, 100, 120, 120]


def test_a_new_restart_or_a_started_line_resets_the_step(tmp_path):
    path = tmp_path / "40.jsonl"
    run0, run1 = step_env(tmp_path, 0), step_env(tmp_path, 1)
    assert run(["started", "--batch", "8"], run0).exit_code == 0
    assert progress_at(120, run0).exit_code == 0
    assert progress_at(90, run1).exit_code == 0     # requeued: resumed from an older checkpoint
    res = progress_at(80, run1)                     # ... but within run 1 the step rises
    assert res.exit_code == 2 and "below step 90 " in res.stderr
    assert run(["started", "--step", "50", "--samples", "400"], run1).exit_code == 0
    assert progress_at(60, run1).exit_code == 0     # reloaded a checkpoint without a requeue
    assert ingested_steps(path) == [0, 120, 90, 50, 60]


def test_the_files_batch_wins_over_the_submit_time_variable(tmp_path):
    """`malleable submit --batch 64` sets MALLEABLE_BATCH_SIZE=64; a job that reports
    `started --batch 256` and then `progress` without --batch ran at 256, but its
    lines said 64, and its ETA was 4x short (a helper on the harness)."""
    env = {**step_env(tmp_path), "MALLEABLE_BATCH_SIZE": "64"}
    path = tmp_path / "40.jsonl"
    assert run(["started", "--batch", "256"], env).exit_code == 0
    assert progress_at(10, env).exit_code == 0
    assert [json.loads(x)["batch"] for x in path.read_bytes().splitlines()] == [256, 256]
    (tmp_path / "40.jsonl").unlink()
    assert run(["started"], env).exit_code == 0        # nothing in the file: the variable
    assert json.loads(path.read_bytes().splitlines()[-1])["batch"] == 64


def test_a_torn_last_line_or_an_empty_file_is_tolerated(tmp_path):
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    path.write_bytes(b"")
    assert progress_at(5, env, "--batch", "8").exit_code == 0
    torn = line(120)[:40]                           # a writer died mid-line
    path.write_bytes(torn)
    assert progress_at(5, env, "--batch", "8").exit_code == 0
    path.write_bytes(line(120) + torn)
    res = progress_at(90, env)                      # the torn line is skipped, not fatal
    assert res.exit_code == 2 and "below step 120 " in res.stderr
    assert path.read_bytes() == line(120) + torn
    assert progress_at(130, env).exit_code == 0


# --- every subcommand's line is judged as the daemon judges it ------------------------------

def session_env(tmp_path) -> dict:
    return {"SLURM_JOB_ID": "8", "SLURM_ARRAY_JOB_ID": "", "SLURM_GPUS_ON_NODE": "2",
            "SLURM_RESTART_COUNT": "", "MALLEABLE_SPOOL": str(tmp_path),
            "MALLEABLE_BATCH_SIZE": ""}


def ingested(path: Path, job: str) -> list[tuple[str, int, int] | str]:
    """Each line as ingestion takes it: (event, step, samples), or its rejection reason."""
    v = LineValidator(job)
    return [(r.event, r.step, r.samples) if isinstance(r, ProgressRecord) else r.reason.value
            for r in (v.feed(x, 2e9) for x in path.read_bytes().splitlines())]


def refused(res, message: str) -> None:
    """Exit 2 with exactly one line, ``malleable report: error: <message>``, on stderr."""
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.exception
    assert res.stdout == ""
    assert res.stderr.splitlines() == [f"malleable report: error: {message}"]


def test_the_testers_session_fewer_samples_are_refused_by_every_subcommand(tmp_path):
    """The new-user tester's session: samples going back were written with exit 0 by
    progress, checkpointed and finished, and the daemon rejected them all."""
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env).exit_code == 0
    assert run(["progress", "--step", "10", "--samples", "640"], env).exit_code == 0
    before = path.read_bytes()
    why = f"of this run's last line in {path} (the daemon would reject it as decreasing_samples)"
    refused(run(["progress", "--step", "20", "--samples", "100"], env),
            f"--samples=100: below samples 640 {why}")
    refused(run(["checkpointed", "/x.pt", "--samples", "100"], env),
            f"--samples=100: below samples 640 {why}")
    refused(run(["finished", "--samples", "5"], env), f"--samples=5: below samples 640 {why}")
    refused(run(["finished", "--step", "9"], env),
            f"--step=9: below step 10 of this run's last line in {path} (the daemon would "
            f"reject it as decreasing_step)")
    assert path.read_bytes() == before
    assert run(["checkpointed", "/x.pt"], env).exit_code == 0
    assert run(["finished"], env).exit_code == 0
    assert ingested(path, "8") == [("started", 0, 0), ("progress", 10, 640),
                                   ("checkpointed", 10, 640), ("finished", 10, 640)]


def test_defaults_come_from_the_last_accepted_line_not_the_last_line(tmp_path):
    """A line the daemon rejects (written by hand, or by an older malleable) sets no
    default: checkpointed and finished take the step and samples of the last line
    ingestion accepts (before, the rejected line's, so they were rejected too)."""
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env).exit_code == 0
    assert run(["progress", "--step", "10", "--samples", "640"], env).exit_code == 0
    bad = json.loads(path.read_text().splitlines()[-1]) | {"step": 20, "samples": 100}
    with path.open("a") as fh:
        fh.write(json.dumps(bad) + "\n")
    assert ingested(path, "8")[-1] == "decreasing_samples"
    assert run(["checkpointed", "/x.pt"], env).exit_code == 0
    assert run(["finished"], env).exit_code == 0
    got = read(path)
    assert [(g["event"], g["step"], g["samples"], g["batch"]) for g in got[-2:]] == [
        ("checkpointed", 10, 640, 64), ("finished", 10, 640, 64)]
    assert ingested(path, "8")[-2:] == [("checkpointed", 10, 640), ("finished", 10, 640)]


def test_a_value_out_of_the_formats_range_is_refused(tmp_path):
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    big = "99999999999999999999"
    limit = "above 9223372036854775807 (2**63 - 1), the largest integer a line may hold"
    refused(run(["started", "--batch", big], env),
            f"--batch={big}: {limit} (the daemon would reject it as bad_value)")
    assert not path.exists()
    assert run(["started", "--batch", "64"], env).exit_code == 0
    before = path.read_bytes()
    refused(run(["finished", "--samples", big], env),
            f"--samples={big}: {limit} (the daemon would reject it as bad_value)")
    assert path.read_bytes() == before


@pytest.mark.parametrize("job", ["abc", "123_", "j" * 70, "1" * 70, "12+0", "-5", "007",
                                 "0", "12_04", "1\n2"])
def test_a_job_id_squeue_would_not_show_is_refused(tmp_path, job):
    """The daemon reads <spool>/<id>.jsonl by the id squeue shows (123, 123_4): a line
    under another name would never be read (from the new-user helper: --job abc passed;
    a tester: 007 and 0 passed, and '1\\n2' made a two-line error)."""
    res = run(["progress", "--step", "1", "--samples", "1", "--batch", "8", "--job", job],
              session_env(tmp_path))
    shown = job if len(job) <= 60 else f"{job[:40]}... ({len(job)} characters)"
    refused(res, f"--job={shown!r}: expected a Slurm job id such as 123 or 123_4 (the daemon "
                 f"reads <spool>/<id>.jsonl by the id squeue shows)")
    assert list(tmp_path.iterdir()) == []
    res = run(["started", "--batch", "8", "--job", "123_4"], session_env(tmp_path))
    assert res.exit_code == 0 and (tmp_path / "123_4.jsonl").exists()
    res = run(["started", "--batch", "8", "--job", "120_0"], session_env(tmp_path))
    assert res.exit_code == 0 and (tmp_path / "120_0.jsonl").exists()


def test_a_huge_step_or_a_long_path_is_one_error_line_not_a_traceback(tmp_path):
    """Both raised ValueError from the reporter (a traceback, exit 1)."""
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env).exit_code == 0
    before = path.read_bytes()
    huge = "99999999999999999999999"
    refused(run(["progress", "--step", huge, "--samples", "100"], env),
            f"--step={huge}: above 9223372036854775807 (2**63 - 1), the largest integer a "
            f"line may hold (the daemon would reject it as bad_value)")
    long_path = "/" + "a" * 5000
    res = run(["checkpointed", long_path], env)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.exception
    (error,) = res.stderr.splitlines()
    assert re.fullmatch(rf"malleable report: error: PATH=/{'a' * 39}\.\.\. \(5001 characters\): "
                        r"the line would be 51\d\d bytes, more than 4096 \(the daemon would "
                        r"reject it as too_long\)", error), error
    assert path.read_bytes() == before


def test_a_restart_count_below_the_files_is_refused(tmp_path):
    """A line of restart 1 (Slurm's count 0, plus one: the daemon accepts it) cannot be
    followed by restart 0."""
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env | {"SLURM_RESTART_COUNT": "1"}).exit_code == 0
    before = path.read_bytes()
    for args in (["started"], ["progress", "--step", "5", "--samples", "320"],
                 ["checkpointed", "/x.pt"], ["finished"]):
        refused(run(args, env), f"SLURM_RESTART_COUNT=0: below restart 1 of a line already "
                                f"in {path} (the daemon would reject it as stale_restart)")
    assert path.read_bytes() == before


def test_a_line_above_this_runs_restart_count_does_not_lock_the_job_out(tmp_path):
    """A line of restart 5 written while SLURM_RESTART_COUNT is 0 (set by hand; the
    daemon rejects it as future_restart) made every later call of the real run fail as
    stale_restart, though the daemon accepts those lines (a tester on the harness)."""
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env).exit_code == 0
    assert run(["progress", "--step", "20", "--samples", "1280"],
               env | {"SLURM_RESTART_COUNT": "5"}).exit_code == 0
    res = run(["progress", "--step", "30", "--samples", "1920"], env)
    assert res.exit_code == 0, res.stderr
    v = LineValidator("8", max_restart=1)    # the daemon, Slurm's count 0
    assert [r.reason.value if isinstance(r, Rejection) else r.step
            for r in (v.feed(x, 2e9) for x in path.read_bytes().splitlines())] == [
        0, "future_restart", 30]


def test_a_clock_ahead_of_the_daemons_is_not_refused(tmp_path, monkeypatch):
    """future_time depends on the daemon's clock, not the node's: never judged here."""
    from malleable.progress.reporter import Reporter
    from_env = Reporter.from_env.__func__
    monkeypatch.setattr(Reporter, "from_env", classmethod(
        lambda cls, *a, **kw: from_env(cls, *a, **(kw | {"clock": lambda: 4e9}))))
    env, path = session_env(tmp_path), tmp_path / "8.jsonl"
    assert run(["started", "--batch", "64"], env).exit_code == 0
    assert run(["progress", "--step", "1", "--samples", "64"], env).exit_code == 0
    assert [g["t"] for g in read(path)] == [4e9, 4e9]
    assert ingested(path, "8") == ["future_time", "future_time"]   # the daemon at t=2e9


def test_a_last_line_without_its_newline_is_judged_as_the_line_it_becomes(tmp_path):
    """The reporter ends an unterminated last line before its own, so ingestion reads
    that line too: a whole line missing only its newline counts for the order."""
    env, path = step_env(tmp_path), tmp_path / "40.jsonl"
    path.write_bytes(line(120, t=1.7e9).rstrip(b"\n"))     # (before `report`'s lines)
    res = progress_at(90, env)
    assert res.exit_code == 2 and "below step 120 " in res.stderr
    assert path.read_bytes() == line(120, t=1.7e9).rstrip(b"\n")
    assert progress_at(130, env).exit_code == 0
    assert ingested_steps(path) == [120, 130]


@pytest.mark.parametrize("name, value, bounds", [
    ("SLURM_RESTART_COUNT", "abc", "0 to 2147483647"),
    ("SLURM_RESTART_COUNT", "-1", "0 to 2147483647"),
    ("SLURM_GPUS_ON_NODE", "abc", "0 to 65536"), ("SLURM_JOB_NUM_NODES", "0", "1 to 1048576"),
    ("MALLEABLE_BATCH_SIZE", "-5", "1 to 2147483647"),
    ("MALLEABLE_BATCH_SIZE", "abc", "1 to 2147483647"),
    # (a tester: Unicode digits passed str.isdigit and were a traceback in int(); a
    # 5,000-digit value was a traceback; 10**12 GPUs per node went into the line)
    ("SLURM_GPUS_ON_NODE", "\u00b2", "0 to 65536"), ("SLURM_NNODES", "\u0663", "1 to 1048576"),
    ("SLURM_RESTART_COUNT", "9" * 5000, "0 to 2147483647"),
    ("SLURM_GPUS_ON_NODE", "1000000000000", "0 to 65536"),
    ("MALLEABLE_BATCH_SIZE", "2147483648", "1 to 2147483647"),
])
def test_a_malformed_environment_value_is_named(tmp_path, name, value, bounds):
    """The Python Reporter reads these as their defaults (training must not stop); the
    shell command says so instead of writing restart 0, 0 GPUs or "batch not known"."""
    env = {**session_env(tmp_path), name: value}
    shown = value if len(value) <= 60 else f"{value[:40]}... ({len(value)} characters)"
    refused(run(["started", "--batch", "8"] if name != "MALLEABLE_BATCH_SIZE" else ["started"],
                env), f"{name}={shown}: expected an integer from {bounds}")
    assert list(tmp_path.iterdir()) == []


def test_a_relative_spool_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {**session_env(tmp_path), "MALLEABLE_SPOOL": "relative"}
    refused(run(["started", "--batch", "8"], env),
            "MALLEABLE_SPOOL=relative: expected an absolute path (the daemon reads the spool "
            "directory of its configuration)")
    refused(run(["started", "--batch", "8", "--spool", "rel"], env),
            "--spool=rel: expected an absolute path (the daemon reads the spool directory of "
            "its configuration)")
    assert list(tmp_path.iterdir()) == []


def test_a_set_but_empty_spool_variable_is_refused(tmp_path, monkeypatch):
    """An empty MALLEABLE_SPOOL (``export MALLEABLE_SPOOL=$UNSET``) fell back to the system
    spool, which the command may create, unlike the daemon's."""
    monkeypatch.chdir(tmp_path)
    for blank in ("", "  "):
        env = {**session_env(tmp_path), "MALLEABLE_SPOOL": blank}
        refused(run(["started", "--batch", "8"], env),
                "MALLEABLE_SPOOL is set but empty: expected the absolute path of the daemon's "
                "spool (unset it for the system spool /var/spool/malleable/progress)")
    # --spool decides where it goes, whatever the variable.
    spool = tmp_path / "spool"
    res = run(["started", "--batch", "8", "--spool", str(spool)],
              {**session_env(tmp_path), "MALLEABLE_SPOOL": ""})
    assert res.exit_code == 0, res.output
    assert [p.name for p in spool.iterdir()] == ["8.jsonl"]
