"""Slurm hostlist expressions: ``node[1-4,7]``, ``gpu[01-10]``, ``rack[1-2]-n[1-3]``.

Slurm writes sets of names (nodes, device files such as ``/dev/nvidia[0-3]``,
ports such as ``[17001-17004]``) as comma-separated items, each a prefix with
bracketed numeric ranges. A range keeps the zero padding of its lower bound
(``[01-10]`` gives ``01 .. 10``); several bracket groups in one item expand
as a cartesian product, leftmost slowest, as Slurm does.

`expand_hostlist` turns an expression into the list of names (order kept,
duplicates kept, as Slurm does); `compress_hostlist` is the inverse for
display. Both are pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import product

MAX_NAMES = 1_000_000
"""Largest expansion accepted; a bigger one is almost surely a typo (``node[1-10000000]``)."""


class HostlistError(ValueError):
    """A hostlist expression Slurm would refuse; the message names the expression and the fault."""


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets; raises HostlistError on unbalanced brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"{expr!r}: nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{expr!r}: ']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"{expr!r}: '[' is never closed")
    items.append(expr[start:])
    return items


def _expand_range(expr: str, body: str) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``01-03,7`` -> ['01', '02', '03', '7']."""
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise HostlistError(f"{expr!r}: empty range in [{body}]")
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"{expr!r}: {part!r} is not a number or a range a-b")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if a > b:
            raise HostlistError(f"{expr!r}: range {part!r} runs backwards")
        if b - a + 1 > MAX_NAMES:
            raise HostlistError(f"{expr!r}: range {part!r} has more than {MAX_NAMES} names")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_item(expr: str, item: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    for m in _GROUP.finditer(item):
        pieces.append([item[pos:m.start()]])
        pieces.append(_expand_range(expr, m.group(1)))
        pos = m.end()
    pieces.append([item[pos:]])
    total = 1
    for p in pieces:
        total *= len(p)
    if total > MAX_NAMES:
        raise HostlistError(f"{expr!r}: expands to more than {MAX_NAMES} names")
    return ["".join(combo) for combo in product(*pieces)]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into names.

    Args:
        expr: e.g. ``"node[1-4,7]"``, ``"gpu[01-10],login1"``, ``"/dev/nvidia[0-3]"``.
            Surrounding whitespace is ignored; an empty string gives [].

    Returns:
        The names in the order written (duplicates kept).

    Raises:
        HostlistError: unbalanced or nested brackets, an empty item or range, a
            non-numeric or backwards range, or more than `MAX_NAMES` names.
    """
    expr = expr.strip()
    if not expr:
        return []
    names: list[str] = []
    for item in _split_top(expr):
        item = item.strip()
        if not item:
            raise HostlistError(f"{expr!r}: empty item between commas")
        names.extend(_expand_item(expr, item))
        if len(names) > MAX_NAMES:
            raise HostlistError(f"{expr!r}: expands to more than {MAX_NAMES} names")
    return names


_TAIL = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Iterable[str]) -> str:
    """The shortest usual hostlist for ``names``: ``['n1','n2','n3','n7']`` -> ``'n[1-3,7]'``.

    Names are grouped by prefix and width of their trailing number (so
    ``n01`` and ``n1`` stay apart); groups appear in order of first appearance,
    numbers ascending within a group, duplicates dropped. Names without a
    trailing number are written as they are. ``expand_hostlist`` of the result
    gives the same set of names.
    """
    groups: dict[tuple[str, int], set[int]] = {}
    order: list[tuple[str, int] | str] = []
    plain: set[str] = set()
    parsed: list[tuple[str, str] | str] = []
    padded: dict[str, set[int]] = {}
    for name in names:
        m = _TAIL.match(name)
        if not m:
            parsed.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        parsed.append((prefix, digits))
        if digits.startswith("0") and len(digits) > 1:
            padded.setdefault(prefix, set()).add(len(digits))
    for item in parsed:
        if isinstance(item, str):
            if item not in plain:
                plain.add(item)
                order.append(item)
            continue
        prefix, digits = item
        if digits.startswith("0") and len(digits) > 1:
            width = len(digits)
        else:
            # An unpadded number joins the widest padded group it fits exactly
            # (gpu10 joins gpu[01-09] as width 2); otherwise width 0 (n1 .. n10).
            fits = [w for w in padded.get(prefix, ()) if w <= len(digits)]
            width = max(fits) if fits else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    out: list[str] = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, width = key
        nums = sorted(groups[key])
        ranges: list[str] = []
        start = prev = nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(a if start == prev else f"{a}-{b}")
            if n is not None:
                start = prev = n
        if len(nums) == 1:
            out.append(f"{prefix}{ranges[0]}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
