"""Write the generated reference pages: docs/cli-json.md and docs/configuration.md.

::

    python -m malleable.ops.docgen            # rewrite both files under docs/
    python -m malleable.ops.docgen --check    # exit 1 if either is out of date

docs/cli-json.md comes from `malleable.ops.schemas`, docs/configuration.md
from the field metadata of `malleable.config` (the same text as ``malleable
config show --defaults --markdown``). A test runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from malleable.ops.config import defaults_doc, render_markdown
from malleable.ops.schemas import markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def pages() -> dict[str, str]:
    """File name under docs/ -> its generated text."""
    return {"cli-json.md": markdown(), "configuration.md": render_markdown(defaults_doc())}


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check compare) the generated pages; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the docs directory")
    args = ap.parse_args(argv)
    stale = []
    for name, text in pages().items():
        path = args.docs / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m malleable.ops.docgen",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
