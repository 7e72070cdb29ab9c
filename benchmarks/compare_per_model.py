"""Per-model JCT of our simulated runs against the per-job JCTs a Pollux artifact run published.

Pollux's artifact (petuum/adaptdl, branch osdi21-artifact) publishes, next to
the averages, every job's JCT: ``simulator/results-jobload/<policy>-1.0/
summary.json``, key ``jcts`` (workload -> job name -> seconds). Job names are
the workload CSV's (``cifar10-0``, ...), as in our runs' ``jobs.csv``. For the
workloads present in both, this prints per model: jobs, our mean JCT, the
artifact's, the difference, how much of the gap in the mean JCT over all jobs
the model accounts for, and our mean restarts and wait per job.

Usage:
  python benchmarks/compare_per_model.py --artifact summary.json --runs DIR [--policy pollux]
  (DIR as written by bench_sim_fidelity.py: DIR/<workload>/<policy>/seed0/jobs.csv)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path


def compare(artifact: dict[str, dict[str, float]], runs: Path, policy: str) -> list[str]:
    """Lines of the per-model table (see the module docstring).

    Raises:
        ValueError: a job of a compared workload is missing from the artifact's JCTs.
    """
    per: dict[str, list[list[float]]] = defaultdict(lambda: [[], [], [], []])
    used = []
    for name in sorted(artifact, key=lambda n: (len(n), n)):
        f = runs / name / policy / "seed0" / "jobs.csv"
        if not f.exists():
            continue
        used.append(name)
        with f.open(newline="", encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                if r["name"] not in artifact[name]:
                    raise ValueError(f"{name}: job {r['name']} not in the artifact's jcts")
                if not r["jct_s"]:
                    continue
                v = per[r["model"]]
                v[0].append(float(r["jct_s"]))
                v[1].append(float(artifact[name][r["name"]]))
                v[2].append(float(r["restarts"]))
                v[3].append(float(r["wait_s"]))
    n = sum(len(v[0]) for v in per.values())
    if not n:
        return ["no workload in both"]
    lines = [f"workloads: {', '.join(used)} ({n} jobs)", "",
             "| model | jobs | ours (s) | artifact (s) | difference | share of the mean-JCT "
             "gap (s) | restarts per job (ours) | wait per job (ours, s) |",
             "|---|---|---|---|---|---|---|---|"]
    for m, (o, a, rs, ws) in sorted(per.items()):
        mo, ma = sum(o) / len(o), sum(a) / len(a)
        lines.append(f"| {m} | {len(o)} | {mo:,.0f} | {ma:,.0f} | {(mo - ma) / ma:+.0%} | "
                     f"{(sum(o) - sum(a)) / n:+,.0f} | {sum(rs) / len(rs):.2f} | "
                     f"{sum(ws) / len(ws):.0f} |")
    ours = sum(sum(v[0]) for v in per.values()) / n
    theirs = sum(sum(v[1]) for v in per.values()) / n
    lines.append(f"| all | {n} | {ours:,.0f} | {theirs:,.0f} | {(ours - theirs) / theirs:+.1%} "
                 f"| {ours - theirs:+,.0f} | | |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, help="the artifact's summary.json")
    ap.add_argument("--runs", required=True, help="directory of our runs")
    ap.add_argument("--policy", default="pollux")
    args = ap.parse_args()
    try:
        doc = json.loads(Path(args.artifact).read_text(encoding="utf-8"))
        jcts = doc["jcts"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"--artifact {args.artifact}: cannot read its jcts: {exc}", file=sys.stderr)
        return 2
    try:
        print("\n".join(compare(jcts, Path(args.runs), args.policy)))
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
