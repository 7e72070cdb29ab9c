"""Click parameter types shared by the command-line tools."""

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
