"""Run one Slurm command: an argv list, a timeout, no shell; retries with back-off.

Outcomes, in Slurm's own words where it has them:

* exit 0 -> the `CommandResult`;
* the controller did not answer (timeout, "Unable to contact slurm controller",
  "Socket timed out", "Unexpected message received", ...) -> retried up to
  ``max_retries`` times, waiting ``backoff_s * 2**attempt``, then `SlurmUnavailable`;
* any other non-zero exit -> `SlurmRejected` carrying Slurm's message
  (e.g. "Requested operation is presently disabled for job 12").

A change that is not idempotent (submit, signal, requeue) is retried only when
Slurm says it could not connect at all ("connect failure"): after a timeout it
may have been applied, and doing it twice would submit two jobs or deliver
two checkpoint signals. Every attempt counts as one RPC in ``rpc_count``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from malleable.slurm.client import SlurmError, SlurmRejected, SlurmUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

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
            proc = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False, stdin=subprocess.DEVNULL)
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
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

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
