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
line's step and samples. Exit codes: 0 written, 1 the line could not be
written (the reason is printed), 2 bad input (one line naming the option).
"""

from __future__ import annotations

import math
import os
import sys

import click

from malleable.progress.lines import ProgressRecord, parse_line
from malleable.progress.reporter import (
    ENV_BATCH,
    ENV_SPOOL,
    Reporter,
    job_id_from_env,
)

TAIL_BYTES = 64 * 1024


def last_record(path: str, job_id: str) -> ProgressRecord | None:
    """The last valid line of ``job_id`` in its progress file (None: no file or none valid).

    Reads at most the last 64 KiB; does not follow a symlink.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - TAIL_BYTES), os.SEEK_SET)
        data = os.read(fd, TAIL_BYTES)
    finally:
        os.close(fd)
    for line in reversed(data.split(b"\n")):
        if line.strip():
            rec = parse_line(line, now=float("inf"), max_future_s=0, job_id=job_id)
            if isinstance(rec, ProgressRecord):
                return rec
    return None


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
        last = last_record(self.reporter.path, self.reporter.job_id)
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
    """A progress line at --step/--samples."""
    ctx = _Context(job, spool, batch)
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

