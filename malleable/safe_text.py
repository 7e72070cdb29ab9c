"""Untrusted text made safe for a terminal or a log line (one function, `safe_text`).

Job names, comments, users and Slurm's messages are anyone's to choose; printed
raw, an escape sequence could rewrite an admin's terminal, and a line break or a
bidirectional override could fake a table row or a log line. The operator
commands (`malleable.ops.output`) and the daemon's log formatter
(`malleable.daemon.logs`) pass such text through `safe_text`.
"""

from __future__ import annotations

import unicodedata

# Control characters (C0, DEL, C1), format characters (the bidirectional embeddings,
# overrides and isolates U+202A-U+202E and U+2066-U+2069, marks, zero-width characters),
# lone surrogates, and the line and paragraph separators U+2028, U+2029.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    """One character as it reads in a Python string literal: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if ch in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[ch]
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def safe_text(value: object) -> str:
    """Text from outside (a job name, a comment, a user, a Slurm message) made safe to
    print to a terminal.

    Args:
        value: a string, or any value (converted with ``str``).

    Returns:
        The text with every character a terminal would act on or that would hide or
        reorder what is shown replaced by its escape as in a Python string literal:
        control characters (C0 such as ESC -> ``\\x1b``, line feed -> ``\\n``, carriage
        return -> ``\\r``, tab -> ``\\t``; DEL; C1 such as CSI -> ``\\x9b``), format
        characters (the bidirectional overrides and isolates, e.g. U+202E ->
        ``\\u202e``; zero-width characters), lone surrogates and the line and paragraph
        separators. Everything else, non-ASCII letters included, is kept. The result is
        one line, and escaping it again changes nothing (a backslash already in the
        text is kept as it is, so a name that spells ``\\x1b`` reads the same as one
        that holds an escape character: the ``--json`` output tells them apart).
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():        # (the common case; no unsafe character is printable)
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _UNSAFE_CATEGORIES else c
                   for c in text)


def _json_escape(ch: str) -> str:
    """One character as a JSON ``\\u`` escape (a surrogate pair beyond U+FFFF)."""
    o = ord(ch)
    if o < 0x10000:
        return f"\\u{o:04x}"
    o -= 0x10000
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


def safe_json_text(text: str) -> str:
    """JSON text (as `json.dumps` writes it with ``ensure_ascii=False``) with every
    character `safe_text` escapes written as a JSON ``\\u`` escape instead.

    Args:
        text: a JSON document's text; the characters in question can only be inside
            its strings (JSON's own whitespace is space, tab, line feed and carriage
            return, which `json.dumps` writes only as indentation and line breaks).

    Returns:
        The same document (it parses to exactly the same values) whose text holds no
        control, format (bidirectional overrides, zero-width characters), surrogate or
        line/paragraph separator character raw, but the line breaks between its lines.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.isprintable():     # (the common case, a printable line, is kept)
            lines[i] = "".join(_json_escape(c) if unicodedata.category(c) in
                               _UNSAFE_CATEGORIES else c for c in line)
    return "\n".join(lines)
