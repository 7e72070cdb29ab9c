"""`malleable report ...`: the reporter for jobs that are not written in Python.

A shell, Julia or C++ job calls it between training steps::

    malleable report started --step 0 --samples 0 --batch 256
    malleable report progress --step 100 --samples 25600 --metric 0.71
    malleable report checkpointed /scratch/$SLURM_JOB_ID/ckpt --step 100 --samples 25600
    malleable report finished

Each call appends one line to the job's progress file exactly as
`malleable.progress.reporter.Reporter` does (same environment variables, same
format). ``--batch`` is remembered from the last line of the file, so it need
only be given once; ``checkpointed`` and ``finished`` default to the last
line's step and samples. ``progress`` refuses a ``--step`` below that of the
last line of the same run, which the daemon would reject as ``decreasing_step``
(only the file's last 64 KiB are read for all this). Exit codes: 0 written, 1
the line could not be written (the reason is printed), 2 bad input (one line
naming the option; nothing is written).
"""

from __future__ import annotations

import math
import os
import stat
import sys

import click

from malleable.progress.lines import (
    Cursor,
    LineValidator,
    ProgressRecord,
    Reason,
    check_order,
    parse_line,
    split_lines,
)
from malleable.progress.reporter import (
    ENV_BATCH,
    ENV_SPOOL,
    Reporter,
    job_id_from_env,
)

TAIL_BYTES = 64 * 1024


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


def last_record(tail: bytes, job_id: str) -> ProgressRecord | None:
    """The last valid line of ``job_id`` in ``tail`` (`read_tail`).

    Args:
        tail: the end of the job's progress file.
        job_id: the job whose file it is (a line naming another job is not valid).

    Returns:
        The `ProgressRecord` of the last line `parse_line` accepts (a partial last
        line included, if it parses), or None if there is none. Never raises.
    """
    for line in reversed(tail.split(b"\n")):
        if line.strip():
            rec = parse_line(line, now=math.inf, max_future_s=0, job_id=job_id)
            if isinstance(rec, ProgressRecord):
                return rec
    return None


def run_cursor(tail: bytes, job_id: str) -> Cursor | None:
    """The ordering state the daemon holds after reading ``tail`` (`read_tail`).

    The complete lines of ``tail`` go through the daemon's own `LineValidator`
    in order, as ingestion feeds them (a partial last line is not read yet, and
    ``t`` is not checked against a clock), so the result is the (restart, step,
    samples) of the last line ingestion accepts: a ``started`` line or a higher
    ``restart`` resets it, an out-of-order line leaves it as it was.

    Args:
        tail: the end of the job's progress file.
        job_id: the job whose file it is.

    Returns:
        The `Cursor`, or None if no complete line of ``tail`` is valid. Never raises.
    """
    validator = LineValidator(job_id, max_future_s=0)
    lines, _partial = split_lines(tail)
    for line in lines:
        validator.feed(line, now=math.inf)
    return validator.last


def fail(message: str, code: int = 2) -> None:
    """Print ``malleable report: error: <message>`` (one line) and exit with ``code``."""
    click.echo(f"malleable report: error: {message}", err=True)
    sys.exit(code)


class _Context:
    def __init__(self, job: str | None, spool: str | None, batch: int | None):
        env = os.environ
        job_id = job or job_id_from_env(env)
        if not job_id:
            fail("SLURM_JOB_ID is not set: run inside a Slurm job or pass --job ID")
        spool_dir = spool or env.get(ENV_SPOOL) or None
        try:
            self.reporter = Reporter.from_env({**env, "SLURM_JOB_ID": job_id,
                                               "SLURM_ARRAY_JOB_ID": "",
                                               "SLURM_ARRAY_TASK_ID": ""},
                                              spool_dir=spool_dir, install_handler=False)
        except ValueError as exc:
            fail(str(exc))
        self.tail = read_tail(self.reporter.path)
        last = last_record(self.tail, self.reporter.job_id)
        self.last = last
        if batch is None and not env.get(ENV_BATCH, "").strip() and last is not None:
            batch = last.batch
        if batch is not None:
            self.reporter.batch_size = batch
        if self.reporter.batch_size is None:
            fail(f"--batch: the global batch size is not known yet (give --batch or set "
                 f"{ENV_BATCH})")
        if last is not None:
            self.reporter.step, self.reporter.samples = last.step, last.samples

    def refuse_decreasing_step(self, event: str, step: int, samples: int) -> None:
        """Exit 2, writing nothing, if the daemon would reject this line as ``decreasing_step``.

        The line the reporter is about to write (this ``event``, ``step`` and
        ``samples``, the reporter's restart count) is checked with the daemon's own
        `check_order` against `run_cursor` of the file's tail: a ``step`` below the
        last accepted line of the same run (same ``restart``, no ``started`` line
        since) is refused; an equal step, a higher ``restart``, a ``started`` event,
        or a missing, empty or unreadable file pass.

        Raises:
            SystemExit(2): the step decreases (one line on stderr names ``--step``,
                both steps and the file).
        """
        cursor = run_cursor(self.tail, self.reporter.job_id)
        rep = self.reporter
        line = ProgressRecord(t=0.0, job=rep.job_id, event=event, step=step, samples=samples,
                              gpus=rep.gpus, nodes=rep.nodes, batch=rep.batch_size,
                              restart=rep.restart_count)
        rejection = check_order(line, cursor)
        if cursor is not None and rejection is not None \
                and rejection.reason is Reason.DECREASING_STEP:
            fail(f"--step={step}: below step {cursor.step} of this run's last line in "
                 f"{rep.path} (the daemon would reject it as {Reason.DECREASING_STEP.value})")

    def done(self) -> None:
        if self.reporter.dropped:
            sys.exit(1)


_common = [
    click.option("--job", "job", metavar="ID",
                 help="Job id (default: from SLURM_ARRAY_JOB_ID_TASK or SLURM_JOB_ID)."),
    click.option("--spool", "spool", metavar="DIR",
                 help=f"Spool directory (default: ${ENV_SPOOL} or the system spool)."),
    click.option("--batch", "batch", type=click.IntRange(min=1), metavar="N",
                 help="Global batch size (default: the last line's, or "
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
    """


@report.command("started")
@common
@click.option("--step", type=_nonneg, default=0, show_default=True,
              help="Step the job (re)starts at (its checkpoint's step).")
@click.option("--samples", type=_nonneg, default=0, show_default=True,
              help="Samples processed at that step.")
def started(job, spool, batch, step, samples) -> None:
    """The job (re)started, at --step/--samples (from its checkpoint)."""
    ctx = _Context(job, spool, batch)
    ctx.reporter.started(step, samples)
    ctx.done()


def _finite(name: str):
    def convert(ctx, param, value):
        if value is not None and not math.isfinite(value):
            raise click.BadParameter(f"{value}: not a finite number", param_hint=name)
        return value
    return convert


@report.command("progress")
@common
@click.option("--step", type=_nonneg, required=True, help="Cumulative training iterations.")
@click.option("--samples", type=_nonneg, required=True, help="Cumulative samples processed.")
@click.option("--metric", type=float, callback=_finite("--metric"),
              help="Current metric (loss, accuracy, ...).")
@click.option("--grad-sqr", type=float, callback=_finite("--grad-sqr"),
              help="Squared norm of the mean gradient.")
@click.option("--grad-var", type=float, callback=_finite("--grad-var"),
              help="Variance of the per-sample gradients.")
def progress(job, spool, batch, step, samples, metric, grad_sqr, grad_var) -> None:
    """A progress line at --step/--samples.

    --step may not go below the step of this run's last line (same restart count,
    no `started` since): the daemon would reject the line, so it is refused (exit 2).
    """
    ctx = _Context(job, spool, batch)
    ctx.refuse_decreasing_step("progress", step, samples)
    ctx.reporter.log(step, samples, metric=metric, grad_sqr=grad_sqr, grad_var=grad_var)
    ctx.done()


@report.command("checkpointed")
@common
@click.argument("path")
@click.option("--step", type=_nonneg, help="The checkpoint's step (default: the last line's).")
@click.option("--samples", type=_nonneg,
              help="The checkpoint's samples (default: the last line's).")
def checkpointed(job, spool, batch, path, step, samples) -> None:
    """A checkpoint was written completely to PATH."""
    ctx = _Context(job, spool, batch)
    if not path or "\x00" in path:
        fail(f"PATH={path!r}: expected a file path")
    ctx.reporter.checkpointed(os.path.abspath(path), step=step, samples=samples)
    ctx.done()


@report.command("finished")
@common
@click.option("--step", type=_nonneg, help="Final step (default: the last line's).")
@click.option("--samples", type=_nonneg, help="Final samples (default: the last line's).")
def finished(job, spool, batch, step, samples) -> None:
    """The job reached its target and ends."""
    ctx = _Context(job, spool, batch)
    ctx.reporter.finished(step=step, samples=samples)
    ctx.done()

