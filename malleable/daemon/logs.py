"""Logging for the daemon: journald-friendly lines on stderr, a job id on every line.

Under systemd (``JOURNAL_STREAM`` set) each line starts with the sd-daemon(3)
priority prefix (``<6>`` for info, ...) and carries no timestamp (journald adds
one); in a terminal lines start with an ISO timestamp instead. Every line has
``job=<id>`` (``job=-`` when it concerns no single job) and ``cycle=<n>`` so
``journalctl -u malleable | grep job=123`` shows one job's whole story.

Use `job_logger(logger, job_id)` (a LoggerAdapter) or pass
``extra={"job": id}``.

A message can quote what users chose (a job's comment in "invalid malleable
spec", Slurm's refusal of a change), so the formatter writes each message
through `malleable.safe_text.safe_text`: an escape sequence or a line break in
it shows as ``\x1b`` or ``\n`` and cannot fake or hide a line. A traceback
after the message keeps its lines.
"""

from __future__ import annotations

import logging
import os
import sys

from malleable.safe_text import safe_text

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


class _Defaults(logging.Filter):
    """Give every record ``job`` and ``cycle`` attributes (``-`` when unset)."""

    def __init__(self, state: dict) -> None:
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "job"):
            record.job = "-"
        if not hasattr(record, "cycle"):
            record.cycle = self.state.get("cycle", "-")
        record.priority = _PRIORITY.get(record.levelno, 6)
        return True


_STATE: dict = {}


class _SafeFormatter(logging.Formatter):
    """A `logging.Formatter` whose message part goes through `safe_text` (one line,
    nothing a terminal acts on); the traceback after it, if any, is left as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = safe_text(record.message)
        return super().formatMessage(record)


class _NotSkipped(logging.Filter):
    """Drop APScheduler's "skipped: maximum number of running instances reached"."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()


def set_cycle(n: int | str) -> None:
    """Stamp subsequent log lines with this cycle number."""
    _STATE["cycle"] = n


def setup_logging(level: str = "INFO", stream=None, journald: bool | None = None) -> None:
    """Configure the ``malleable`` logger hierarchy for the daemon.

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        stream: where to write (default stderr).
        journald: force the journald format on/off (default: detect ``JOURNAL_STREAM``).

    Raises:
        ValueError: an unknown level name.
    """
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"log level must be DEBUG, INFO, WARNING or ERROR, got {level!r}")
    journald = bool(os.environ.get("JOURNAL_STREAM")) if journald is None else journald
    fmt = ("<%(priority)s>%(levelname)s cycle=%(cycle)s job=%(job)s %(name)s: %(message)s"
           if journald else
           "%(asctime)s %(levelname)s cycle=%(cycle)s job=%(job)s %(name)s: %(message)s")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_SafeFormatter(fmt))
    handler.addFilter(_Defaults(_STATE))
    root = logging.getLogger("malleable")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    # APScheduler's own lines go through the same handler; a run skipped because the
    # previous one still runs is the intended coalescing (each cycle logs its duration).
    aps = logging.getLogger("apscheduler")
    aps.handlers[:] = [handler]
    aps.setLevel("WARNING")
    aps.propagate = False
    sched = logging.getLogger("apscheduler.scheduler")
    sched.filters[:] = [f for f in sched.filters if not isinstance(f, _NotSkipped)]
    sched.addFilter(_NotSkipped())
    # Python's warnings (e.g. numpy's "overflow encountered" under extreme policy
    # parameters) as log lines in this format, not raw stderr text.
    logging.captureWarnings(True)
    pyw = logging.getLogger("py.warnings")
    pyw.handlers[:] = [handler]
    pyw.filters[:] = [_OneLine()]
    pyw.setLevel("WARNING")
    pyw.propagate = False


class _OneLine(logging.Filter):
    """A warning (``file:line: Category: message`` and its source line) as one log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        record.msg, record.args = " -- ".join(x.strip() for x in text.splitlines()
                                              if x.strip()), ()
        return True


def job_logger(logger: logging.Logger, job_id: str) -> logging.LoggerAdapter:
    """A logger whose lines carry ``job=<job_id>``."""
    return logging.LoggerAdapter(logger, {"job": job_id})
