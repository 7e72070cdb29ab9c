"""What every admin command shares: options, errors and exit codes, text formatting.

A command builds one JSON document (a dict whose ``schema`` key names its
schema, `malleable.ops.schemas`) and hands it to `emit` with a function that
renders the same document as text; ``--json`` prints the document instead.
So the table and the JSON are two views of one result and cannot disagree.

Text for a terminal: job names, comments, users and other strings from Slurm
or the store are anyone's to choose, so every such string is passed through
`safe_text` before it is printed (control characters, e.g. an escape sequence
or a line break that fakes a table row, and bidirectional overrides become
visible escapes such as ``\\x1b``). `table` does it for every cell, the text
views for the values they put in their own lines, and `emit` and `fail` once
more for whatever they print (all but the view's own line breaks). The JSON
documents keep every string exactly; `dumps` writes each character `safe_text`
would escape (C1 controls and bidirectional overrides too) as a JSON ``\\u``
escape, and other characters as they are.

Errors: raise `BadInput` (exit 2), `Refused` or `Failed` (exit 1); the
`handle_errors` decorator also turns the configuration's, the store's and the
Slurm port's errors into one line ``malleable CMD: error: MESSAGE`` on
stderr and the exit code documented in `malleable.ops`, without a traceback.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from malleable.clitypes import one_line
from malleable.config import ConfigError
from malleable.db.cli import store_options  # noqa: F401  (re-exported for the commands)
from malleable.db.errors import StoreError
from malleable.safe_text import (
    safe_json_text,
    safe_text,  # noqa: F401  (re-exported for the commands)
)
from malleable.slurm.client import SlurmError


class OpsError(Exception):
    """A command could not do what it was asked; ``code`` is its exit code."""

    code = 1


class BadInput(OpsError):
    """Bad input: a usage error, a bad value, an unusable configuration or database (exit 2)."""

    code = 2


class Refused(OpsError):
    """The caller may not do this (exit 1); the message says who may."""

    code = 1


class Failed(OpsError):
    """The operation failed (exit 1), e.g. Slurm did not answer."""

    code = 1


def fail(message: str, code: int) -> None:
    """Print ``malleable CMD: error: MESSAGE`` on stderr, on one line (the lines of a
    multi-line message, e.g. a Slurm command's stderr, joined by "; "), and exit with
    ``code``."""
    ctx = click.get_current_context()
    click.echo(f"{ctx.command_path}: error: {safe_text(one_line(message))}", err=True)
    ctx.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click callback: known errors become one line on stderr and an exit code.

    `OpsError` -> its ``code``; `ConfigError`, `StoreError` -> 2 (an unusable
    configuration or database is bad input, as in ``malleable db``), and so is a
    database error of a statement (`sqlalchemy.exc.DBAPIError`: a damaged store);
    `SlurmError` -> 1 (the operation failed).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OpsError as exc:
            fail(str(exc), exc.code)
        except (ConfigError, StoreError) as exc:
            fail(str(exc), 2)
        except SlurmError as exc:
            fail(f"Slurm: {exc}", 1)
        except DBAPIError as exc:   # e.g. a table missing from a store at head revision
            cause = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() \
                else type(exc.orig).__name__
            fail(f"the state store could not be read: {cause} (a damaged store, or one this "
                 f"malleable did not make: `malleable db current` names its revision)", 2)
        return None

    return wrapper


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--json``: print the result as one JSON document (docs/cli-json.md)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document (schema: docs/cli-json.md).")(fn)


def dumps(doc: dict) -> str:
    """The JSON text of a result document (UTF-8, indented, keys in build order).

    Args:
        doc: a result document (JSON values only; no NaN or infinity).

    Returns:
        The JSON text; every control character (C0, DEL, C1), format character (a
        bidirectional override, a zero-width space), lone surrogate and line or
        paragraph separator as a ``\\u`` escape (`safe_json_text`; JSON escapes only
        C0 itself), so the text holds none raw and parses to exactly ``doc``.
    """
    return safe_json_text(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False))


def emit(doc: dict, as_json: bool, render: Callable[[dict], str]) -> None:
    """Print ``doc`` as JSON (exactly, `dumps`), or as the text ``render(doc)`` returns,
    each of its lines through `safe_text` (a value a view left unescaped can still not
    reach the terminal raw; only its line breaks are the view's own)."""
    if as_json:
        click.echo(dumps(doc))
        return
    click.echo("\n".join(safe_text(line) for line in render(doc).rstrip("\n").split("\n")))


# ---------------------------------------------------------------- values


def iso(t: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 in UTC with seconds ("2026-01-02T03:04:05Z"), None as None."""
    if t is None:
        return None
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def age_s(t: datetime | None, now: datetime) -> float | None:
    """Seconds from ``t`` to ``now`` (rounded to 0.1 s), None if ``t`` is None."""
    return None if t is None else round((now - t).total_seconds(), 1)


def finite(x: Any, digits: int | None = None) -> float | None:
    """``x`` as a float if it is a finite number (rounded to ``digits``), else None."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return round(v, digits) if digits is not None else v


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; a time without a zone is UTC.

    Raises:
        ValueError: not an ISO 8601 time.
    """
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: a duration back from ``now`` ("90s", "30m", "2h", "1d", "1w"; a bare
    number is seconds) or an ISO 8601 time ("2026-01-02T03:00", UTC unless a zone is given).

    Raises:
        BadInput: neither (the message names the value and both forms).
    """
    m = _DURATION.match(text)
    if m:
        try:
            return now - timedelta(seconds=float(m.group(1))
                                   * _UNIT_S[(m.group(2) or "s").lower()])
        except (OverflowError, ValueError):   # past datetime's range (year 1)
            raise BadInput(f"--since {text!r}: too long ago (before year 1)") from None
    try:
        return parse_time(text)
    except ValueError:
        raise BadInput(f"--since {text!r}: expected a duration (90s, 30m, 2h, 1d, 1w) or an "
                       f"ISO 8601 time (2026-01-02T03:00:00Z)") from None


# ---------------------------------------------------------------- text

def fmt_duration(seconds: float | None) -> str:
    """A duration for people: "45 s", "12 min", "3 h 05 min", "2 d 4 h"; "-" for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0.0, float(seconds))
    if s < 120:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        h, rest = divmod(int(round(s)), 3600)
        return f"{h} h {rest // 60:02d} min"
    d, rest = divmod(int(round(s)), 86400)
    return f"{d} d {rest // 3600} h"


def fmt_when(text: str | None, age: float | None = None) -> str:
    """An ISO time from a document, with its age: "2026-01-02 03:04:05Z (12 s ago)"."""
    if text is None:
        return "never"
    out = text.replace("T", " ")
    return f"{out} ({fmt_duration(age)} ago)" if age is not None else out


def fmt_number(x: float | None, unit: str = "") -> str:
    """A number with three significant figures (thousands grouped), "-" for None."""
    if x is None:
        return "-"
    if abs(x) >= 100:
        out = f"{x:,.0f}"
    elif abs(x) >= 10:
        out = f"{x:.1f}"
    else:
        out = f"{x:.3g}"
    return f"{out} {unit}".rstrip()


def fmt_params(params: dict | None) -> str:
    """Policy parameters as ``key=value`` words (values as JSON, keys through
    `safe_text`), "" when none."""
    return " ".join(f"{safe_text(k)}={json.dumps(v)}" for k, v in sorted((params or {}).items()))


#: The widest a cell of a table's columns but the last may be (`table`).
CELL_WIDTH = 48


def _cell(value: Any, last: bool) -> str:
    """One table cell: "-" for None, else `safe_text`; cut to `CELL_WIDTH` characters,
    the last shown as "…", unless it is in the last column (which pads nothing)."""
    text = "-" if value is None else safe_text(value)
    return text if last or len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          right: Iterable[int] = ()) -> str:
    """A plain-text table: a header line, then one line per row, columns aligned.

    Args:
        headers: column titles.
        rows: cells (converted with ``str`` and made safe with `safe_text`, so that a
            cell is one line that moves no cursor; None shows as "-"). A cell of any
            column but the last is cut to `CELL_WIDTH` characters (ending in "…"): one
            job's 200,000-character name padded every row of `status` to its width.
            ``--json`` has the values whole.
        right: indexes of right-aligned (numeric) columns.

    Returns:
        The lines joined with newlines (no trailing newline); only the header when
        there are no rows.
    """
    headers = [safe_text(h) for h in headers]
    cells = [[_cell(c, i == len(r) - 1) for i, c in enumerate(r)] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    rset = set(right)

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if i in rset else v.ljust(widths[i])
                 for i, v in enumerate(values)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])
