"""Read slurm.conf-style files (slurm.conf, gres.conf) the way Slurm's own parser does.

The rules, from Slurm's ``parse_config.c`` and slurm.conf(5) (Slurm 22.05):

* ``#`` starts a comment to the end of the physical line unless escaped (``\\#``);
  comments are removed before continuations are joined.
* A line ending in an odd number of backslashes (trailing blanks allowed)
  continues on the next line; the backslash is removed and nothing is
  inserted in its place. Then ``\\x`` becomes ``x`` throughout.
* A statement is ``Key=Value``; keys are case-insensitive, a value is a run of
  non-blanks or a double-quoted string. Outside record lines only ONE
  statement may stand on a line (``JobRequeue=1 MinJobAge=300`` is Slurm's
  "Parse error ... line 1").
* Record lines (slurm.conf: NodeName, PartitionName, NodeSet, DownNodes,
  FrontendName; gres.conf: NodeName, Name) carry further ``Key=Value``
  parameters on the same line.
* ``Include PATH`` (at the very start of the line: Slurm 22.05 refuses
  ``  Include x`` with a "Parse error") reads another file in place. A
  relative PATH is relative to the directory of the including file; ``%c`` is
  replaced by the lower-cased ClusterName. Shell globs (``Include
  conf.d/*.conf``) are read as every match in sorted order, and each glob
  Include is recorded in ``ParsedConf.glob_includes``: Slurm 22.05 does not
  expand them (seen with its scontrol: it looks for a file literally named
  ``*.conf``, retries for 60 s and fails), so the checks report them.

Nothing here raises for bad input: a syntax error, an unreadable or missing
file, a bad Include and a repeated key are `Finding` records with the file
and line, and parsing goes on with the next line. Files are only read.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from malleable.slurm_conf.records import Finding, Location, Severity

SLURM_CONF_RECORD_KEYS = ("NodeName", "PartitionName", "NodeSet", "DownNodes", "FrontendName")
"""slurm.conf statements whose line carries further parameters."""

GRES_CONF_RECORD_KEYS = ("NodeName", "Name")
"""gres.conf statements whose line carries further parameters."""

SLURM_CONF_MULTI_KEYS = ("SlurmctldHost",)
"""slurm.conf keys that may appear more than once (each adds a value)."""

MAX_INCLUDE_DEPTH = 16

_KV = re.compile(r'\s*([A-Za-z0-9_.]+)\s*([-*+/]?)=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s+(\S+)(.*)$", re.IGNORECASE | re.DOTALL)
_INDENTED_INCLUDE = re.compile(r"\s+include\s", re.IGNORECASE)
_GLOB_CHARS = re.compile(r"[*?\[]")

SHOWN_CHARS = 80
"""How much of a line a finding quotes (a binary file or a runaway line is cut)."""


def _shown(text: str) -> str:
    """``text`` quoted (repr) for a finding, cut to `SHOWN_CHARS` characters of the
    quoted form with the full length said, so one junk line cannot flood the report."""
    quoted = repr(text)
    if len(quoted) <= SHOWN_CHARS:
        return quoted
    return f"{quoted[:SHOWN_CHARS]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Entry:
    """One top-level ``Key=Value`` statement; ``key`` as written."""

    key: str
    value: str
    location: Location


@dataclass(frozen=True)
class Record:
    """A record line, e.g. ``NodeName=node[1-4] CPUs=16 Gres=gpu:4``.

    Attributes:
        kind: the record key in its canonical spelling (``"NodeName"``).
        name: the value of that key (``"node[1-4]"``, ``"DEFAULT"``).
        params: the other parameters, keys lower-cased, in line order; a key
            given twice keeps its last value.
        location: the line where the record starts.
    """

    kind: str
    name: str
    params: dict[str, str]
    location: Location

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of parameter ``key`` (case-insensitive), or ``default``."""
        return self.params.get(key.lower(), default)


@dataclass
class ParsedConf:
    """A parsed configuration file with everything it includes.

    Attributes:
        path: the top-level file.
        files: every file actually read, top-level first, in reading order.
        entries: top-level statements in order (repeats kept).
        records: record lines in order.
        findings: syntax errors, unreadable files, bad includes, repeated keys.
        readable: False when the top-level file itself could not be read.
        glob_includes: ``(location, pattern, matches)`` of each Include with a glob.
    """

    path: str
    files: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    readable: bool = True
    glob_includes: list[tuple[Location, str, tuple[str, ...]]] = field(default_factory=list)

    def entry(self, key: str) -> Entry | None:
        """The statement that sets ``key`` (case-insensitive; the last one wins, as in Slurm)."""
        k = key.lower()
        for e in reversed(self.entries):
            if e.key.lower() == k:
                return e
        return None

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of ``key`` (last one wins), or ``default`` when the file does not set it."""
        e = self.entry(key)
        return e.value if e is not None else default

    def records_of(self, kind: str) -> list[Record]:
        """The record lines of one kind (e.g. ``"PartitionName"``), in file order."""
        k = kind.lower()
        return [r for r in self.records if r.kind.lower() == k]


def _strip_comment(line: str) -> str:
    """Cut at the first ``#`` preceded by an even number of backslashes."""
    backslashes = 0
    for i, ch in enumerate(line):
        if ch == "#" and backslashes % 2 == 0:
            return line[:i]
        backslashes = backslashes + 1 if ch == "\\" else 0
    return line


def _continues(line: str) -> tuple[bool, str]:
    """(True, line without its continuation backslash) when ``line`` continues."""
    end = len(line)
    i = end - 1
    while i >= 0 and line[i] in " \t\r\f\v":
        i -= 1
    j = i
    while j >= 0 and line[j] == "\\":
        j -= 1
    n = i - j
    if n % 2 == 1:
        return True, line[:i]
    return False, line


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 1
            if i < len(text):
                out.append(text[i])
        else:
            out.append(text[i])
        i += 1
    return "".join(out)


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield ``(first physical line number, statement text)`` for each non-blank line.

    Comments are removed, continued lines joined and escapes resolved, as
    Slurm does; the line number is that of the first physical line.
    """
    physical = text.split("\n")
    if physical and physical[-1] == "":
        physical.pop()
    i = 0
    while i < len(physical):
        start = i + 1
        parts = []
        while True:
            more, body = _continues(_strip_comment(physical[i]))
            parts.append(body)
            i += 1
            if not more or i >= len(physical):
                break
        joined = _unescape("".join(parts))
        if joined.strip():
            yield start, joined


def _value(m: re.Match) -> str:
    return m.group(3) if m.group(3) is not None else m.group(4)


class _Reader:
    """State of one parse: the record keys, what was read, and the include stack."""

    def __init__(self, path: str, record_keys: Iterable[str], multi_keys: Iterable[str]):
        self.out = ParsedConf(path=path)
        self.records = {k.lower(): k for k in record_keys}
        self.multi = {k.lower() for k in multi_keys}
        self.seen: dict[str, Entry] = {}
        self.stack: list[str] = []

    def error(self, loc: Location, check: str, message: str, fix: str | None = None,
              severity: Severity = Severity.ERROR) -> None:
        self.out.findings.append(Finding(severity, check, loc, message, fix))

    def read_file(self, path: str, included_from: Location | None) -> None:
        real = os.path.realpath(path)
        if real in self.stack:
            self.error(included_from or Location(path), "include",
                       f"Include of {path} loops back to a file that includes it",
                       "remove the Include line that closes the loop")
            return
        if len(self.stack) >= MAX_INCLUDE_DEPTH:
            self.error(included_from or Location(path), "include",
                       f"Include nesting deeper than {MAX_INCLUDE_DEPTH} files at {path}",
                       "flatten the includes")
            return
        try:
            # A FIFO or device would block or never end: only regular files are read.
            if os.path.exists(path) and not os.path.isdir(path) and \
                    not stat.S_ISREG(os.stat(path).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            if included_from is None:
                self.out.readable = False
            cause = exc.strerror or type(exc).__name__
            where = f" (included from {included_from})" if included_from else ""
            if isinstance(exc, FileNotFoundError):
                fix = (f"create {path}, or correct the Include line at {included_from}"
                       if included_from else f"create {path} or point to the right file")
            elif isinstance(exc, PermissionError):
                fix = (f"make {path} readable by the user running this check, e.g. "
                       f"chmod a+r {path} (slurm.conf(5): slurm.conf must be readable by "
                       f"all users of Slurm), or run the check as root or SlurmUser")
            else:
                fix = f"make {path} a readable regular file"
            self.error(Location(path), "unreadable", f"cannot read {path}{where}: {cause}", fix)
            return
        self.out.files.append(path)
        self.stack.append(real)
        try:
            self.read_text(data.decode("utf-8", errors="replace"), path)
        finally:
            self.stack.pop()

    def read_text(self, text: str, path: str) -> None:
        for lineno, line in logical_lines(text):
            self.statement(line, Location(path, lineno))

    def statement(self, line: str, loc: Location) -> None:
        if _INDENTED_INCLUDE.match(line):
            self.error(loc, "syntax", "Include must start at the beginning of the line "
                       "(Slurm stops with 'Parse error' at an indented Include)",
                       f"remove the blanks before: {line.strip()}")
            line = line.lstrip()
        inc = _INCLUDE.match(line)
        if inc:
            self.include(inc.group(1), inc.group(2), loc)
            return
        m = _KV.match(line)
        if not m:
            text = line.strip()
            first = text.split()[0] if text.split() else ""
            hint = (f"write it as Key=Value (e.g. {first}=...)"
                    if first.isprintable() and len(first) <= 40 else "write it as Key=Value")
            self.error(loc, "syntax", f"not a Key=Value statement: {_shown(text)} "
                       f"(Slurm stops with 'Parse error')", hint)
            return
        key, value, pos = m.group(1), _value(m), m.end()
        canonical = self.records.get(key.lower())
        if canonical is not None:
            params: dict[str, str] = {}
            while True:
                pm = _KV.match(line, pos)
                if not pm:
                    break
                params[pm.group(1).lower()] = _value(pm)
                pos = pm.end()
            rest = line[pos:].strip()
            if rest:
                self.error(loc, "syntax",
                           f"{canonical}={value}: cannot parse {rest!r} "
                           f"(each parameter must be Key=Value; Slurm stops with 'Parse error')",
                           f"write {rest.split()[0]!r} as Key=Value or remove it")
            self.out.records.append(Record(canonical, value, params, loc))
            return
        rest = line[pos:].strip()
        if rest:
            self.error(loc, "syntax",
                       f"{key}={value} is followed by {rest!r} on the same line: outside "
                       f"NodeName/PartitionName lines Slurm reads one Key=Value per line "
                       f"(it stops with 'Parse error')",
                       f"put {rest} on a line of its own")
        entry = Entry(key, value, loc)
        prev = self.seen.get(key.lower())
        if prev is not None and key.lower() not in self.multi:
            self.error(loc, "duplicate",
                       f"{key} is set again (first at {prev.location}); Slurm uses the last "
                       f"value, {key}={value}",
                       f"keep one {key}= line (remove the one at {prev.location})",
                       severity=Severity.WARNING)
        self.seen[key.lower()] = entry
        self.out.entries.append(entry)

    def include(self, target: str, rest: str, loc: Location) -> None:
        if rest.strip():
            self.error(loc, "syntax", f"Include {target} is followed by {rest.strip()!r}",
                       f"write one file per Include line: Include {target}")
        if "%c" in target:
            cluster = self.seen.get("clustername")
            if cluster is None:
                self.error(loc, "include", f"Include {target} uses %c but ClusterName is not "
                           f"set before this line", "set ClusterName=... above the Include line")
                return
            target = target.replace("%c", cluster.value.lower())
        if not os.path.isabs(target):
            target = os.path.join(os.path.dirname(loc.path) or ".", target)
        if _GLOB_CHARS.search(target):
            matches = sorted(glob.glob(target))
            self.out.glob_includes.append((loc, target, tuple(matches)))
            if not matches:
                self.error(loc, "include", f"Include {target} matches no file",
                           "correct the pattern or remove the Include line",
                           severity=Severity.WARNING)
            for path in matches:
                self.read_file(path, loc)
            return
        self.read_file(target, loc)


def parse_conf_file(path: str | os.PathLike, *, record_keys: Iterable[str] = SLURM_CONF_RECORD_KEYS,
                    multi_keys: Iterable[str] = SLURM_CONF_MULTI_KEYS) -> ParsedConf:
    """Parse a slurm.conf-style file and everything it includes.

    Args:
        path: the file to read.
        record_keys: statement keys whose lines carry parameters
            (`SLURM_CONF_RECORD_KEYS` or `GRES_CONF_RECORD_KEYS`).
        multi_keys: keys that may be repeated without a "duplicate" warning.

    Returns:
        A `ParsedConf`; problems are in its ``findings`` (never raised). An
        unreadable top-level file gives ``readable=False`` and one finding.
    """
    p = os.fspath(path)
    reader = _Reader(p, record_keys, multi_keys)
    reader.read_file(p, None)
    return reader.out


def parse_conf_text(text: str, path: str = "<text>", *,
                    record_keys: Iterable[str] = SLURM_CONF_RECORD_KEYS,
                    multi_keys: Iterable[str] = SLURM_CONF_MULTI_KEYS) -> ParsedConf:
    """Parse configuration text as if it were the file ``path`` (Includes are
    resolved relative to ``path``'s directory and read from disk). Same result
    and rules as `parse_conf_file`."""
    reader = _Reader(path, record_keys, multi_keys)
    reader.out.files.append(path)
    reader.stack.append(os.path.realpath(path))
    reader.read_text(text, path)
    return reader.out


def parse_slurm_conf(path: str | os.PathLike) -> ParsedConf:
    """Parse a slurm.conf (with its Includes); see `parse_conf_file`."""
    return parse_conf_file(path)


def parse_gres_conf(path: str | os.PathLike) -> ParsedConf:
    """Parse a gres.conf (with its Includes); see `parse_conf_file`."""
    return parse_conf_file(path, record_keys=GRES_CONF_RECORD_KEYS, multi_keys=())
