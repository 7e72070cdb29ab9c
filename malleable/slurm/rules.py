"""Rules every parser (JSON of any release, scontrol text, pyslurm objects) applies
when it turns Slurm's facts about one job into a `SlurmJob`, so all backends and
all releases yield equal records for the same job.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from malleable.slurm.records import JobState


def display_job_id(job_id_num: int, array_job_id: int | None, array_task_id: int | None,
                   het_job_id: int | None, het_job_offset: int | None) -> str:
    """The id a user types: "123_4" for an array task, "123+0" for a het component, else "123".

    A pending array master (array id set, task id unset) is its own number.
    """
    if array_job_id and array_task_id is not None:
        return f"{array_job_id}_{array_task_id}"
    if het_job_id:
        return f"{het_job_id}+{het_job_offset or 0}"
    return str(job_id_num)


def is_held(state: JobState, priority: int | None, reason: str, hold_flag: bool = False) -> bool:
    """A pending job is held when Slurm says so (23.02+ ``hold``), its priority is 0
    (``scontrol hold``, ``sbatch -H``, ``requeuehold``) or the reason names a hold
    ("JobHeldUser", "JobHeldAdmin", "job requeued in held state")."""
    if state != JobState.PENDING:
        return False
    return hold_flag or priority == 0 or "held" in reason.lower()


def end_time(end: datetime | None, time_limit: timedelta | None,
             state: JobState) -> datetime | None:
    """Slurm reports start + 1 year as the end of an unlimited, unfinished job in JSON
    but "Unknown" in text; both become None here (the job has no known end)."""
    if time_limit is None and not state.finished:
        return None
    return end


def reason(code: str, description: str = "") -> str:
    """Why a job waits, as squeue's ``%r`` shows it: Slurm's description when it set one
    ("job requeued in held state"), else the reason code ("JobHeldUser", "None").
    scontrol's text prints the description with underscores; they become spaces."""
    text = description or code
    if "_" in text and text == text.lower():
        text = text.replace("_", " ")
    return text


def pending_node_count(state: JobState, node_count: int, requested: int | None) -> int:
    """Nodes of a job: for a pending job the requested ``node=`` of its TRES request, since
    Slurm keeps reporting the old allocation's count after a requeue (seen on 22.05:
    NumNodes=1 after ``NumNodes=3-3`` on a requeued job, while ReqTRES says node=3)."""
    if state == JobState.PENDING and requested:
        return requested
    return node_count
