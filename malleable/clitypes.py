"""Pieces shared by the command-line tools: a parameter type and the one-line error."""

from __future__ import annotations

import math

import click

# The most GPUs per node an option takes (as `replay`, `simulate` and `submit` do); a
# larger value is a typo, and past 2**63 - 1 it would overflow NumPy's and SQLite's ints.
MAX_GPUS_PER_NODE = 1024
# The most rows a --limit takes: more than an action log holds in practice (retention),
# and far below 2**63 - 1, SQLite's largest LIMIT.
MAX_LIMIT = 1_000_000

GPUS_PER_NODE = click.IntRange(1, MAX_GPUS_PER_NODE)
"""``--gpus-per-node G``: 1 to `MAX_GPUS_PER_NODE`; another value is exit 2 naming it."""

LIMIT = click.IntRange(1, MAX_LIMIT)
"""``--limit N``: 1 to `MAX_LIMIT`; another value is exit 2 naming it."""


class FiniteFloat(click.FloatRange):
    """A `click.FloatRange` that also refuses nan and the infinities (the range checks
    let nan through): ``--speedup nan`` is "'nan' is not a finite number", exit 2."""

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if out is not None and not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return out


def one_line(message: object) -> str:
    """``message`` on one line: its non-blank lines, stripped, joined by "; " (a Slurm
    command's stderr often spans several lines; an error is one line)."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
