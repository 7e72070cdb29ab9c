"""GRES values: a node's ``Gres=`` in slurm.conf and ``Count=`` in gres.conf.

slurm.conf(5), NODE CONFIGURATION: ``Gres`` is a comma-separated list of
``<name>[:<type>][:no_consume]:<number>[K|M|G|T|P]``, the suffixes multiplying
by powers of 1024; a name alone counts one. gres.conf(5): ``Count`` takes the
same number syntax.
"""

from __future__ import annotations

import re

from malleable.slurm_conf.records import GresSpec

# The largest count taken: Slurm keeps GRES counts in 64-bit integers, and malleable's
# GPU arithmetic (NumPy, the state store) in signed ones. A larger count is a typo.
MAX_COUNT = 2 ** 63 - 1
_SUFFIX = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}
_COUNT = re.compile(r"^(\d+)([KMGTP]?)$", re.IGNORECASE)


class GresSpecError(ValueError):
    """A GRES value Slurm would refuse; the message names the value and the fault."""


def parse_count(value: str) -> int:
    """Parse a GRES count such as ``4`` or ``10G`` (= 10 * 1024**3).

    Raises:
        GresSpecError: not a non-negative integer with an optional K/M/G/T/P suffix, or
            more than `MAX_COUNT` (2**63 - 1) once the suffix is applied.
    """
    m = _COUNT.match(value.strip())
    if not m:
        raise GresSpecError(f"{value!r} is not a count (a number, optionally with K, M, G, T or P)")
    digits = m.group(1).lstrip("0") or "0"
    # (thousands of digits are too large too, before int(), which refuses over 4300 digits)
    count = (MAX_COUNT + 1 if len(digits) > len(str(MAX_COUNT))
             else int(digits) * _SUFFIX[m.group(2).upper()])
    if count > MAX_COUNT:
        raise GresSpecError(f"{value!r} is too large a count (at most {MAX_COUNT}, 2**63 - 1)")
    return count


def _split_items(value: str) -> list[str]:
    """Split on commas outside parentheses (``gpu:2(S:0,1)`` stays one item)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return items


def parse_gres(value: str) -> list[GresSpec]:
    """Parse a node's ``Gres=`` value into its items.

    Examples: ``"gpu:4"`` -> [gpu x4]; ``"gpu:a100:4,gpu:v100:2"`` -> two typed
    items; ``"gpu"`` -> [gpu x1]; ``"bandwidth:lustre:no_consume:4G"``.
    An affinity suffix in parentheses (``gpu:2(S:0-1)``) is ignored.

    Returns:
        One `GresSpec` per item, in the order written; [] for an empty value
        or ``(null)``.

    Raises:
        GresSpecError: an empty item or name, a bad count, or too many fields.
    """
    value = value.strip()
    if not value or value.lower() in ("(null)", "none"):
        return []
    specs = []
    for raw in _split_items(value):
        item = raw.strip()
        if "(" in item:
            item = item[:item.index("(")]
        if not item:
            raise GresSpecError(f"Gres={value}: empty item")
        fields = item.split(":")
        name, rest = fields[0], fields[1:]
        if not name:
            raise GresSpecError(f"Gres={value}: item {raw!r} has no name")
        count = 1
        if rest and rest[-1][:1].isdigit():
            try:
                count = parse_count(rest[-1])
            except GresSpecError as exc:
                raise GresSpecError(f"Gres={value}: in {raw!r}, {exc}") from None
            rest = rest[:-1]
        no_consume = False
        if rest and rest[-1].lower() == "no_consume":
            no_consume = True
            rest = rest[:-1]
        if len(rest) > 1 or (rest and not rest[0]):
            raise GresSpecError(f"Gres={value}: {raw!r} is not name[:type][:no_consume][:count]")
        specs.append(GresSpec(name=name, type=rest[0] if rest else None, count=count,
                              no_consume=no_consume))
    return specs
