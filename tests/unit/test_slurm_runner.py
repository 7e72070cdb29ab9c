"""The command runner: argv lists and no shell, timeouts, retries with exponential
back-off, and how Slurm's messages are classified.

Each test runs a real child process (this Python printing what a Slurm command
prints in that situation); the same paths against real Slurm binaries are in
test_slurm_contract.py (unreachable controller) and test_slurm_cli.py (a
controller that never answers).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from malleable.slurm import SlurmError, SlurmRejected, SlurmUnavailable
from malleable.slurm.runner import REAP_S, CommandRunner, unavailable

PY = sys.executable


def say(stderr: str = "", stdout: str = "", code: int = 0) -> list[str]:
    """argv of a child that prints like a Slurm command and exits with ``code``."""
    return [PY, "-c", "import sys; sys.stdout.write(sys.argv[1]); sys.stderr.write(sys.argv[2]);"
            " sys.exit(int(sys.argv[3]))", stdout, stderr, str(code)]


def runner(**kw) -> tuple[CommandRunner, list[float]]:
    waits: list[float] = []
    kw.setdefault("max_retries", 3)
    return CommandRunner(timeout_s=kw.pop("timeout_s", 10), sleep=waits.append, **kw), waits


def test_success_returns_output_and_counts_one_rpc():
    r, waits = runner()
    res = r.run(say(stdout="12345;cluster\n"))
    assert res.stdout == "12345;cluster\n" and res.returncode == 0
    assert r.rpc_count == 1 and waits == []


def test_connect_failure_is_retried_with_exponential_backoff_then_unavailable():
    r, waits = runner(backoff_s=0.5)
    msg = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    with pytest.raises(SlurmUnavailable, match=r"connect failure.*after 4 attempt"):
        r.run(say(stderr=msg, code=1))
    assert r.rpc_count == 4 and waits == [0.5, 1.0, 2.0]


def test_timeout_is_unavailable_and_retried():
    r, waits = runner(timeout_s=0.3, max_retries=1, backoff_s=0.01)
    with pytest.raises(SlurmUnavailable, match=r"timed out after 0.3 s.*after 2 attempt"):
        r.run([PY, "-c", "import time; time.sleep(30)"])
    assert r.rpc_count == 2 and waits == [0.01]


def test_a_timeout_names_what_the_command_said_before_it_was_killed():
    """squeue with a missing slurm.conf retries for 60 s itself, saying why on stderr;
    the timeout message carries that line."""
    r, _ = runner(timeout_s=1.0, max_retries=0)
    script = ("import sys, time; sys.stderr.write('squeue: error: s_p_parse_file: cannot stat "
              "file /nonexistent\\n\\n'); sys.stderr.flush(); time.sleep(30)")
    with pytest.raises(SlurmUnavailable, match=r"timed out after 1 s \(its last message: "
                       r"squeue: error: s_p_parse_file: cannot stat file /nonexistent\)"):
        r.run([PY, "-c", script])


def _wrapper(tmp_path, *, setsid: bool = False):
    """A wrapper script (as a site's sbatch wrapper might be) that starts a sleeping
    grandchild in the background, writes its pid (then a newline) to the file returned,
    and waits for it. With ``setsid`` the grandchild moves to a session of its own (out
    of the command's process group) before it writes its pid itself; it keeps holding
    the command's stdout and stderr."""
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "wrapper.sh"
    if setsid:
        code = ("import os, sys, time; os.setsid(); "
                "open(sys.argv[1], 'w').write(str(os.getpid()) + chr(10)); time.sleep(300)")
        body = (f"{PY} -c \"{code}\" {pidfile} &\n"
                f"while [ ! -s {pidfile} ]; do sleep 0.05; done\n")
    else:
        body = f"sleep 300 &\necho $! > {pidfile}\n"
    script.write_text(f"#!/bin/sh\n{body}wait\n")
    script.chmod(0o755)
    return script, pidfile


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed but not yet reaped by init,
    is not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _grandchild_pid(pidfile, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = pidfile.read_text() if pidfile.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.05)
    raise AssertionError("the grandchild never wrote its pid")


def _gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _assert_killed(pidfile, after: str) -> None:
    """The grandchild whose pid is in ``pidfile`` is gone within 5 s (killed with its
    group ``after`` a timeout or an interrupt); if not, the test fails and kills it."""
    pid = _grandchild_pid(pidfile)
    try:
        assert _gone_within(pid, 5.0), f"grandchild {pid} still runs after the {after}"
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_timeout_kills_the_commands_whole_process_group(tmp_path):
    """subprocess.run's timeout killed the command alone: the sleeping grandchild of a
    wrapper script kept running (and holding a Slurm client's resources)."""
    script, pidfile = _wrapper(tmp_path)
    r, _ = runner(timeout_s=1.0, max_retries=0)
    start = time.monotonic()
    with pytest.raises(SlurmUnavailable, match=r"wrapper.sh: timed out after 1 s \(after 1 "
                       r"attempt\(s\)\)$"):
        r.run([str(script)])
    assert time.monotonic() - start < 1.0 + REAP_S
    _assert_killed(pidfile, "timeout")


def test_a_timeout_does_not_wait_for_a_process_that_left_the_group(tmp_path):
    """A grandchild in a session of its own cannot be killed with the group; holding the
    command's stdout, it must not keep the runner waiting past the timeout (plus REAP_S)."""
    script, pidfile = _wrapper(tmp_path, setsid=True)
    r, _ = runner(timeout_s=3.0, max_retries=0)
    start = time.monotonic()
    try:
        with pytest.raises(SlurmUnavailable, match=r"timed out after 3 s"):
            r.run([str(script)])
        assert time.monotonic() - start < 3.0 + REAP_S + 1.0
        assert _running(_grandchild_pid(pidfile))    # (out of reach of the group's kill)
    finally:
        pid = _grandchild_pid(pidfile)
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_interrupted_wait_kills_the_commands_process_group(tmp_path):
    """Ctrl-C during a command (here SIGALRM raising KeyboardInterrupt): the command's own
    session no longer gets the terminal's SIGINT, so the runner kills its group."""
    script, pidfile = _wrapper(tmp_path)
    r, _ = runner(timeout_s=60.0, max_retries=0)

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            r.run([str(script)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    _assert_killed(pidfile, "interrupt")


def test_a_change_that_may_have_happened_is_not_retried():
    r, waits = runner()
    # A timeout or an unexpected reply may hide an applied requeue: one attempt only.
    with pytest.raises(SlurmUnavailable, match="after 1 attempt"):
        r.run(say(stderr="Unexpected message received for job 5", code=1), idempotent=False)
    assert r.rpc_count == 1 and waits == []
    # "connect failure" proves it never reached slurmctld: safe to retry even then.
    with pytest.raises(SlurmUnavailable, match="after 4 attempt"):
        r.run(say(stderr="sbatch: error: Batch job submission failed: Unable to contact "
                         "slurm controller (connect failure)", code=1), idempotent=False)


def test_refusal_carries_slurms_message_and_is_not_retried():
    r, waits = runner()
    with pytest.raises(SlurmRejected) as exc:
        r.run(say(stderr="Requested operation is presently disabled for job 12", code=1),
              job_id="12")
    assert exc.value.slurm_message == "Requested operation is presently disabled for job 12"
    assert exc.value.job_id == "12" and r.rpc_count == 1 and waits == []
    with pytest.raises(SlurmRejected, match="exit status 228 and no message"):
        r.run(say(code=228))


def test_arguments_are_never_interpreted_by_a_shell(tmp_path):
    r, _ = runner()
    nasty = f"$(touch {tmp_path}/a); `touch {tmp_path}/b`; touch {tmp_path}/c | cat && rm -rf /"
    res = r.run([PY, "-c", "import sys; print(sys.argv[1])", nasty])
    assert res.stdout.strip() == nasty
    assert list(tmp_path.iterdir()) == []


def test_argv_must_be_a_list_of_strings():
    r, _ = runner()
    for argv in ("squeue --json", [], ["squeue", 5], None):
        with pytest.raises(TypeError, match="argv must be a non-empty list"):
            r.run(argv)
    assert r.rpc_count == 0


def test_missing_command_is_a_slurm_error_not_retried():
    r, waits = runner()
    with pytest.raises(SlurmError, match="not found on PATH") as exc:
        r.run(["surely-not-a-slurm-command-xyz", "--json"])
    assert not isinstance(exc.value, SlurmUnavailable) and waits == []


def test_environment_forces_standard_time_format_and_adds_extras():
    r, _ = runner(env={"PATH": "/usr/bin:/bin", "SLURM_TIME_FORMAT": "relative"})
    res = r.run([PY, "-c", "import os; print(os.environ['SLURM_TIME_FORMAT'], "
                           "os.environ.get('EXTRA'))"], extra_env={"EXTRA": "1"})
    assert res.stdout.split() == ["standard", "1"]


def test_interpret_can_ask_for_a_retry():
    r, waits = runner(max_retries=2, backoff_s=0.1)
    seen = []

    def interpret(result):
        seen.append(result.stdout)
        if len(seen) < 3:
            raise SlurmUnavailable("errors in the document: Unspecified error")
        return "ok"
    assert r.call(say(stdout="{}"), interpret) == "ok"
    assert r.rpc_count == 3 and waits == [0.1, 0.2]


@pytest.mark.parametrize("msg, down, never_delivered", [
    ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", True, True),
    ("Socket timed out on send/recv operation", True, False),
    ("Unexpected message received for job 5", True, False),
    ("Zero Bytes were transmitted or received", True, False),
    ("Requested operation is presently disabled for job 12", False, False),
    ("Job update not available right now, the DB index is being set, try again in a bit "
     "for job 11", False, False),
    ("Invalid job id specified", False, False),
    ("Node count specification invalid", False, False),
])
def test_message_classification(msg, down, never_delivered):
    assert unavailable(msg) is down
    assert unavailable(msg, delivered_only=True) is never_delivered


def test_conf_checks_scontrol_query_kills_its_whole_group_on_a_timeout(tmp_path):
    """`conf check`'s ``scontrol show config`` ran through subprocess.run too, whose
    timeout left a wrapper's grandchild running; it now goes through `run_group`."""
    from malleable.slurm_conf.controller import query_controller

    script, pidfile = _wrapper(tmp_path)
    q = query_controller(tmp_path / "slurm.conf", timeout_s=1.0, scontrol=str(script))
    assert q.error == "scontrol show config gave no answer within 1 s"
    _assert_killed(pidfile, "timeout")
