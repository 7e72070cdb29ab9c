"""Run one Slurm command: an argv list, a timeout, no shell; retries with back-off.

Outcomes, in Slurm's own words where it has them:

* exit 0 -> the `CommandResult`;
* the controller did not answer (timeout, "Unable to contact slurm controller",
  "Socket timed out", "Unexpected message received", ...) -> retried up to
  ``max_retries`` times, waiting ``backoff_s * 2**attempt``, then `SlurmUnavailable`;
* any other non-zero exit -> `SlurmRejected` carrying Slurm's message
  (e.g. "Requested operation is presently disabled for job 12").

Each command runs in a session (and process group) of its own; on a timeout the
whole group is killed (SIGKILL) and reaped, so no child the command started (a
wrapper script's own commands, say) keeps running after it.

A change that is not idempotent (submit, signal, requeue) is retried only when
Slurm says it could not connect at all ("connect failure"): after a timeout it
may have been applied, and doing it twice would submit two jobs or deliver
two checkpoint signals. Every attempt counts as one RPC in ``rpc_count``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from malleable.slurm.client import SlurmError, SlurmRejected, SlurmUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# After a timeout's kill: how long to wait for the rest of the output (a process the
# kill could not reach, one that left the group, may hold the pipes open).
REAP_S = 2.0

# Messages meaning "the controller did not answer"; the first group proves the
# request never reached it.
NOT_DELIVERED = ("connect failure", "connection refused", "unable to establish")
UNAVAILABLE = NOT_DELIVERED + (
    "unable to contact slurm controller", "socket timed out", "timed out",
    "zero bytes were transmitted", "communication connection failure",
    "unexpected message received", "transport endpoint is not connected",
    "slurm backup controller in standby mode", "slurmctld is not responding",
    "resource temporarily unavailable",
)


@dataclass(frozen=True)
class CommandResult:
    """What a finished command printed: ``stdout``/``stderr`` as text, ``returncode``."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """Slurm's message: stderr, else stdout, stripped, at most 500 characters
        (or the exit status when the command printed nothing)."""
        text = (self.stderr.strip() or self.stdout.strip())[:500]
        return text or f"exit status {self.returncode} and no message"


def unavailable(message: str, *, delivered_only: bool = False) -> bool:
    """True when ``message`` says the controller did not answer; with
    ``delivered_only``, only when it says the request never reached it."""
    text = message.lower()
    return any(p in text for p in (NOT_DELIVERED if delivered_only else UNAVAILABLE))


class CommandRunner:
    """Runs Slurm commands for one backend and counts them.

    Args:
        timeout_s: seconds one command may take (`malleable.config.SlurmConfig`
            ``command_timeout_s``).
        max_retries: retries after the first attempt when the controller does not answer.
        backoff_s: first wait between attempts, doubled each time.
        env: environment for the commands (default: this process's, e.g. SLURM_CONF);
            SLURM_TIME_FORMAT=standard is always set so times parse the same everywhere.
        sleep: the wait function (tests pass a recorder).
    """

    def __init__(self, *, timeout_s: float = 30.0, max_retries: int = 3,
                 backoff_s: float = 0.5, env: Mapping[str, str] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.timeout_s = timeout_s
        self.max_retries = max(0, max_retries)
        self.backoff_s = backoff_s
        self.env = dict(os.environ if env is None else env)
        self.env["SLURM_TIME_FORMAT"] = "standard"
        self.sleep = sleep
        self.rpc_count = 0

    def _once(self, argv: Sequence[str], extra_env: Mapping[str, str] | None) -> CommandResult:
        self.rpc_count += 1
        env = {**self.env, **extra_env} if extra_env else self.env
        try:
            returncode, stdout, stderr = run_group(argv, env, self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            # What the command said before it was killed (e.g. squeue retrying to read a
            # missing slurm.conf for 60 s) says more than the timeout alone.
            said = _last_line(exc.stderr)
            return CommandResult(tuple(argv), -1, "",
                                 f"{argv[0]}: timed out after {self.timeout_s:g} s"
                                 + (f" (its last message: {said})" if said else ""))
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found on PATH: is the Slurm client "
                             "installed?") from None
        except OSError as exc:
            raise SlurmError(f"{argv[0]} could not run: {exc}") from None
        return CommandResult(tuple(argv), returncode, stdout, stderr)

    def run(self, argv: Sequence[str], *, idempotent: bool = True, job_id: str | None = None,
            extra_env: Mapping[str, str] | None = None) -> CommandResult:
        """Run ``argv`` (a list; never a shell) and return its result (exit status 0).

        Raises `SlurmUnavailable` when the controller did not answer after the
        retries, `SlurmRejected` with Slurm's message (and ``job_id``) for any
        other non-zero exit.
        """
        return self.call(argv, lambda result: check_exit(result, job_id),
                         idempotent=idempotent, extra_env=extra_env)

    def call(self, argv: Sequence[str], interpret: Callable[[CommandResult], T], *,
             idempotent: bool = True, extra_env: Mapping[str, str] | None = None) -> T:
        """Run ``argv`` and return ``interpret(result)``, retrying with back-off while the
        controller does not answer.

        ``interpret`` turns a finished command into a value; it may raise
        `SlurmUnavailable` itself (e.g. a JSON document whose ``errors`` say the
        controller was not reached, though the command exited 0), which is retried
        like a timeout, or `SlurmRejected`. A non-zero exit whose message says the
        controller did not answer never reaches ``interpret``.
        """
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"argv must be a non-empty list of strings, got {argv!r}")

        def attempt() -> T:
            result = self._once(argv, extra_env)
            if result.returncode != 0 and unavailable(result.message):
                raise SlurmUnavailable(f"{' '.join(argv[:3])}: {result.message}")
            return interpret(result)
        return with_retries(attempt, max_retries=self.max_retries, backoff_s=self.backoff_s,
                            sleep=self.sleep, idempotent=idempotent, what=argv[0])


def run_group(argv: Sequence[str], env: Mapping[str, str],
              timeout_s: float) -> tuple[int, str, str]:
    """Run ``argv`` (no shell, stdin from /dev/null) in a new session, so in a process
    group of its own, and collect its output as text.

    On a timeout, or if the wait is interrupted (KeyboardInterrupt, ...), the whole
    group is killed with SIGKILL (`kill_group`) and the command reaped:
    `subprocess.run` kills only the command itself, and whatever it started (the
    commands of a wrapper script) would keep running.

    Args:
        argv: the command and its arguments.
        env: its whole environment.
        timeout_s: seconds it may take.

    Returns:
        (exit status, stdout, stderr).

    Raises:
        subprocess.TimeoutExpired: it took longer than ``timeout_s``; its ``stdout`` and
            ``stderr`` hold what the command wrote before it was killed.
        OSError: it could not be started (FileNotFoundError: no such command).
    """
    with subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            kill_group(proc)
            try:     # the rest of the output, now that the group is gone
                stdout, stderr = proc.communicate(timeout=REAP_S)
            except subprocess.TimeoutExpired:   # a process outside the group holds a pipe
                stdout, stderr = exc.stdout, exc.stderr
            raise subprocess.TimeoutExpired(proc.args, timeout_s, output=stdout,
                                            stderr=stderr) from None
        except BaseException:
            kill_group(proc)
            raise
        return proc.returncode, stdout, stderr


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group of ``proc`` (started with ``start_new_session=True``: the
    group's id is its pid) with SIGKILL, then reap ``proc``.

    Until it is reaped the command's pid, and with it the group id, cannot be reused,
    so the signal cannot reach another group. A group that is already gone is not an
    error; if the group cannot be signalled (not permitted), the command alone is
    killed.

    Args:
        proc: a command started by `run_group`.

    Returns:
        None, once ``proc`` is reaped; a group that is gone or cannot be signalled
        raises nothing.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()


def _last_line(output: str | bytes | None, most: int = 200) -> str:
    """The last non-blank line of a command's partial output, at most ``most`` characters."""
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    return lines[-1][:most] if lines else ""


def with_retries(attempt: Callable[[], T], *, max_retries: int, backoff_s: float,
                 sleep: Callable[[float], None], idempotent: bool, what: str) -> T:
    """Call ``attempt`` until it returns; on `SlurmUnavailable` wait ``backoff_s * 2**k``
    and try again, at most ``max_retries`` times (only when ``idempotent`` or the message
    proves the request never reached the controller). Re-raises the last
    `SlurmUnavailable` with the number of attempts; other errors pass through."""
    k = 0
    while True:
        try:
            return attempt()
        except SlurmUnavailable as exc:
            retry = idempotent or unavailable(str(exc), delivered_only=True)
            if not retry or k >= max_retries:
                raise SlurmUnavailable(f"{exc} (after {k + 1} attempt(s))") from None
            wait = backoff_s * (2 ** k)
            log.warning("Slurm did not answer %s (%s); retry %d/%d in %.1f s",
                        what, exc, k + 1, max_retries, wait)
            sleep(wait)
            k += 1


def check_exit(result: CommandResult, job_id: str | None = None) -> CommandResult:
    """The default interpretation: the result itself on exit 0, else `SlurmRejected`
    carrying Slurm's message."""
    if result.returncode != 0:
        raise SlurmRejected(f"{' '.join(result.argv[:3])}: {result.message}", job_id=job_id,
                            slurm_message=result.message)
    return result
