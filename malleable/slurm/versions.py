"""What each Slurm release offers the port: JSON parser versions and command forms.

Sources: Slurm's CHANGELOG (22.05 to 25.11) and the data_parser plugins it ships.

* 22.05: ``squeue/sinfo --json`` only, always data_parser v0.0.38; no
  ``scontrol --json``.
* 23.02: ``--json`` uses v0.0.39 (no way to choose); ``scontrol show ... --json``
  appears.
* 23.11: ``--json=<data_parser>`` on squeue/sinfo/scontrol ("add --yaml and --json
  arg support to specify data_parser plugin"); v0.0.40 is the release's own.
* 24.05: v0.0.41, 24.11: v0.0.42, 25.05: v0.0.43, 25.11: v0.0.44.

The port pins each release to its own parser, so a document always has the
shape the fixtures describe; a newer release than 25.11 gets plain ``--json``
(its default parser) and the tolerant parser does its best.
"""

from __future__ import annotations

import re

from malleable.slurm.client import SlurmParseError

Version = tuple[int, int, int]

OLDEST_SUPPORTED: Version = (22, 5, 0)
NEWEST_KNOWN: Version = (25, 11, 99)

# Release (major, minor) -> the data_parser it ships as its newest (and pinned) one.
DATA_PARSER = {
    (22, 5): "v0.0.38", (23, 2): "v0.0.39", (23, 11): "v0.0.40", (24, 5): "v0.0.41",
    (24, 11): "v0.0.42", (25, 5): "v0.0.43", (25, 11): "v0.0.44",
}


def parse_version(text: str) -> Version:
    """"22.05.8", "slurm 23.11.4", "slurm-wlm 22.05.8", "24.11.0-1" -> (major, minor, micro).

    Raises `SlurmParseError` naming the text when no version is in it.
    """
    m = re.search(r"(\d{2})\.(\d{1,2})(?:\.(\d+))?", text or "")
    if not m:
        raise SlurmParseError(f"no Slurm version in {text!r}", field="version", value=text)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_string(v: Version) -> str:
    """(22, 5, 8) -> "22.05.8"."""
    return f"{v[0]}.{v[1]:02d}.{v[2]}"


def json_option(v: Version) -> str:
    """The ``--json`` option for a client of release ``v``: pinned where the release allows."""
    if v >= (23, 11, 0) and (v[0], v[1]) in DATA_PARSER:
        return f"--json={DATA_PARSER[(v[0], v[1])]}"
    return "--json"


def has_scontrol_json(v: Version) -> bool:
    """``scontrol show job|nodes --json`` exists from 23.02."""
    return v >= (23, 2, 0)


def supported(v: Version) -> bool:
    """True for releases the port was written for (22.05 up to 25.11)."""
    return OLDEST_SUPPORTED <= v <= NEWEST_KNOWN
