"""The daemon's side of the plan file: tell a requeued job its new size and batch size.

Format (docs/progress-format.md, "The plan file"): ``<spool>/<job>.plan.json``,
one JSON object ``{"v": 1, "job": ..., "t": ..., "gpus": ..., "nodes": ...,
"batch": ...}``, read by `malleable.progress.reporter.Reporter.plan`.
"""

from __future__ import annotations

import os

from malleable.progress.reporter import PLAN_SUFFIX, Plan, atomic_write, format_plan


def plan_path(spool_dir: str | os.PathLike, job_id: str) -> str:
    """``<spool_dir>/<job_id>.plan.json``.

    Raises:
        ValueError: a job id that could name a file outside the spool directory.
    """
    if not job_id or "/" in job_id or job_id.startswith(".") or "\x00" in job_id:
        raise ValueError(f"job_id={job_id!r}: expected a Slurm job id such as 123 or 123_4")
    return os.path.join(os.fspath(spool_dir), job_id + PLAN_SUFFIX)


def write_plan(spool_dir: str | os.PathLike, plan: Plan) -> str:
    """Write (atomically replace) the plan file of ``plan.job``; returns its path.

    The file is written to a temporary name in the spool directory and renamed
    over the target, so a job never reads half a plan, and a symlink a user put
    at the target is replaced, not followed. Mode 0644.

    Raises:
        ValueError: a bad job id. OSError: the spool directory is not writable.
    """
    path = plan_path(spool_dir, plan.job)
    atomic_write(path, format_plan(plan), mode=0o644)
    return path
