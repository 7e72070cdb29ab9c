"""`malleable submit`: submit a batch script as a malleable job.

::

    malleable submit --gpus 2-16 --step 4 --batch 256 --target-steps 50000 -p gpu train.sbatch

does what ``sbatch`` does, plus what the job contract needs (DESIGN.md section 5):

* the malleable spec goes into ``--comment`` (merged, field by field, from the
  script's own ``#SBATCH --comment`` spec, then a ``--comment`` given here, then
  ``--spec``, then the options; the other text of the comment that sbatch would
  use, the command line's or else the script's, is kept);
* ``--requeue`` and ``--open-mode=append`` (a requeue must neither be refused nor
  truncate the output);
* the GPU request for the initial size (``--initial-gpus``, default the smallest
  size the job can start on that holds the initial batch at the per-GPU limit,
  `start_sizes`; usually the minimum of the range): one node with k GPUs when k
  fits on a node, else k/g whole nodes of g GPUs (g from the cluster);
* the job's environment gets MALLEABLE_SIGNAL (the spec's signal),
  MALLEABLE_BATCH_SIZE (the spec's batch, if any) and MALLEABLE_SPOOL (the
  configured spool), which `Reporter.from_env` reads.

Options it does not know are passed to sbatch as given, so the script is the
last argument (script arguments are not supported: pass them through the
environment). GPU requests (``--gres``, ``--gpus*``, ``-G``, ``-N``/``--nodes``)
are refused: the spec decides the size; so are options that would undo the
contract (``--no-requeue``, an ``--open-mode`` other than append, an
``--export`` without ALL: `contract_conflict`). The script's ``#SBATCH`` lines are
read as sbatch reads them (`script_directives`); what sbatch would refuse in them is
refused first, naming the line: e.g. ``#SBATCH --comment=malleable:gpus=1-4
step=2``, where sbatch splits the line at the blank, takes ``malleable:gpus=1-4``
for the comment and refuses the script over ``step=2`` ("Invalid directive"),
so submit tells to join the spec's fields by commas or to quote the comment.
Prints the job id. Exit codes: 0 submitted, 1 Slurm refused or did not answer, 2
bad input (one line naming the field and the value, e.g. a bad spec).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import sys

import click

from malleable.clitypes import one_line
from malleable.config import ConfigError, load_config
from malleable.safe_text import safe_text
from malleable.slurm import connect_once
from malleable.slurm.client import InvalidArgument, SlurmError
from malleable.slurm.jobid import check_count
from malleable.slurm.records import ClusterInfo, SubmitRequest
from malleable.spec import (
    MalleableSpec,
    SpecError,
    find_spec,
    parse_spec,
    replace_spec,
    spec_fields,
)

# Our option -> spec key (values are validated by parse_spec, with its messages).
_SPEC_OPTIONS = {
    "gpus": "gpus", "step": "step", "signal": "signal", "signal_target": "signal_target",
    "grace": "grace", "shrink": "shrink", "target_steps": "target_steps",
    "target_samples": "target_samples", "target_epochs": "target_epochs",
    "samples_per_epoch": "samples_per_epoch", "target_metric": "target_metric",
    "metric_goal": "metric_goal", "batch": "batch", "max_batch": "max_batch",
    "max_local_batch": "max_local_batch", "model": "model", "restart_cost": "restart_cost",
}
# sbatch reads a line that starts with "#SBATCH" in its first column, with or without a
# blank before the options ("#SBATCH--gpus=2" too).
_SBATCH_LINE = re.compile(r"^#SBATCH(.*)$")
# sbatch options that take a value, read by `contract_conflict` (also as two words).
_VALUED = ("--open-mode", "--export", "--tres-per-task")


class SubmitError(Exception):
    """Bad input for `malleable submit`; exit code 2, message names field and value."""


def script_directives(path: str) -> list[str]:
    """The option words of a batch script's ``#SBATCH`` lines (those sbatch reads: up to
    the first line that is neither blank nor a comment), split as sbatch splits them
    (`_split_directive`).

    Args:
        path: the batch script.

    Returns:
        The words of every ``#SBATCH`` line, in order (sbatch reads them as one
        command line).

    Raises:
        SubmitError: the script cannot be read; its first line is not ``#!`` and an
            interpreter; it has DOS line breaks; an ``#SBATCH`` line has an unmatched
            quote; or a word is neither an option nor an option's value
            (`_stray_word`), e.g. ``step=2`` in ``#SBATCH --comment=malleable:gpus=1-4
            step=2``: sbatch refuses each of these scripts, so submit refuses them first,
            naming the line (exit 2).
    """
    try:
        # (newline="": line breaks as written, so that DOS ones are seen)
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            text = fh.read(1 << 20)
    except OSError as exc:
        raise SubmitError(f"script {path}: {exc.strerror}") from None
    if not text.startswith("#!"):
        raise SubmitError(f"script {path}: its first line must be #! and an interpreter "
                          f"(e.g. #!/bin/bash), as sbatch requires")
    if "\r\n" in text:
        raise SubmitError(f"script {path}: DOS line breaks (\\r\\n), which sbatch refuses "
                          f"(convert it, e.g. with dos2unix)")
    lines: list[tuple[int, str, list[str]]] = []
    for i, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if i == 0 and line.startswith("#!"):
            continue
        if line and not line.startswith("#"):
            break
        m = _SBATCH_LINE.match(raw.rstrip("\r"))
        if m:
            try:
                lines.append((i + 1, line, _split_directive(m.group(1))))
            except ValueError as exc:
                raise SubmitError(f"script {path}: line {i + 1}: {line}: {exc}, which "
                                  f"sbatch refuses") from None
    stray = _stray_word(lines)
    if stray is not None:
        raise SubmitError(f"script {path}: {stray}")
    return [w for _, _, words in lines for w in words]


def _split_directive(text: str) -> list[str]:
    """Split an #SBATCH line's options like sbatch does: blanks separate words unless
    quoted (a backslash does not join them), quotes group, a backslash takes the next
    character as it is (\\# \\" \\'), an unquoted # ends the line, and so does an empty
    word ("" or '').

    Raises:
        ValueError: an unmatched quote (sbatch stops with "Unmatched `"`").
    """
    words: list[str] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        cur: list[str] = []
        quote, escaped = "", False
        while pos < n and (quote or not text[pos].isspace()):
            ch = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
                continue
            elif quote:
                if ch == quote:
                    quote = ""
                    continue
            elif ch in "\"'":
                quote = ch
                continue
            elif ch == "#":     # (unquoted, even inside a word: sbatch ends the line there)
                pos = n
                break
            cur.append(ch)
        if quote:
            raise ValueError(f"unmatched {quote} quote")
        if not cur:             # the end of the line, a #, or an empty word: sbatch stops
            return words
        words.append("".join(cur))


# What sbatch reads a directive word as (getopt's view, `_stray_word`): an option, the
# value of the option before it, either (the value of a long option whose arity submit
# does not know), or nothing after "--" (getopt stops there).
_OPTION, _VALUE, _EITHER, _NONE = "option", "value", "either", "none"
# The words that separate the components of a heterogeneous job (each is read afresh).
_HETJOB_WORDS = ("hetjob", "packjob")
# sbatch long options submit knows to take a value ("--comment TEXT" too) or none.
_LONG_VALUED = frozenset(("comment", "nodes", "gres", "gpus", "gpus-per-node",
                          "gpus-per-task", "gpus-per-socket", "tres-per-node",
                          "tres-per-task", "open-mode", "export", "wrap", "signal"))
_LONG_NO_VALUE = frozenset(("requeue", "no-requeue"))


def _after_short(word: str) -> str:
    """What the word after a bundle of short options is: the last option's value when it
    takes one and the bundle ends at it (``-p gpu``), else an option (``-pgpu``, ``-H``;
    -k's value is optional, so only ever attached)."""
    letters = word[1:]
    for j, ch in enumerate(letters):
        if ch in _SHORT_NO_ARG:
            continue
        if ch == "k":
            return _OPTION
        return _VALUE if j == len(letters) - 1 else _OPTION
    return _OPTION


def _stray_word(lines: list[tuple[int, str, list[str]]]) -> str | None:
    """The first directive word sbatch would refuse as "Invalid directive found in batch
    script", described on one line, or None.

    sbatch reads the words of all ``#SBATCH`` lines as one command line, with getopt,
    and refuses the script at the first word that is neither an option nor the value
    of the option before it: ``step=2`` in ``#SBATCH --comment=malleable:gpus=1-4
    step=2`` (the comment is ``malleable:gpus=1-4``; it does not drop ``step=2``). Only
    what is sure is reported: after a long option whose arity submit does not know
    (``--partition gpu``), the next word is taken for its value.

    Args:
        lines: (line number, line, words) of each ``#SBATCH`` line, in order.

    Returns:
        "line N: LINE: why", naming the refused words; for words after a comment's
        value, how to write the comment instead (quoted, or its spec's fields joined by
        commas). None if sbatch would read every word.
    """
    state = _OPTION
    comment_at: tuple[int, int, str] | None = None   # (line, word, value) of the comment
    comment_next = False                          # the next word is the comment's value
    for li, (lineno, line, words) in enumerate(lines):
        for k, w in enumerate(words):
            if state == _VALUE:
                state = _OPTION
                if comment_next:
                    comment_at, comment_next = (li, k, w), False
                continue
            if state != _NONE and w.lower() in _HETJOB_WORDS:
                state = _OPTION       # the next component's options start afresh
                break
            if state != _NONE and w.startswith("-") and w != "-":
                if w == "--":
                    state = _NONE
                    continue
                if w.startswith("--"):
                    name, eq, _ = w[2:].partition("=")
                    is_comment = len(name) >= 3 and "comment".startswith(name)
                    if eq:
                        state = _OPTION
                        if is_comment:
                            comment_at = (li, k, w.split("=", 1)[1])
                    elif name in _LONG_VALUED or is_comment:
                        state, comment_next = _VALUE, is_comment
                    else:
                        state = _OPTION if name in _LONG_NO_VALUE else _EITHER
                else:
                    state = _after_short(w)
                continue
            if state == _EITHER:
                state = _OPTION
                continue
            refused = list(itertools.takewhile(lambda x: not x.startswith("-"), words[k:]))
            if comment_at is not None and comment_at[:2] == (li, k - 1):
                return f"line {lineno}: {line}: " + _split_comment(comment_at[2], refused)
            why = ("getopt reads no option after --" if state == _NONE
                   else "neither an option nor an option's value")
            return (f"line {lineno}: {line}: {' '.join(refused) or w!r}: {why}; sbatch "
                    f"refuses the script (Invalid directive found in batch script); quote "
                    f"a value that holds blanks")
    return None


def _split_comment(value: str, refused: list[str]) -> str:
    """Why the words ``refused`` after a comment's ``value`` (on its line) are refused,
    and how to write the comment instead."""
    joined = " ".join([value, *refused])
    q = "'" if '"' in joined else '"'
    fix = f"quote the comment: --comment={q}{joined}{q}"
    try:
        spec_fields(joined)
    except SpecError:          # quoted, the spec would end at the blank: use commas
        commas = ",".join([value, *refused])
        span = find_spec(commas)
        if span is not None and span[1] == len(commas) and find_spec(value) is not None:
            fix = f"separate the spec's fields by commas: --comment={commas}"
        else:
            fix += " (and separate the spec's fields by commas)"
    return (f"sbatch splits #SBATCH lines at blanks: the comment would be {value!r}, and "
            f"sbatch refuses the script over {' '.join(refused)!r}, which is not an option "
            f"(Invalid directive found in batch script); {fix}")


def comment_in(words: list[str]) -> str | None:
    """The value of the last ``--comment`` among sbatch option words (None: none)."""
    value = None
    for i, w in enumerate(words):
        if w.startswith("--comment="):
            value = w.split("=", 1)[1]
        elif w == "--comment" and i + 1 < len(words):
            value = words[i + 1]
    return value


# The sbatch long options submit reads or refuses: sbatch takes an unambiguous prefix of
# an option (getopt_long), so a prefix of one of these is that option to us too.
_READ_OPTIONS = ("nodes", "gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket",
                 "tres-per-node", "tres-per-task", "no-requeue", "requeue", "open-mode",
                 "export", "wrap", "comment", "signal")


def full_option_names(words: list[str]) -> list[str]:
    """``words`` with each abbreviated long option of `_READ_OPTIONS` spelled out
    (``--gpus-per-nod=4`` -> ``--gpus-per-node=4``), as sbatch reads it.

    Raises:
        SubmitError: a prefix of several of them (sbatch would refuse it as ambiguous,
            or read another option).
    """
    out = []
    for w in words:
        if w == "--":
            out.extend(words[len(out):])
            break
        if not w.startswith("--") or len(w) <= 2:
            out.append(w)
            continue
        name, eq, value = w[2:].partition("=")
        if name in _READ_OPTIONS or len(name) < 3:   # ("--co": sbatch finds it ambiguous)
            out.append(w)
            continue
        full = [o for o in _READ_OPTIONS if o.startswith(name)]
        if len(full) > 1:
            raise SubmitError(f"--{name}: an abbreviation of sbatch's "
                              f"{', '.join('--' + f for f in full)}: spell the option out")
        out.append(f"--{full[0]}{eq}{value}" if full else w)
    return out


def contract_conflict(words: list[str]) -> str | None:
    """Why one of these sbatch option words would undo the job contract, or None.

    sbatch takes the last of an option given twice, and the options given to
    `malleable submit` come after the ones it adds, so each of these would win:
    ``--no-requeue`` (a checkpoint-requeue would be refused), ``--open-mode`` other
    than ``append`` (each requeue would truncate the output), ``--export`` without
    ``ALL`` (MALLEABLE_SPOOL, MALLEABLE_SIGNAL and MALLEABLE_BATCH_SIZE would not
    reach the job), and a GPU in ``--tres-per-task`` (the spec sets the GPU request).

    Args:
        words: the sbatch option words given to `malleable submit`, in order
            (``--opt=value`` or ``--opt value``).

    Returns:
        One line naming the option and its value, or None if none conflicts.
    """
    i = 0
    while i < len(words):
        w = words[i]
        name, value = w.split("=", 1) if w.startswith("--") and "=" in w else (w, None)
        if value is None and name in _VALUED and i + 1 < len(words):
            value = words[i + 1]
            i += 1
        shown = f"{name}={value}" if value is not None else name
        if name == "--no-requeue":
            return (f"{shown}: a malleable job must be requeueable (malleable submit "
                    f"adds --requeue: its checkpoint-requeue needs it)")
        if name == "--open-mode" and value != "append":
            return (f"{shown}: each requeue would truncate the job's output (malleable "
                    f"submit adds --open-mode=append)")
        if name == "--export" and value is not None and \
                "ALL" not in [v.strip().upper() for v in value.split(",")]:
            return (f"{shown}: MALLEABLE_SPOOL, MALLEABLE_SIGNAL and MALLEABLE_BATCH_SIZE "
                    f"would not reach the job (use --export=ALL,NAME=VALUE,...)")
        if name == "--tres-per-task" and value is not None and "gpu" in value.lower():
            return (f"{shown}: malleable submit sets the GPU request from the spec "
                    f"(use --gpus MIN-MAX and --initial-gpus)")
        i += 1
    return None


# sbatch's short options (its getopt string): those that take no argument, and the one
# whose argument is optional ("k"); every other letter takes the rest of its word.
_SHORT_NO_ARG = frozenset("hHIOQsuvVW")


def _bundled(word: str) -> list[str]:
    """The short options of one word as getopt reads a bundle ("-vG2": -v, -G; "-pG":
    -p only, G is its argument); [] for a word that is not short options."""
    if not word.startswith("-") or word.startswith("--") or len(word) < 2:
        return []
    out = []
    for ch in word[1:]:
        out.append("-" + ch)
        if ch not in _SHORT_NO_ARG:     # takes the rest of the word (or the next word)
            break
    return out


# sbatch options that would fight the size the spec sets: GPU requests (also -G), and the
# node count and --gres (also -N) that submit passes itself. In a script only the
# first are refused: the command line's --nodes and --gres replace the script's own,
# while sbatch keeps the others beside them.
_GPU_OPTIONS = frozenset(("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket",
                          "--tres-per-node"))
_SUBMITS_OWN = frozenset(("--nodes", "--gres"))


def _requests_size(word: str, in_script: bool = False) -> bool:
    """Whether an sbatch option word sets the job's size (see `_GPU_OPTIONS`); short
    options are read as getopt reads a bundle (``-vG2`` holds -G)."""
    name = word.split("=", 1)[0]
    if name in _GPU_OPTIONS or (not in_script and name in _SUBMITS_OWN):
        return True
    return any(o[1] in ("G" if in_script else "GN") for o in _bundled(word))


def script_conflict(words: list[str]) -> str | None:
    """Why one of a script's ``#SBATCH`` option words would undo the job contract, or None.

    sbatch lets the command line override the script, and `malleable submit` passes
    ``--nodes``, ``--gres``, ``--requeue`` and ``--open-mode=append``: the script's
    own of those are replaced, not refused. A GPU request under another option
    (``--gpus-per-node``, ``-G``, ...) would be added to the spec's, and an
    ``--export`` without ``ALL`` or a GPU in ``--tres-per-task`` is not overridden.

    Args:
        words: the script's directive words (`script_directives`), abbreviations
            spelled out (`full_option_names`).

    Returns:
        One line naming the option and its value, or None if none conflicts.
    """
    bad = next((w for w in words if _requests_size(w, in_script=True)), None)
    if bad:
        return (f"#SBATCH {bad}: malleable submit sets the GPU request from the spec "
                f"(use --gpus MIN-MAX and --initial-gpus, or the spec's gpus=)")
    kept = [w for w in words if w != "--no-requeue" and not w.startswith("--open-mode")]
    conflict = contract_conflict(kept)
    return None if conflict is None else "#SBATCH " + conflict


def without_comment(words: list[str]) -> list[str]:
    """``words`` without their ``--comment`` options."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w == "--comment":
            skip = True
        elif not w.startswith("--comment="):
            out.append(w)
    return out


def build_spec(comments: list[str | None], spec_text: str | None,
               options: dict[str, str | None]) -> MalleableSpec:
    """Merge the specs in ``comments`` (the script's, then the command line's), then
    ``--spec``, then the options: later wins, field by field.

    Raises:
        SpecError: the merged spec is invalid (names the field and the value).
    """
    fields: dict[str, str] = {}
    sources = ("the script's --comment", "the command line's --comment")
    for i, comment in enumerate(comments):
        fields.update(_fields_once(comment or "", sources[min(i, 1)]))
    if spec_text:
        given = spec_text
        if find_spec(spec_text) is None:
            spec_text = "malleable:" + spec_text
        start, end = find_spec(spec_text) or (0, 0)
        rest = spec_text[end:].strip()
        if end == start + len("malleable:") or rest:
            raise SpecError(f"malleable spec: --spec {given!r}: expected "
                            f"key=value fields separated by commas, e.g. gpus=2-16,step=4"
                            + (f" (cannot read {rest!r})" if rest else ""), value=spec_text)
        fields.update(_fields_once(spec_text, "--spec"))
    for key, value in options.items():
        if value is not None and (not value or any(c in value for c in ",=") or
                                  any(c.isspace() for c in value)):
            raise SpecError(f"malleable spec: {key}={value!r}: a value cannot be empty or "
                            f"hold ',', '=' or spaces", field=key, value=value)
    fields.update({key: value for key, value in options.items() if value is not None})
    if "gpus" not in fields:
        raise SpecError("malleable spec: gpus: missing; give the GPU range, e.g. --gpus 2-16",
                        field="gpus")
    spec = parse_spec("malleable:" + ",".join(f"{k}={v}" for k, v in fields.items()))
    assert spec is not None  # a "malleable:" text yields a spec or raises
    return spec


def _fields_once(text: str, source: str) -> list[tuple[str, str]]:
    """`spec_fields` of one source (named in the error), refusing a key it gives twice
    (as `parse_spec` does)."""
    try:
        pairs = spec_fields(text)
    except SpecError as exc:
        raise SpecError(f"{exc} (in {source})", field=exc.field, value=exc.value) from None
    seen: set[str] = set()
    for key, value in pairs:
        if key in seen:
            raise SpecError(f"malleable spec: {key}={value}: key given twice (in {source})",
                            field=key, value=value)
        seen.add(key)
    return pairs


def _top(spec: MalleableSpec, most: int) -> int:
    """The most GPUs a job of ``spec`` can run on: ``max_gpus``, at most ``most`` (> 0),
    and at most its largest global batch (``max_batch``, else its fixed ``batch``), since
    every GPU needs a sample of each step."""
    hi = spec.max_gpus if most <= 0 else min(spec.max_gpus, most)
    top = spec.max_batch_size if spec.max_batch_size is not None else spec.batch_size
    return hi if top is None else min(hi, top)


def start_sizes(spec: MalleableSpec, gpus_per_node: int, *, least: int = 0, most: int = 0,
                count: int = 13) -> list[int]:
    """The GPU counts a job of ``spec`` can start on, ascending, computed (not searched).

    A size can start if the spec allows it (`MalleableSpec.allows`: ``min_gpus`` or a
    multiple of ``step`` up to ``max_gpus``), its largest global batch gives each GPU a
    sample (at most ``max_batch``, else the fixed ``batch``, GPUs), and Slurm can give it
    on nodes of g GPUs: one node (at most g) or whole nodes (a multiple of g).

    Args:
        spec: the job's spec.
        gpus_per_node: g (>= 1; a smaller value is taken as 1).
        least: only sizes >= this (GPUs; 0: no bound).
        most: only sizes <= this (GPUs; 0: no bound), e.g. the cluster's GPUs.
        count: at most this many sizes (the first ones).

    Returns:
        Up to ``count`` sizes in GPUs, ascending; [] if none.
    """
    g, lo, step = max(1, gpus_per_node), spec.min_gpus, spec.step
    hi = _top(spec, most)
    out = [lo] if least <= lo <= hi and (lo <= g or lo % g == 0) else []
    # Within one node: multiples of step in (lo, min(hi, g)].
    k = (max(lo, least - 1) // step + 1) * step
    while k <= min(hi, g) and len(out) < count:
        out.append(k)
        k += step
    # Whole nodes: multiples of lcm(step, g) in (max(lo, g), hi].
    lcm = step * g // math.gcd(step, g)
    k = (max(lo, g, least - 1) // lcm + 1) * lcm
    while k <= hi and len(out) < count:
        out.append(k)
        k += lcm
    return out[:count]


def largest_size(spec: MalleableSpec, gpus_per_node: int, most: int = 0) -> int:
    """The largest of `start_sizes` (GPUs), 0 if none.

    Args:
        spec: the job's spec.
        gpus_per_node: g.
        most: only sizes <= this (GPUs; 0: no bound), e.g. the cluster's GPUs.
    """
    g, lo, step = max(1, gpus_per_node), spec.min_gpus, spec.step
    hi = _top(spec, most)
    sizes = [lo] if lo <= hi and (lo <= g or lo % g == 0) else []
    lcm = step * g // math.gcd(step, g)
    sizes += [k for k in ((min(hi, g) // step) * step, (hi // lcm) * lcm) if lo < k <= hi]
    return max(sizes, default=0)


def _listed(sizes: list[int], count: int = 12) -> str:
    return ", ".join(map(str, sizes[:count])) + (", ..." if len(sizes) > count else "")


def initial_shape(spec: MalleableSpec, gpus: int | None, gpus_per_node: int,
                  cluster_gpus: int = 0) -> tuple[int, int]:
    """(nodes, GPUs per node) for the initial size.

    Without ``gpus``, the initial size is the smallest of `start_sizes` that holds the
    initial batch at the per-GPU limit (`MalleableSpec.smallest_usable_gpus`).

    Args:
        spec: the job's spec.
        gpus: the initial size (``--initial-gpus``), or None.
        gpus_per_node: g, the cluster's GPUs per node.
        cluster_gpus: the cluster's GPUs (0: unknown, not checked).

    Returns:
        (nodes, GPUs per node): (1, k) for k <= g, else (k / g, g).

    Raises:
        SubmitError: no size can start the job; or the size is not one the job can start
            on, cannot hold the batch, exceeds the cluster, or is more nodes than a
            request can have. The message names the size (and the option, if given) and
            lists sizes the job can start on.
    """
    g = max(1, gpus_per_node)
    need = spec.smallest_usable_gpus()
    where = f"on {g}-GPU nodes" + (f", {cluster_gpus} GPUs in all" if cluster_gpus > 0 else "")
    holds = f"batch={spec.batch_size} at max_local_batch={spec.max_local_batch_size}"
    fits = start_sizes(spec, g, least=need, most=cluster_gpus)
    if gpus is None:
        if not fits:
            any_size = start_sizes(spec, g, most=cluster_gpus)
            why = (f"none holds {holds} per GPU (sizes it can start on, {where}: "
                   f"{_listed(any_size)})" if any_size else
                   f"it allows gpus={spec.min_gpus}-{spec.max_gpus} with step={spec.step}, "
                   f"and none of these is one node or whole nodes")
            raise SubmitError(f"no size can start the job {where}: {why}")
        k = fits[0]
        what = (f"the initial size, {k} GPUs (the spec's minimum: no --initial-gpus given)"
                if k == spec.min_gpus else
                f"the initial size, {k} GPUs (the smallest that holds {holds} {where}: no "
                f"--initial-gpus given)")
    else:
        k, what = gpus, f"--initial-gpus={gpus}"
        shown = start_sizes(spec, g, most=cluster_gpus)
        top = _top(spec, 0)
        if not spec.allows(k) or not (k <= g or k % g == 0) or k > top:
            problem = ("not allowed by the spec" if not spec.allows(k) else
                       f"more than one node ({g} GPUs) but not whole nodes"
                       if not (k <= g or k % g == 0) else
                       f"more GPUs than its largest global batch ({top} samples) can give "
                       f"a sample each")
            raise SubmitError(f"{what}: {problem} (sizes it can start on, {where}: "
                              f"{_listed(shown) if shown else 'none'})")
        if k < need:
            first = (f"; {fits[0]} is the smallest size it can start on that holds it"
                     if fits else "; no size it can start on holds it")
            raise SubmitError(f"{what}: {k} GPUs cannot hold batch={spec.batch_size} at "
                              f"max_local_batch={spec.max_local_batch_size} per GPU{first}")
        if 0 < cluster_gpus < k:
            raise SubmitError(f"{what}: more than the cluster's {cluster_gpus} GPUs; the job "
                              f"could never start (sizes it can start on, {where}: "
                              f"{_listed(shown) if shown else 'none'})")
    if k <= g:
        return 1, k
    try:
        check_count("nodes", k // g)   # the port's bound on a request, named for the user
    except InvalidArgument as exc:
        raise SubmitError(f"{what}: {k // g} nodes of {g} GPUs; {exc}") from None
    return k // g, g


def malleable_request(script: str, spec: MalleableSpec, *, initial_gpus: int | None,
                      gpus_per_node: int, spool_dir: str, name: str = "", cluster_gpus: int = 0,
                      base_comment: str = "", extra_args: tuple[str, ...] | list[str] = (),
                      extra_env: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (),
                      workdir: str = "") -> SubmitRequest:
    """The `SubmitRequest` of a malleable job (what `malleable submit` and `malleable
    replay` send through the Slurm port).

    Args:
        script: the batch script.
        spec: the job's malleable spec (goes into the comment, replacing any spec
            in ``base_comment``; the comment's other text is kept).
        initial_gpus: GPUs to start on (None: the spec's minimum).
        gpus_per_node: g, to shape the request (`initial_shape`).
        cluster_gpus: the cluster's GPUs, to refuse an initial size above them (0:
            unknown).
        spool_dir: the progress spool (MALLEABLE_SPOOL for the job).
        name: job name ("" = Slurm's default).
        extra_args: further sbatch options, as given.
        extra_env: further environment for the job.
        workdir: the job's working directory ("" = the caller's).

    Raises:
        SubmitError: the initial size is outside the spec or not a legal shape.
    """
    nodes, per_node = initial_shape(spec, initial_gpus, gpus_per_node, cluster_gpus)
    env = [("MALLEABLE_SIGNAL", spec.signal), ("MALLEABLE_SPOOL", spool_dir)]
    if spec.batch_size is not None:
        env.append(("MALLEABLE_BATCH_SIZE", str(spec.batch_size)))
    env.extend(extra_env)
    return SubmitRequest(script=os.path.abspath(script), nodes=nodes, gpus_per_node=per_node,
                         comment=replace_spec(base_comment, spec), name=name, requeue=True,
                         open_mode_append=True, extra_args=tuple(extra_args), env=tuple(env),
                         workdir=workdir)


def check_capacity(spec: MalleableSpec, cluster: ClusterInfo) -> str | None:
    """Compare the spec's GPU range with the cluster's GPUs (``nodes`` x ``gpus_per_node``).

    Returns:
        A warning when ``max_gpus`` exceeds the cluster (the job never gets more than
        the largest size it can start on within the cluster, `largest_size`), else
        None; None too when the cluster's size is unknown.

    Raises:
        SubmitError: ``min_gpus``, or the fewest GPUs that hold the initial batch at the
            per-GPU limit (`MalleableSpec.smallest_usable_gpus`), exceeds the cluster:
            the job could never start.
    """
    total = cluster.nodes * cluster.gpus_per_node
    if total <= 0:
        return None
    shape = f"{total} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node})"
    if spec.min_gpus > total:
        raise SubmitError(f"gpus={spec.min_gpus}-{spec.max_gpus}: the minimum exceeds the "
                          f"cluster's {shape}; the job could never start")
    need = spec.smallest_usable_gpus()
    if need > total:
        raise SubmitError(f"batch={spec.batch_size} at max_local_batch="
                          f"{spec.max_local_batch_size} per GPU needs at least {need} GPUs, "
                          f"more than the cluster's {shape}; the job could never start")
    if spec.max_gpus > total:
        top = largest_size(spec, cluster.gpus_per_node, most=total)
        return (f"gpus={spec.min_gpus}-{spec.max_gpus}: the cluster has {shape}; the job "
                f"will run on at most {top}")
    return None


def _fail(message: str, code: int) -> None:
    """Print the error on one line (Slurm's own messages may span several) and exit."""
    click.echo(f"malleable submit: error: {safe_text(one_line(message))}", err=True)
    sys.exit(code)


class _SubmitCommand(click.Command):
    """Keeps the command line's words (``ctx.meta["submit.words"]``): an option of ours
    given twice is warned about (the last wins, as sbatch's do)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["submit.words"] = list(args)
        return super().parse_args(ctx, args)


# Where sbatch's own --signal goes, for the two refusals that meet it on the command line.
_SBATCH_SIGNAL = "sbatch's --signal=[B:]SIG@TIME goes in an #SBATCH line of the script"


def _repeated_options(cmd: click.Command, words: list[str]) -> list[tuple[str, int]]:
    """Our value options given more than once, anywhere on the command line (click reads
    them after the script too), up to ``--``: (name, times). An option's value word is
    skipped (``--model --gpus`` is one --model)."""
    ours = {o: p for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
    seen: dict[str, int] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            break
        p = ours.get(w.split("=", 1)[0] if w.startswith("--") else w)
        if p is not None and not p.is_flag:
            seen[p.opts[-1]] = seen.get(p.opts[-1], 0) + 1
            if "=" not in w:
                i += 1   # its value
        i += 1
    return [(n, k) for n, k in seen.items() if k > 1]


@click.command("submit", cls=_SubmitCommand,
               context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": True})
@click.option("--spec", "spec_text", metavar="SPEC",
              help="A whole spec, e.g. 'gpus=2-16,step=4' (with or without 'malleable:').")
@click.option("--gpus", metavar="MIN-MAX",
              help="GPU range, e.g. 2-16 (or N); required unless the spec has gpus=.")
@click.option("--step", metavar="N",
              help="GPU counts above the minimum are multiples of N (default 1).")
@click.option("--signal", metavar="SIG", help="Checkpoint signal (default USR1).")
@click.option("--signal-target", metavar="batch|full|steps",
              help="Which processes get the signal (default batch).")
@click.option("--grace", metavar="SECONDS",
              help="Time to checkpoint after the signal: 120, 90s, 2m, 1h (default 120).")
@click.option("--shrink", metavar="inplace|requeue",
              help="Can it lose nodes while running (inplace), or is shrinking a "
                   "checkpoint-requeue (default requeue)?")
@click.option("--target-steps", metavar="N", help="Iterations to run (default: none).")
@click.option("--target-samples", metavar="N", help="Samples to process (default: none).")
@click.option("--target-epochs", metavar="N",
              help="Epochs to run, counted in samples with --samples-per-epoch "
                   "(default: none).")
@click.option("--samples-per-epoch", metavar="N",
              help="Data set size in samples (default: none).")
@click.option("--target-metric", metavar="X",
              help="Stop when the logged metric reaches X (default: none).")
@click.option("--metric-goal", metavar="max|min",
              help="Is a larger (max) or smaller (min) metric better (default max)?")
@click.option("--batch", metavar="N",
              help="Initial global batch size m0 (default: the first one the job logs).")
@click.option("--max-batch", metavar="N",
              help="Largest global batch, >= --batch (default: none).")
@click.option("--max-local-batch", metavar="N",
              help="Largest per-GPU batch (default: none).")
@click.option("--model", metavar="NAME",
              help="Model name: jobs of one model share estimates (priors), e.g. cifar10 "
                   "(default: none).")
@click.option("--restart-cost", metavar="SECONDS",
              help="Seconds a checkpoint-requeue costs the job (default: measured).")
@click.option("--initial-gpus", type=click.IntRange(min=1), metavar="K",
              help="GPUs to start on (default: the smallest size the job can start on, one "
                   "node or whole nodes, that holds --batch at --max-local-batch per GPU; "
                   "usually the minimum of the range).")
@click.option("--config", "config_path", metavar="PATH",
              help="malleable.toml to use (default $MALLEABLE_CONFIG or "
                   "/etc/malleable/malleable.toml).")
@click.option("--dry-run", is_flag=True,
              help="Print the sbatch command line (with its environment) instead of "
                   "submitting.")
@click.option("--gpus-per-node", "offline_gpn", type=click.IntRange(1, 1024), metavar="G",
              help="With --dry-run: the cluster's GPUs per node, so that the spec is checked "
                   "and the command printed without contacting Slurm (the cluster's size is "
                   "then not checked).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True,
                metavar="[SBATCH_OPTIONS]... SCRIPT")
def submit(spec_text, initial_gpus, config_path, dry_run, offline_gpn, args, **options) -> None:
    """Submit SCRIPT (the last argument) as a malleable job; other options go to sbatch.

    The spec needs a GPU range (--gpus, or gpus= in --spec or in the script's
    `#SBATCH --comment=malleable:...`). It is merged field by field: the script's
    comment, then a --comment given here, then --spec, then the options below; a
    later one wins, also an option given twice (with a warning).

    --gpus, --signal and --gpus-per-node are malleable's options here, not sbatch's.
    sbatch's GPU and node requests (--gres, --gpus*, -G, -N/--nodes,
    --tres-per-node) are refused: the spec decides the size. So are --no-requeue, an
    --open-mode other than append, an --export without ALL, and --wrap. In the
    script's #SBATCH lines the same GPU requests (but --gres and --nodes, which
    submit's own replace) and --export are refused too, and so is a word sbatch
    would refuse: sbatch splits #SBATCH lines at blanks, so in
    `#SBATCH --comment=malleable:gpus=1-4 step=2` the comment ends at the blank and
    step=2 is refused (write gpus=1-4,step=2, or quote a comment that holds blanks).
    Script arguments are not supported: pass them through the environment. Without a batch
    size (--batch), the daemon leaves the job to Slurm until the job logs one.

    Prints the job id. Exit status: 0 submitted, 1 Slurm refused or did not answer,
    2 bad input (one line naming the option and the value).
    """
    if offline_gpn is not None and not dry_run:
        _fail("--gpus-per-node: only with --dry-run (a submission reads the cluster's)", 2)
    ctx = click.get_current_context()
    for name, times in _repeated_options(ctx.command, ctx.meta.get("submit.words", [])):
        click.echo(f"malleable submit: warning: {name} given {times} times: the last one "
                   f"applies", err=True)
    signal = options.get("signal")
    if signal and any(c in signal for c in "@:"):
        _fail(f"--signal={signal}: here the spec's checkpoint signal (e.g. USR1); "
              f"{_SBATCH_SIGNAL}", 2)
    script = args[-1]
    try:   # sbatch's abbreviations spelled out before any check reads an option
        passthrough = full_option_names(list(args[:-1]))
    except SubmitError as exc:
        _fail(str(exc), 2)
    for given, spelled in zip(args[:-1], passthrough, strict=False):
        if spelled == "--signal" or spelled.startswith("--signal="):
            # (click left it to sbatch: it reads an abbreviation as its own --signal)
            _fail(f"{given}: sbatch would read it as its --signal; here --signal is the "
                  f"spec's checkpoint signal: spell it out (--signal=USR1); "
                  f"{_SBATCH_SIGNAL}", 2)
    if any(w == "--wrap" or w.startswith("--wrap=") for w in [*passthrough, script]):
        _fail("--wrap: malleable submit needs a batch script file as its last argument "
              "(write the command into a script)", 2)
    if script.startswith("-"):
        _fail(f"{script}: the batch script must be the last argument", 2)
    if not os.path.exists(script):
        earlier = next((w for w in passthrough if not w.startswith("-") and os.path.isfile(w)),
                       None)
        if earlier is not None:
            _fail(f"{script}: no such file; the batch script ({earlier}?) must be the last "
                  f"argument: script arguments are not supported (pass them through the "
                  f"environment)", 2)
    bad = next((w for w in passthrough if _requests_size(w)), None)
    if bad:
        _fail(f"{bad}: malleable submit sets the GPU request from the spec "
              f"(use --gpus MIN-MAX and --initial-gpus)", 2)
    conflict = contract_conflict(passthrough)
    if conflict:
        _fail(conflict, 2)
    try:
        directives = full_option_names(script_directives(script))
        conflict = script_conflict(directives)
        if conflict:
            raise SubmitError(f"{script}: {conflict}")
        script_comment, own_comment = comment_in(directives), comment_in(passthrough)
        base_comment = own_comment if own_comment is not None else script_comment or ""
        spec = build_spec([script_comment, own_comment], spec_text,
                          {_SPEC_OPTIONS[k]: v for k, v in options.items()})
        config = load_config(config_path)
    except (SubmitError, SpecError, ConfigError) as exc:
        _fail(str(exc), 2)
    if spec.target_epochs is not None and spec.samples_per_epoch is None:
        click.echo(f"malleable submit: warning: target_epochs={spec.target_epochs} without "
                   f"samples_per_epoch: the epochs cannot be turned into samples, so this "
                   f"target is not used (give --samples-per-epoch)", err=True)
    try:
        if offline_gpn is None:
            client = connect_once(config.slurm)
            cluster = client.cluster()
            gpus_per_node = cluster.gpus_per_node
            cluster_gpus = max(0, cluster.nodes * cluster.gpus_per_node)
            warning = check_capacity(spec, cluster)
            if warning:
                click.echo(f"malleable submit: warning: {warning}", err=True)
        else:
            gpus_per_node, cluster_gpus = offline_gpn, 0
        top = largest_size(spec, gpus_per_node)
        if 0 < top < spec.max_gpus:
            click.echo(f"malleable submit: warning: gpus={spec.min_gpus}-{spec.max_gpus} with "
                       f"step={spec.step}: the largest size it allows on {gpus_per_node}-GPU "
                       f"nodes is {top} (above one node, only whole nodes)", err=True)
        request = malleable_request(script, spec, initial_gpus=initial_gpus,
                                    gpus_per_node=gpus_per_node, cluster_gpus=cluster_gpus,
                                    spool_dir=config.progress.spool_dir,
                                    base_comment=base_comment,
                                    extra_args=without_comment(passthrough))
    except (SubmitError, InvalidArgument) as exc:
        _fail(str(exc), 2)
    except SlurmError as exc:
        _fail(str(exc), 1)
    if dry_run:
        import shlex

        from malleable.slurm.backend_cli import sbatch_argv

        env = [f"{k}={v}" for k, v in request.env]
        try:
            argv = sbatch_argv(request)
        except InvalidArgument as exc:
            _fail(str(exc), 2)
        # (the script's words as typed, but a control character shows as its escape)
        click.echo(safe_text(shlex.join((["env", *env] if env else []) + argv)))
        return
    try:
        job_id = client.submit(request)
    except InvalidArgument as exc:
        _fail(str(exc), 2)
    except SlurmError as exc:
        _fail(str(exc), 1)
    click.echo(job_id)
