"""Two `malleable simulate` sweeps side by side: what a code change did to each policy.

Reads every ``<workload>/<policy>/seed<N>/summary.json`` under two output folders
(``--out`` of `malleable simulate`, e.g. one made by the code before a change and
one after) and prints, per workload and policy present in both: average JCT
before -> after and its change in percent, p99 JCT, makespan, GPU utilisation,
restarts per job, and whether the decisions were the same (``decisions_sha256``).
Rows whose average JCT got worse by more than ``--flag`` percent are marked.

Usage:
  python benchmarks/compare_sweeps.py --before DIR --after DIR [--flag 5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def summaries(root: Path) -> dict[tuple[str, str, str], dict]:
    """(workload, policy, seed folder) -> summary.json of every run under ``root``.

    Raises:
        ValueError: a summary.json that is not JSON (names the file).
    """
    out = {}
    for path in sorted(root.glob("*/*/seed*/summary.json")):
        try:
            out[(path.parts[-4], path.parts[-3], path.parts[-2])] = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    return out


def _pct(before: float, after: float) -> str:
    return f"{100 * (after - before) / before:+.1f} %" if before else "-"


def table(before: dict, after: dict, flag_pct: float) -> list[str]:
    """Markdown lines: one table per workload over the runs both sweeps hold."""
    lines: list[str] = []
    keys = sorted(set(before) & set(after))
    for workload in sorted({k[0] for k in keys}):
        lines += ["", f"**{workload}** (before -> after)", "",
                  "| policy | seed | avg JCT (s) | change | p99 JCT (s) | makespan (h) | "
                  "GPU util | restarts/job | same decisions |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for k in (k for k in keys if k[0] == workload):
            b, a = before[k], after[k]
            if b.get("avg_jct_s") is None or a.get("avg_jct_s") is None:
                lines.append(f"| {k[1]} | {k[2]} | no finished job in one of them | | | | | | |")
                continue
            worse = 100 * (a["avg_jct_s"] - b["avg_jct_s"]) / b["avg_jct_s"] > flag_pct
            mark = "**" if worse else ""
            lines.append(
                f"| {mark}{k[1]}{mark} | {k[2]} | {b['avg_jct_s']:,.0f} -> {a['avg_jct_s']:,.0f} | "
                f"{mark}{_pct(b['avg_jct_s'], a['avg_jct_s'])}{mark} | "
                f"{b['p99_jct_s']:,.0f} -> {a['p99_jct_s']:,.0f} | "
                f"{b['makespan_s'] / 3600:.1f} -> {a['makespan_s'] / 3600:.1f} | "
                f"{b['gpu_utilization']:.3f} -> {a['gpu_utilization']:.3f} | "
                f"{b['restarts_per_job']:.2f} -> {a['restarts_per_job']:.2f} | "
                f"{'yes' if b.get('decisions_sha256') == a.get('decisions_sha256') else 'no'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="sweep folder of the old code")
    ap.add_argument("--after", type=Path, required=True, help="sweep folder of the new code")
    ap.add_argument("--flag", type=float, default=5.0,
                    help="mark a policy whose average JCT got worse by more (percent)")
    args = ap.parse_args(argv)
    try:
        before, after = summaries(args.before), summaries(args.after)
    except ValueError as exc:
        print(f"compare_sweeps: error: {exc}", file=sys.stderr)
        return 2
    if not set(before) & set(after):
        print(f"compare_sweeps: error: no run is in both {args.before} and {args.after}",
              file=sys.stderr)
        return 2
    print("\n".join(table(before, after, args.flag)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
