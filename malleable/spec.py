"""The malleable spec: how a job opts in, in one line of its Slurm comment.

A job is *malleable* (DESIGN.md section 5) when its ``sbatch --comment``
contains a spec such as::

    malleable:gpus=2-16,step=4,signal=USR1,grace=120,shrink=inplace,target_steps=50000,batch=256

Grammar (case-insensitive keys and prefix; values as below)::

    spec   := "malleable:" field ( sep field )*
    field  := key "=" value
    sep    := "," | ";"              (optionally surrounded by blanks)
    key    := [a-z_]+
    value  := one or more characters other than blanks , ; = " ' ( ) [ ] { } |

The spec may stand anywhere in the comment, among other text, as long as
``malleable:`` starts the comment or follows a blank or one of ``" ' ( [ {
| ; ,``. It ends at the first blank (or other character) that does not
continue it, so other text may follow. Slurm keeps commas and blanks of a
comment as given (checked on 22.05: ``squeue --json`` and ``scontrol show
job`` print it verbatim), but tools that split ``scontrol``'s text output on
blanks would cut a spec with blanks inside: `format_spec` never writes any,
and ``;`` is accepted in place of ``,`` for wrappers that mangle commas. A
comment may hold at most one spec.

Fields (key, aliases -> attribute; default):

=================  ============================  =======================================
key                attribute                     value (default)
=================  ============================  =======================================
gpus               min_gpus, max_gpus            ``A-B`` or ``N`` (= N-N); required
step               step                          int >= 1 (1): counts above min must be
                                                 multiples of it (e.g. whole nodes)
signal             signal                        USR1 USR2 TERM INT HUP QUIT ALRM URG
                                                 CONT WINCH, with or without ``SIG`` (USR1)
signal_target      signal_target                 ``batch``, ``full`` or ``steps`` (batch):
                                                 which processes get the signal (the batch
                                                 shell, which traps and forwards it; every
                                                 process; or only ``srun`` steps)
grace              grace_s                       seconds the job needs to checkpoint
                                                 after the signal; ``120``, ``90s``,
                                                 ``2m``, ``1h`` (120)
shrink             shrink_inplace                ``inplace`` or ``requeue`` (requeue):
                                                 can the job lose nodes while running?
target_steps       target_steps                  int >= 1, iterations to run (none)
target_samples     target_samples                int >= 1, samples to process (none)
target_epochs      target_epochs                 int >= 1, epochs to run (none)
samples_per_epoch  samples_per_epoch             int >= 1, data set size (none)
target_metric      target_metric                 finite float, stop when reached (none)
metric_goal        metric_goal                   ``max`` or ``min`` (max): is a larger
                                                 metric better?
batch              batch_size                    int in [1, 2**31-1], initial global batch m0 (none)
max_batch          max_batch_size                int in [batch, 2**31-1], largest global batch (none)
max_local_batch    max_local_batch_size          int in [1, 2**31-1], largest per-GPU batch (none)
model              model                         name, [A-Za-z0-9_.-]{1,64}, used for
                                                 priors and by the emulator (none)
restart_cost       restart_cost_s                seconds lost per checkpoint-requeue,
                                                 same units as grace (none: measured)
=================  ============================  =======================================

Every integer (``gpus`` and the ``int`` fields) is at most 2**63 - 1, what the
state store holds, and ``grace`` and ``restart_cost`` at most 7 days; a larger
value is refused as too large, with the bound.

Long aliases equal to the attribute names (``batch_size``, ``grace_s``, ...)
are accepted too; an unknown or repeated key is an error. `format_spec`
writes the short keys, only for values that differ from the default, so
``parse_spec(format_spec(s)) == s`` for every valid spec ``s``.

This module is at the bottom of the layering (beside ``config``): it imports
nothing from malleable, and every layer may use it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from malleable.progress.reporter import MAX_BATCH

PREFIX = "malleable:"

SIGNAL_TARGETS = ("batch", "full", "steps")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG", "CONT", "WINCH")
MAX_MODEL_LEN = 64
MAX_INT = 2**63 - 1  # what SQLite's INTEGER holds
_BATCH_FIELDS = ("batch_size", "max_batch_size", "max_local_batch_size")
MAX_SECONDS = 7 * 86400.0  # grace and restart_cost: a week (a datetime holds far more)


class SpecError(ValueError):
    """A malleable spec that cannot be used; the message names the field and the value.

    Attributes:
        field: the key at fault ("" for a problem with the spec as a whole).
        value: the offending text (or None).
    """

    def __init__(self, message: str, *, field: str = "", value: object = None):
        if isinstance(value, str) and len(value) > 60 and value in message:
            # (a 5,000-digit value made a 5 KB message)
            message = message.replace(value, f"{value[:40]}... ({len(value)} characters)")
        super().__init__(message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class MalleableSpec:
    """What a malleable job declares (DESIGN.md section 5). Immutable.

    Attributes:
        min_gpus, max_gpus: the GPU range, ``1 <= min_gpus <= max_gpus``.
        step: GPU counts above ``min_gpus`` must be multiples of ``step`` (>= 1);
            the feasibility rule is `malleable.estimators.table.feasible_mask`.
        signal: the checkpoint signal's name without "SIG", e.g. "USR1".
        signal_target: which of the job's processes Slurm signals: "batch" (the batch
            shell only; the contract's sbatch scripts trap and forward it), "full"
            (the shell and every step), "steps" (``srun`` steps only). The values
            are those of `malleable.slurm.records.SignalTarget`.
        grace_s: seconds the job needs between the signal and its ``checkpointed``
            event (>= 0).
        shrink_inplace: the job survives losing nodes while running
            (``scontrol update NumNodes=``); otherwise shrinking is checkpoint-requeue.
        target_steps, target_samples, target_epochs: the job's work target in
            iterations, samples or epochs (None: unknown; estimated from progress).
        samples_per_epoch: samples in one epoch (converts epochs to samples).
        target_metric: a metric value at which the job stops (None: none);
            ``metric_goal`` says whether larger ("max") or smaller ("min") is better.
        batch_size: the initial global batch size m0 (None: taken from progress).
        max_batch_size: the largest global batch the job accepts (None: batch_size,
            i.e. no batch-size adaptation).
        max_local_batch_size: the largest per-GPU batch (memory limit; None: no limit).
        model: an optional model name (e.g. "cifar10") for throughput priors and
            the emulator's profile.
        restart_cost_s: seconds a checkpoint-requeue costs the job, if the user
            knows it (None: the daemon measures it).

    Raises:
        SpecError: on construction, for a value outside its range (names the field).
    """

    min_gpus: int
    max_gpus: int
    step: int = 1
    signal: str = "USR1"
    signal_target: str = "batch"
    grace_s: float = 120.0
    shrink_inplace: bool = False
    target_steps: int | None = None
    target_samples: int | None = None
    target_epochs: int | None = None
    samples_per_epoch: int | None = None
    target_metric: float | None = None
    metric_goal: str = "max"
    batch_size: int | None = None
    max_batch_size: int | None = None
    max_local_batch_size: int | None = None
    model: str | None = None
    restart_cost_s: float | None = None

    def __post_init__(self) -> None:
        _validate(self)
        for attr in ("grace_s", "restart_cost_s", "target_metric"):
            value = getattr(self, attr)
            if value is not None:
                object.__setattr__(self, attr, float(value))

    def as_dict(self) -> dict[str, object]:
        """The fields as a plain JSON-able dict (how the state store keeps a spec)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MalleableSpec:
        """The spec from `as_dict`'s output; unknown keys are ignored (a newer writer).

        Raises:
            SpecError: a missing or invalid field (names it).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        for required in ("min_gpus", "max_gpus"):
            if required not in data:
                raise SpecError(f"malleable spec: gpus: missing {required}", field="gpus")
        try:
            return cls(**{k: v for k, v in data.items() if k in names})  # type: ignore[arg-type]
        except TypeError as exc:
            raise SpecError(f"malleable spec: {exc}") from None

    def allowed_gpus(self, limit: int | None = None) -> list[int]:
        """The GPU counts the spec allows, ascending (before node granularity): ``min_gpus``
        and every multiple of ``step`` in ``(min_gpus, max_gpus]``; the first ``limit``
        of them if given (a spec may allow up to 2**63 - 1 GPUs)."""
        first = (self.min_gpus // self.step + 1) * self.step
        rest = range(first, self.max_gpus + 1, self.step)
        if limit is not None:
            rest = rest[:max(0, limit - 1)]
        return [self.min_gpus, *rest][:limit]

    def gpus_for_batch(self) -> int:
        """The fewest GPUs that hold the initial batch at the per-GPU limit:
        ``ceil(batch_size / max_local_batch_size)``, 1 without both."""
        if self.batch_size is None or self.max_local_batch_size is None:
            return 1
        return -(-self.batch_size // self.max_local_batch_size)

    def smallest_usable_gpus(self) -> int:
        """The smallest of `allowed_gpus` that holds the initial batch (`gpus_for_batch`);
        it may exceed ``max_gpus`` (no size does: `parse_spec` refuses such a spec)."""
        need = self.gpus_for_batch()
        if need <= self.min_gpus:
            return self.min_gpus
        return -(-need // self.step) * self.step

    def allows(self, gpus: int) -> bool:
        """Whether the spec allows ``gpus`` (one of `allowed_gpus`, without listing them)."""
        return gpus == self.min_gpus or (self.min_gpus < gpus <= self.max_gpus
                                         and gpus % self.step == 0)


# --- fields -------------------------------------------------------------------------------

# key -> attribute, for every key but "gpus" (two attributes) and the aliases below.
_KEYS: dict[str, str] = {
    "step": "step",
    "signal": "signal",
    "signal_target": "signal_target",
    "grace": "grace_s",
    "shrink": "shrink_inplace",
    "target_steps": "target_steps",
    "target_samples": "target_samples",
    "target_epochs": "target_epochs",
    "samples_per_epoch": "samples_per_epoch",
    "target_metric": "target_metric",
    "metric_goal": "metric_goal",
    "batch": "batch_size",
    "max_batch": "max_batch_size",
    "max_local_batch": "max_local_batch_size",
    "model": "model",
    "restart_cost": "restart_cost_s",
}
_ALIASES: dict[str, str] = {attr: key for key, attr in _KEYS.items() if attr != key}
_ALIASES.pop("shrink_inplace")  # a boolean attribute, not a key users would write
KNOWN_KEYS: tuple[str, ...] = ("gpus", *_KEYS)

_INT_FIELDS = {"step", "target_steps", "target_samples", "target_epochs", "samples_per_epoch",
               "batch_size", "max_batch_size", "max_local_batch_size"}
_SECONDS_FIELDS = {"grace_s", "restart_cost_s"}

_START = re.compile(r"(?:^|(?<=[\s\"'(\[{|;,]))malleable:", re.IGNORECASE)
_FIELD = re.compile(r"\s*([A-Za-z_]+)=([^\s,;=\"'()\[\]{}|]+)")
_SEP = re.compile(r"\s*[,;]")
# A key=value word anywhere after the spec (preceded by a blank).
# A key=value after the spec's end, also spelled with '-' in the key or blanks around '='.
_LOOSE_FIELD = re.compile(r"(?<=[\s,;])([A-Za-z_][A-Za-z_-]*)[ \t]*=[ \t]*"
                          r"([^\s,;=\"'()\[\]{}|]+)")
_EMPTY_FIELD = re.compile(r"\s*[,;]\s*[,;]")
_INT = re.compile(r"[+-]?[0-9]+")   # a sign is read, so that -5 is refused as out of range
_SECONDS = re.compile(r"((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)([smh]?)", re.IGNORECASE)
_GPUS = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_MODEL = re.compile(rf"[A-Za-z0-9_.\-]{{1,{MAX_MODEL_LEN}}}")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_TOO_LARGE = f"too large; expected an integer <= {MAX_INT} (2**63 - 1)"


def _key_of(attr: str) -> str:
    if attr in ("min_gpus", "max_gpus"):
        return "gpus"
    return next((k for k, a in _KEYS.items() if a == attr), attr)


def _err(attr: str, value: object, why: str) -> SpecError:
    key = _key_of(attr)
    return SpecError(f"malleable spec: {key}={value}: {why}", field=key, value=value)


def _validate(s: MalleableSpec) -> None:
    for attr in ("min_gpus", "max_gpus", *sorted(_INT_FIELDS)):
        v = getattr(s, attr)
        if v is None and attr not in ("min_gpus", "max_gpus", "step"):
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            raise _err(attr, v, "expected an integer")
        if v < 1:
            raise _err(attr, v, "expected an integer >= 1")
        if v > MAX_INT:
            raise _err(attr, v, _TOO_LARGE)
        if attr in _BATCH_FIELDS and v > MAX_BATCH:
            raise _err(attr, v, f"too large; expected a batch of at most {MAX_BATCH} "
                       "(2**31 - 1) samples")
    if s.min_gpus > s.max_gpus:
        raise SpecError(f"malleable spec: gpus={s.min_gpus}-{s.max_gpus}: "
                        f"minimum exceeds maximum", field="gpus",
                        value=f"{s.min_gpus}-{s.max_gpus}")
    for attr in (*sorted(_SECONDS_FIELDS), "target_metric"):
        v = getattr(s, attr)
        if v is None and attr != "grace_s":
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _err(attr, v, "expected a number")
        if not math.isfinite(v):
            raise _err(attr, v, "expected a finite number")
        if attr in _SECONDS_FIELDS and v < 0:
            raise _err(attr, v, "expected seconds >= 0")
        if attr in _SECONDS_FIELDS and v > MAX_SECONDS:
            raise _err(attr, v, f"too large; expected seconds <= {MAX_SECONDS:.0f} (7 days)")
    if s.signal not in SIGNALS:
        raise _err("signal", s.signal, f"expected one of {', '.join(SIGNALS)}")
    if s.signal_target not in SIGNAL_TARGETS:
        raise _err("signal_target", s.signal_target, f"expected one of {', '.join(SIGNAL_TARGETS)}")
    if not isinstance(s.shrink_inplace, bool):
        raise _err("shrink_inplace", s.shrink_inplace, "expected inplace or requeue")
    if s.metric_goal not in ("max", "min"):
        raise _err("metric_goal", s.metric_goal, "expected max or min")
    if s.model is not None and (not isinstance(s.model, str) or not _MODEL.fullmatch(s.model)):
        raise _err("model", s.model, f"expected 1-{MAX_MODEL_LEN} of A-Z a-z 0-9 _ . -")
    if s.batch_size is not None and s.max_batch_size is not None \
            and s.max_batch_size < s.batch_size:
        raise _err("max_batch_size", s.max_batch_size,
                   f"smaller than batch={s.batch_size}")
    _check_some_size_fits(s)


def _check_some_size_fits(s: MalleableSpec) -> None:
    """Refuse batch limits that no GPU count of the range can run with (such a job would be
    held for ever): a size k needs ``k <= largest global batch`` (one sample per GPU) and
    ``k * max_local_batch >= batch`` (the initial batch fits in memory), the rule of
    `malleable.estimators.efficiency.optimal_batch`'s candidates."""
    top_attr = "max_batch_size" if s.max_batch_size is not None else "batch_size"
    top = getattr(s, top_attr)
    need = s.gpus_for_batch()
    k = s.smallest_usable_gpus()
    sizes = f"gpus={s.min_gpus}-{s.max_gpus}" + (f" step={s.step}" if s.step > 1 else "")
    if k > s.max_gpus:
        raise _err("max_local_batch_size", s.max_local_batch_size,
                   f"batch={s.batch_size} needs at least {need} GPUs at this per-GPU limit, "
                   f"more than {sizes} allows")
    if top is not None and k > top:
        raise _err(top_attr, top, f"a global batch of at most {top} cannot give each of "
                   f"{k} GPUs a sample, and {k} is the smallest usable size of {sizes}")


# --- parsing ------------------------------------------------------------------------------

def _parse_int(key: str, text: str) -> int:
    if not _INT.fullmatch(text):
        raise SpecError(f"malleable spec: {key}={text}: expected an integer", field=key,
                        value=text)
    # (int() of more than 4,300 digits raises ValueError: beyond 19 it is out of range)
    huge = len(text.lstrip("+-").lstrip("0")) > 19
    value = (-1 if text.startswith("-") else MAX_INT + 1) if huge else int(text)
    if value < 1:
        raise SpecError(f"malleable spec: {key}={text}: expected an integer >= 1", field=key,
                        value=text)
    if value > MAX_INT:
        raise SpecError(f"malleable spec: {key}={text}: {_TOO_LARGE}", field=key, value=text)
    return value


def _parse_seconds(key: str, text: str) -> float:
    m = _SECONDS.fullmatch(text)
    if not m:
        raise SpecError(f"malleable spec: {key}={text}: expected seconds, e.g. 120, 90s, 2m, 1h",
                        field=key, value=text)
    value = float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    if not math.isfinite(value):
        raise SpecError(f"malleable spec: {key}={text}: expected a finite number of seconds",
                        field=key, value=text)
    return value


def _parse_float(key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"malleable spec: {key}={text}: expected a number", field=key,
                        value=text) from None
    if not math.isfinite(value):
        raise SpecError(f"malleable spec: {key}={text}: expected a finite number", field=key,
                        value=text)
    return value


def _parse_gpus(text: str) -> tuple[int, int]:
    m = _GPUS.fullmatch(text)
    if not m:
        raise SpecError(f"malleable spec: gpus={text}: expected MIN-MAX or N, e.g. gpus=2-16",
                        field="gpus", value=text)
    lo = _parse_int("gpus", m.group(1))
    hi = _parse_int("gpus", m.group(2)) if m.group(2) is not None else lo
    if lo > hi:
        raise SpecError(f"malleable spec: gpus={text}: minimum exceeds maximum", field="gpus",
                        value=text)
    return lo, hi


def _parse_value(key: str, attr: str, text: str) -> object:
    if attr in _INT_FIELDS:
        return _parse_int(key, text)
    if attr in _SECONDS_FIELDS:
        return _parse_seconds(key, text)
    if attr == "target_metric":
        return _parse_float(key, text)
    if attr == "signal":
        name = text.upper()
        name = name[3:] if name.startswith("SIG") else name
        if name not in SIGNALS:
            why = "cannot be caught" if name in ("KILL", "STOP") else "unknown signal"
            raise SpecError(f"malleable spec: signal={text}: {why}; expected one of "
                            f"{', '.join(SIGNALS)}", field=key, value=text)
        return name
    if attr == "shrink_inplace":
        word = text.lower()
        if word not in ("inplace", "requeue"):
            raise SpecError(f"malleable spec: shrink={text}: expected inplace or requeue",
                            field=key, value=text)
        return word == "inplace"
    if attr == "signal_target":
        word = text.lower()
        if word not in SIGNAL_TARGETS:
            raise SpecError(f"malleable spec: signal_target={text}: expected one of "
                            f"{', '.join(SIGNAL_TARGETS)}", field=key, value=text)
        return word
    if attr == "metric_goal":
        word = text.lower()
        if word not in ("max", "min"):
            raise SpecError(f"malleable spec: metric_goal={text}: expected max or min",
                            field=key, value=text)
        return word
    if attr == "model":
        if not _MODEL.fullmatch(text):
            raise SpecError(f"malleable spec: model={text}: expected 1-{MAX_MODEL_LEN} of "
                            f"A-Z a-z 0-9 _ . -", field=key, value=text)
        return text
    raise AssertionError(attr)  # unreachable: every attribute is handled above


def find_spec(text: str) -> tuple[int, int] | None:
    """Where the spec stands in a comment.

    Args:
        text: a job comment (any string).

    Returns:
        ``(start, end)`` character offsets of the spec (from ``malleable:`` to the
        end of its last field), or None when the comment holds no spec. The span is
        found by the grammar's shape only; the fields are not validated.

    Raises:
        SpecError: ``malleable:`` appears more than once.
    """
    starts = [m.start() for m in _START.finditer(text)]
    if not starts:
        return None
    if len(starts) > 1:
        raise SpecError("malleable spec: the comment holds more than one 'malleable:' spec",
                        value=text)
    start = starts[0]
    pos = end = start + len(PREFIX)
    while True:
        m = _FIELD.match(text, pos)
        if not m:
            break
        end = m.end()
        sep = _SEP.match(text, end)
        if not sep:
            break
        pos = sep.end()
    return start, end


def _refuse_split_spec(text: str, start: int, end: int) -> None:
    """Raise `SpecError` if a field of ours follows the spec ``text[start:end]`` after a
    blank, an empty field or a separator, anywhere in the rest of the comment
    ("gpus=1-8 step=4", "gpus=1-8 nightly step=4", "gpus=1-8,,step=4"): the spec ends
    there, so the field would be dropped without a word. Other text after the spec is
    the comment's own."""
    if text[end:end + 1] == "=":
        last = text[start + len(PREFIX):end].rsplit(",", 1)[-1].rsplit(";", 1)[-1].strip()
        key = last.split("=", 1)[0]
        raise SpecError(f"malleable spec: {last}{text[end:end + 20].split(',')[0]}: a second "
                        f"'=' after the value of {key} (one value per key)",
                        field=_ALIASES.get(key.lower(), key.lower()), value=last)
    if text[end:end + 1].isspace():
        cut = "a blank"
    elif _EMPTY_FIELD.match(text, end):
        cut = "an empty field (two separators in a row)"
    else:
        cut = "the spec's end"
    for lost in _LOOSE_FIELD.finditer(text, end):
        key, value = lost.group(1), lost.group(2)
        norm = key.lower().replace("-", "_")
        if _ALIASES.get(norm, norm) in KNOWN_KEYS:
            raise SpecError(f"malleable spec: {lost.group(0)}: after {cut}, outside the spec "
                            f"(separate its fields by single commas, keys with '_' and no "
                            f"blank around '=', e.g. {text[start:end]},{norm}={value})",
                            field=norm, value=value)


def spec_fields(text: str) -> list[tuple[str, str]]:
    """The raw ``(key, value)`` pairs of the spec in ``text``, keys lower-cased and
    aliases mapped to the short keys; values unparsed. ``[]`` when there is no spec.

    Lets tools merge specs field by field (``malleable submit`` overlays its
    options on the script's spec) before one `parse_spec` validates the result.

    Raises:
        SpecError: ``malleable:`` appears more than once, or a field of ours follows
            the spec after a blank or an empty field.
    """
    span = find_spec(text or "")
    if span is None:
        return []
    _refuse_split_spec(text, *span)
    body = text[span[0] + len(PREFIX):span[1]]
    return [(_ALIASES.get(m.group(1).lower(), m.group(1).lower()), m.group(2))
            for m in _FIELD.finditer(body)]


def parse_spec(text: str | None) -> MalleableSpec | None:
    """Parse the malleable spec out of a job comment.

    Args:
        text: the job's comment (``sbatch --comment``), possibly holding other text;
            None or "" for a job without a comment.

    Returns:
        The spec, or None if the comment holds no ``malleable:`` spec (a rigid job).

    Raises:
        SpecError: the spec is malformed, names an unknown or repeated key, lacks
            ``gpus``, or holds a value out of range; the message names the field
            and the value (``SpecError.field``, ``SpecError.value``).
    """
    if not text:
        return None
    span = find_spec(text)
    if span is None:
        return None
    start, end = span
    body = text[start + len(PREFIX):end]
    if not body:
        after = text[end:end + 20]
        raise SpecError(f"malleable spec: no key=value fields after 'malleable:' "
                        f"(found {after!r})", value=after)
    _refuse_split_spec(text, start, end)
    values: dict[str, object] = {}
    seen: set[str] = set()
    for m in _FIELD.finditer(body):
        key, raw = m.group(1).lower(), m.group(2)
        key = _ALIASES.get(key, key)
        if key in seen:
            raise SpecError(f"malleable spec: {key}={raw}: key given twice", field=key,
                            value=raw)
        seen.add(key)
        if key == "gpus":
            values["min_gpus"], values["max_gpus"] = _parse_gpus(raw)
        elif key in _KEYS:
            values[_KEYS[key]] = _parse_value(key, _KEYS[key], raw)
        else:
            raise SpecError(f"malleable spec: {key}={raw}: unknown key (known: "
                            f"{', '.join(KNOWN_KEYS)})", field=key, value=raw)
    if "min_gpus" not in values:
        raise SpecError("malleable spec: gpus: missing; give the GPU range, e.g. gpus=2-16",
                        field="gpus")
    return MalleableSpec(**values)  # type: ignore[arg-type]


# --- formatting ---------------------------------------------------------------------------

def _fmt_number(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def format_spec(spec: MalleableSpec) -> str:
    """The spec as comment text, e.g. ``malleable:gpus=2-16,step=4,batch=256``.

    Only fields that differ from their defaults are written, with the short keys,
    in a fixed order; no blanks. ``parse_spec(format_spec(s)) == s``.
    """
    gpus = str(spec.min_gpus) if spec.min_gpus == spec.max_gpus \
        else f"{spec.min_gpus}-{spec.max_gpus}"
    parts = [f"gpus={gpus}"]
    defaults = {f.name: f.default for f in dataclasses.fields(MalleableSpec)}
    for key, attr in _KEYS.items():
        value = getattr(spec, attr)
        if value is None or value == defaults[attr]:
            continue
        if attr == "shrink_inplace":
            text = "inplace" if value else "requeue"
        elif attr in _SECONDS_FIELDS or attr == "target_metric":
            text = _fmt_number(value)
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return PREFIX + ",".join(parts)


def replace_spec(comment: str, spec: MalleableSpec | None) -> str:
    """A comment with its spec replaced by ``spec`` (or removed when None).

    Other text in the comment is kept; a comment without a spec gets it appended
    after one blank.

    Raises:
        SpecError: the comment holds more than one ``malleable:`` prefix.
    """
    span = find_spec(comment)
    new = format_spec(spec) if spec is not None else ""
    if span is None:
        return f"{comment} {new}".strip() if new else comment
    start, end = span
    return (comment[:start] + new + comment[end:]).strip()
