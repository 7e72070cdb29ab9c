"""Pieces shared by the command-line tools: a parameter type and the one-line error."""

from __future__ import annotations

import math

import click


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
