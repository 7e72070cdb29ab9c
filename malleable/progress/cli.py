"""`malleable report ...`: the reporter for jobs that are not written in Python.

A shell, Julia or C++ job calls it between training steps::

    malleable report started --step 0 --samples 0 --batch 256
    malleable report progress --step 100 --samples 25600 --metric 0.71
    malleable report checkpointed /scratch/$SLURM_JOB_ID/ckpt --step 100 --samples 25600
    malleable report finished

Each call appends one line to the job's progress file exactly as
`malleable.progress.reporter.Reporter` does (same environment variables, same
format, made by `Reporter.format_line`). ``--batch`` is remembered from the last
accepted line of the file (before ``MALLEABLE_BATCH_SIZE``), so it need only be
given once; ``checkpointed`` and ``finished`` default to that line's step and
samples ("accepted": as the daemon's `LineValidator` judges the file, so a line it
rejects sets no default). Before it is written, the line is checked as the daemon
will check it, by that validator fed the file's last 64 KiB: a line it would
reject (a value out of range, longer than 4096 bytes, a step or samples below this
run's last accepted line, a restart count below one already in the file) is
refused. Only the line's time ``t`` is not judged (``future_time``,
``decreasing_time``): the job's node has its own clock. Exit codes: 0
written, 1 the line could not be written (the reason is printed), 2 bad input or
a line the daemon would reject (one line naming the option, its value and the
reason; nothing is written).
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from collections.abc import Mapping

import click

from malleable.progress.lines import (
    RESTART_SLACK,
    Cursor,
    LineValidator,
    ProgressRecord,
    Reason,
    Rejection,
    split_lines,
)
from malleable.progress.reporter import (
    DEFAULT_SPOOL,
    ENV_BATCH,
    ENV_COUNTS,
    ENV_SPOOL,
    JOB_ID,
    MAX_BATCH,
    MAX_INT,
    MAX_LINE_BYTES,
    Reporter,
    env_int,
    job_id_from_env,
)

TAIL_BYTES = 64 * 1024
_NUMBER = re.compile(r"0|[1-9][0-9]{0,19}")   # one part of a job id (`JOB_ID`)


def read_tail(path: str) -> bytes:
    """The last lines of a progress file: at most its last `TAIL_BYTES` (64 KiB).

    Reads only the tail, whatever the file's size; does not follow a symlink and
    does not block on a FIFO.

    Args:
        path: the progress file.

    Returns:
        The bytes from the first line that starts inside the tail to the end of the
        file (a line cut by the tail's start is dropped; a partial last line is
        kept). b"" if the file is missing, empty, not a regular file or unreadable.
        Never raises.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        start = max(0, st.st_size - TAIL_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, TAIL_BYTES)
    except OSError:
        return b""
    finally:
        os.close(fd)
    if start > 0:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return data


def replay(tail: bytes, job_id: str, max_restart: int | None = None
           ) -> tuple[LineValidator, ProgressRecord | None]:
    """The daemon's view of a job's file once ``tail`` (`read_tail`) is ingested.

    The lines of ``tail`` go through the daemon's own `LineValidator` in order, as
    ingestion will feed them once this call's line is appended: the complete
    lines, then a partial last line (the reporter ends it with a newline before
    its own line, so ingestion reads it as a line of its own; a torn fragment is
    rejected and changes nothing). ``t`` is not checked against a clock.

    Args:
        tail: the end of the job's progress file.
        job_id: the job whose file it is (a line naming another job is rejected).
        max_restart: the highest restart count a line may carry (`check_order`; the
            caller's run count plus `RESTART_SLACK`), None: no bound. A line above
            it is rejected, as the daemon rejects it (``future_restart``), so it does
            not make the run's own lines look stale.

    Returns:
        (the validator, ready for this call's line: its ``last`` `Cursor` is the
        (restart, step, samples) of the last accepted line, or None; the
        `ProgressRecord` of that line, or None). A ``started`` line or a higher
        ``restart`` resets the cursor; a rejected line leaves it as it was.
        Never raises.
    """
    validator = LineValidator(job_id, max_future_s=0, check_time=False,
                              max_restart=max_restart)
    lines, partial = split_lines(tail)
    if partial.strip():
        lines.append(partial)
    last = None
    for line in lines:
        result = validator.feed(line, now=math.inf)
        if isinstance(result, ProgressRecord):
            last = result
    return validator, last


def _shown(value: object) -> str:
    """``value`` for an error line: as is, or its start and length if long."""
    text = str(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


# Environment values the line takes, and the least each may be (`check_environment`).
_ENV_COUNTS = (*ENV_COUNTS, (ENV_BATCH, 1, MAX_BATCH))


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse an environment value the line would take wrongly.

    The Python `Reporter` reads a malformed SLURM_RESTART_COUNT, SLURM_GPUS_ON_NODE,
    SLURM_JOB_NUM_NODES or SLURM_NNODES as its default (training must not stop over a
    report); a shell command can say so instead. Each must be ASCII digits within its
    bounds (`ENV_COUNTS`; MALLEABLE_BATCH_SIZE from 1 to `MAX_BATCH`).

    Args:
        env: the environment (unset or blank variables pass).

    Raises:
        SystemExit(2): a set variable that is not an integer within its bounds
            (one line on stderr naming the variable and its value).
    """
    for name, least, most in _ENV_COUNTS:
        raw = env.get(name, "").strip()
        value = env_int(raw, most) if raw else least
        if value is None or value < least:
            fail(f"{name}={_shown(raw)}: expected an integer from {least} to {most}")


def check_job_environment(env: Mapping[str, str]) -> None:
    """Refuse a job id from the environment that is not one Slurm gives.

    The id names the progress file (``<spool>/<id>.jsonl``) and is in every line: a
    non-numeric SLURM_JOB_ID (or array variables) would write a file the daemon never
    reads, for a job that does not exist. The variables are read as
    `malleable.progress.reporter.job_id_from_env` reads them.

    Args:
        env: the environment.

    Raises:
        SystemExit(2): the variables in use do not make an id such as 123 or 123_4
            (one line on stderr naming each variable and its value).
    """
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        if not (_NUMBER.fullmatch(array_job) and _NUMBER.fullmatch(task)):
            fail(f"SLURM_ARRAY_JOB_ID={_shown(array_job)!r}, SLURM_ARRAY_TASK_ID="
                 f"{_shown(task)!r}: expected two numbers (the job id 123_4 as squeue shows "
                 f"it; it names the job's progress file <spool>/<id>.jsonl); pass --job ID")
        return
    name = "SLURM_JOB_ID" if env.get("SLURM_JOB_ID") else "SLURM_JOBID"
    value = env.get(name, "")
    if value and not _NUMBER.fullmatch(value):
        fail(f"{name}={_shown(value)!r}: expected a Slurm job id, a number such as 123 (it "
             f"names the job's progress file <spool>/<id>.jsonl); pass --job ID")


def fail(message: str, code: int = 2) -> None:
    """Print ``malleable report: error: <message>`` (one line) and exit with ``code``."""
    click.echo(f"malleable report: error: {message}", err=True)
    sys.exit(code)


class _Context:
    """One ``malleable report`` call: the job's `Reporter` and the daemon's view of its file.

    Attributes:
        reporter: the reporter of this job (never installs a signal handler).
        job_given: the job id came from ``--job`` (not from Slurm's variables).
        validator: the daemon's `LineValidator` after the file's tail (`replay`).
        last: the last line of the tail the daemon accepts (None if none).
    """

    def __init__(self, job: str | None, spool: str | None, batch: int | None):
        """Find the job, its file and its batch size.

        ``batch`` is, in this order: the ``--batch`` given, ``$MALLEABLE_BATCH_SIZE``,
        the batch of the last accepted line.

        Raises:
            SystemExit(2): no job id, a bad id or environment value, or no batch
                size known (one line on stderr).
        """
        env = os.environ
        if job is not None and not JOB_ID.fullmatch(job):   # '' too: not "unset"
            fail(f"--job={_shown(job)!r}: expected a Slurm job id such as 123 or 123_4 "
                 f"(the daemon reads <spool>/<id>.jsonl by the id squeue shows)")
        job_id = job if job is not None else job_id_from_env(env)
        if not job_id:
            fail("SLURM_JOB_ID is not set: run inside a Slurm job or pass --job ID")
        if job is None:
            check_job_environment(env)
        check_environment(env)
        if spool is not None and not spool.strip():
            fail(f"--spool={spool!r}: empty; expected the absolute path of the daemon's spool "
                 f"(leave --spool out for ${ENV_SPOOL} or the system spool {DEFAULT_SPOOL})")
        if spool is None and ENV_SPOOL in env and not env[ENV_SPOOL].strip():
            fail(f"{ENV_SPOOL} is set but empty: expected the absolute path of the daemon's "
                 f"spool (unset it for the system spool {DEFAULT_SPOOL})")
        spool_dir = spool or env.get(ENV_SPOOL) or None
        if spool_dir is not None and not os.path.isabs(spool_dir):
            fail(f"{'--spool' if spool else ENV_SPOOL}={spool_dir}: expected an absolute path "
                 f"(the daemon reads the spool directory of its configuration)")
        try:
            self.reporter = Reporter.from_env({**env, "SLURM_JOB_ID": job_id,
                                               "SLURM_ARRAY_JOB_ID": "",
                                               "SLURM_ARRAY_TASK_ID": ""},
                                              spool_dir=spool_dir, install_handler=False)
        except ValueError as exc:
            fail(str(exc))
        self.job_given = bool(job)
        self.validator, self.last = replay(
            read_tail(self.reporter.path), self.reporter.job_id,
            max_restart=self.reporter.restart_count + RESTART_SLACK)
        # The file's last accepted line says the batch the job runs at now: it wins over
        # MALLEABLE_BATCH_SIZE, which `malleable submit` sets to the spec's initial batch.
        if batch is None and self.last is not None:
            batch = self.last.batch
        if batch is not None:
            self.reporter.batch_size = batch
        if self.reporter.batch_size is None:
            fail(f"--batch: the global batch size is not known yet (give --batch or set "
                 f"{ENV_BATCH})")

    def write(self, event: str, *, step: int | None = None, samples: int | None = None,
              metric: float | None = None, grad_sqr: float | None = None,
              grad_var: float | None = None, path: str | None = None) -> None:
        """Append this call's line, unless the daemon would reject it.

        The line is the one the reporter writes (`Reporter.format_line`), and it
        is judged by `validator`, as ingestion will judge it after the file's
        tail: its own validity (`parse_line`) and its order (`check_order`: a
        step or samples below this run's last accepted line, a restart count
        below one already seen). ``t`` is not judged (the node's clock is its own).

        Args:
            event: the event.
            step, samples: the counts; None: those of the last accepted line (0
                without one).
            metric, grad_sqr, grad_var: finite floats, or None.
            path: the absolute checkpoint path (``checkpointed``).

        Raises:
            SystemExit(2): the daemon would reject the line; nothing is written and
                one line on stderr names the option(s), the value(s) and the reason.
            SystemExit(1): the line could not be written (the reporter printed why).
        """
        rep, cursor = self.reporter, self.validator.last
        step = (cursor.step if cursor else 0) if step is None else step
        samples = (cursor.samples if cursor else 0) if samples is None else samples
        line = rep.format_line(event, step, samples, metric=metric, grad_sqr=grad_sqr,
                               grad_var=grad_var, path=path)
        result = self.validator.feed(line, now=math.inf)
        if isinstance(result, Rejection):
            fail(self._explain(result, cursor, len(line), step=step, samples=samples,
                               metric=metric, grad_sqr=grad_sqr, grad_var=grad_var,
                               path=path))
        if not rep.append_line(line):
            sys.exit(1)

    def _explain(self, rejection: Rejection, cursor: Cursor | None, size: int, *, step: int,
                 samples: int, metric: float | None, grad_sqr: float | None,
                 grad_var: float | None, path: str | None) -> str:
        """The error line for a line the daemon would reject: option=value: why (reason)."""
        rep, reason = self.reporter, rejection.reason
        why = f"(the daemon would reject it as {reason.value})"
        if cursor is not None and reason is Reason.DECREASING_STEP:
            return (f"--step={step}: below step {cursor.step} of this run's last line in "
                    f"{rep.path} {why}")
        if cursor is not None and reason is Reason.DECREASING_SAMPLES:
            return (f"--samples={samples}: below samples {cursor.samples} of this run's last "
                    f"line in {rep.path} {why}")
        if cursor is not None and reason is Reason.STALE_RESTART:
            return (f"SLURM_RESTART_COUNT={rep.restart_count}: below restart {cursor.restart} "
                    f"of a line already in {rep.path} {why}")
        job = "--job" if self.job_given else "the job id"
        if reason is Reason.TOO_LONG:
            label, value = max((("PATH", path or ""), (job, rep.job_id)),
                               key=lambda item: len(item[1]))
            return (f"{label}={_shown(value)}: the line would be {size} bytes, more than "
                    f"{MAX_LINE_BYTES} {why}")
        sources: dict[str, tuple[str, object]] = {
            "step": ("--step", step), "samples": ("--samples", samples),
            "batch": ("--batch", rep.batch_size), "job": (job, rep.job_id),
            "path": ("PATH", path), "metric": ("--metric", metric),
            "grad_sqr": ("--grad-sqr", grad_sqr), "grad_var": ("--grad-var", grad_var),
            "restart": ("SLURM_RESTART_COUNT", rep.restart_count),
            "gpus": ("the GPU count", rep.gpus), "nodes": ("SLURM_JOB_NUM_NODES", rep.nodes)}
        field = rejection.detail.partition("=")[0]
        if field in sources:
            label, value = sources[field]
            if isinstance(value, int) and value > MAX_INT:
                problem = f"above {MAX_INT} (2**63 - 1), the largest integer a line may hold"
            elif reason is Reason.NAN_OR_INF:
                problem = "not a finite number"
            else:
                problem = "not a value a progress line may hold"
            return f"{label}={_shown(value)}: {problem} {why}"
        return f"the line would be rejected by the daemon as {reason.value} ({rejection.detail})"


_common = [
    click.option("--job", "job", metavar="ID",
                 help="Job id (default: ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} in an "
                      "array task, else $SLURM_JOB_ID)."),
    click.option("--spool", "spool", metavar="DIR",
                 help=f"Spool directory (default: ${ENV_SPOOL} or the system spool)."),
    click.option("--batch", "batch", type=click.IntRange(min=1), metavar="N",
                 help=f"Global batch size (default: the last accepted line's, else "
                      f"${ENV_BATCH})."),
]


def common(func):
    for option in reversed(_common):
        func = option(func)
    return func


_nonneg = click.IntRange(min=0)


@click.group("report")
def report() -> None:
    """Append a progress line for this Slurm job (for jobs not written in Python).

    The file and format are those of the Python reporter
    (docs/progress-format.md): <spool>/<job id>.jsonl, one JSON object a line.
    A line the daemon would reject (a value out of range, too long, a step or
    samples below this run's last accepted line, ...) is refused: exit 2, nothing
    written.
    """


@report.command("started")
@common
@click.option("--step", type=_nonneg, default=0, show_default=True,
              help="Step the job (re)starts at (its checkpoint's step).")
@click.option("--samples", type=_nonneg, default=0, show_default=True,
              help="Samples processed at that step.")
def started(job, spool, batch, step, samples) -> None:
    """The job (re)started, at --step/--samples (from its checkpoint)."""
    _Context(job, spool, batch).write("started", step=step, samples=samples)


class _FiniteFloat(click.ParamType):
    """A float that must be finite; the error shows the value as given (1e400, not inf)."""

    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r}: not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value}: not a finite number", param, ctx)
        return number


_finite_float = _FiniteFloat()


@report.command("progress")
@common
@click.option("--step", type=_nonneg, required=True, help="Cumulative training iterations.")
@click.option("--samples", type=_nonneg, required=True, help="Cumulative samples processed.")
@click.option("--metric", type=_finite_float,
              help="Current metric (loss, accuracy, ...).")
@click.option("--grad-sqr", type=_finite_float,
              help="Estimate of the squared norm of the true gradient, |G|^2.")
@click.option("--grad-var", type=_finite_float,
              help="Trace of the covariance of the gradient estimate, normalised to "
                   "the initial batch size m0 (the spec's batch): the noise scale is "
                   "phi = m0 * grad_var / grad_sqr.")
def progress(job, spool, batch, step, samples, metric, grad_sqr, grad_var) -> None:
    """A progress line at --step/--samples.

    --step and --samples may not go below those of this run's last accepted line
    (same restart count, no `started` since): the daemon would reject the line, so
    it is refused (exit 2).
    """
    _Context(job, spool, batch).write("progress", step=step, samples=samples, metric=metric,
                                      grad_sqr=grad_sqr, grad_var=grad_var)


@report.command("checkpointed")
@common
@click.argument("path")
@click.option("--step", type=_nonneg,
              help="The checkpoint's step (default: the last accepted line's).")
@click.option("--samples", type=_nonneg,
              help="The checkpoint's samples (default: the last accepted line's).")
def checkpointed(job, spool, batch, path, step, samples) -> None:
    """A checkpoint was written completely to PATH."""
    ctx = _Context(job, spool, batch)
    if not path or "\x00" in path:
        fail(f"PATH={path!r}: expected a file path")
    ctx.write("checkpointed", step=step, samples=samples, path=os.path.abspath(path))


@report.command("finished")
@common
@click.option("--step", type=_nonneg, help="Final step (default: the last accepted line's).")
@click.option("--samples", type=_nonneg,
              help="Final samples (default: the last accepted line's).")
def finished(job, spool, batch, step, samples) -> None:
    """The job reached its target and ends."""
    _Context(job, spool, batch).write("finished", step=step, samples=samples)

