"""What the daemon must remember about jobs, derived from its own records.

Three facts cannot be observed in Slurm and are derived from the state store
instead of being kept as separate state:

* which held jobs the daemon holds (its own HOLD, or a checkpoint-requeue to
  0 GPUs, finished and not followed by an ADMIT): only those may it release;
* which jobs are backed off from requeues: each time a job fails to
  checkpoint within its grace the daemon records a ``no_checkpoint`` job
  event; the n-th such failure blocks requeues for ``base * 2**(n-1)``
  seconds after it (exponential back-off);
* whether a running job is ready to checkpoint: it has logged progress in its
  current run (`reporting_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from malleable.daemon.actions import Step
from malleable.daemon.reconcile import ActionKind
from malleable.db.models import Action, Job, JobEvent, ProgressSample
from malleable.db.store import run_core
from malleable.progress.lines import RESTART_SLACK

# Built once (building a statement costs more than running it); IN lists expand at run time.
_IDS = bindparam("ids", expanding=True)
# Per job, its latest finished action that changed its hold state (one row per job,
# not its whole history).
_HOLD_KINDS = (ActionKind.HOLD.value, ActionKind.ADMIT.value, ActionKind.REQUEUE.value)
_LATEST_HOLD_CHANGE = (select(func.max(Action.id))
                       .where(Action.job_id.in_(_IDS), Action.finished_at.is_not(None),
                              Action.state == Step.DONE.value, Action.kind.in_(_HOLD_KINDS))
                       .group_by(Action.job_id))
_HOLDS = select(Action.job_id, Action.kind, Action.to_gpus).where(
    Action.id.in_(_LATEST_HOLD_CHANGE))
_NO_CHECKPOINT = (select(JobEvent.job_id, func.count(), func.max(JobEvent.time))
                  .where(JobEvent.job_id.in_(_IDS), JobEvent.kind == "no_checkpoint")
                  .group_by(JobEvent.job_id))
# Per job, not GROUP BY over the IN list: a grouped max walks every sample of each job
# (thousands per day of training), a correlated one reads one entry of the
# (job_id, restart) index (revision 0004). NULL restarts sort first, so a job whose
# samples all lack one has samples but a NULL max: hence the separate EXISTS.
# A stored restart above Slurm's count plus one (kept from before ingestion refused
# such lines as future_restart) is no run the job is in.
_RUN_MAX = (select(func.max(ProgressSample.restart))
            .where(ProgressSample.job_id == Job.id,
                   ProgressSample.restart <= Job.restart_count + RESTART_SLACK)
            .correlate(Job).scalar_subquery())
_HAS_SAMPLE = (select(ProgressSample.id).where(ProgressSample.job_id == Job.id)
               .correlate(Job).exists())
_RUNS = (select(Job.id, _RUN_MAX, _HAS_SAMPLE)
         .where(Job.id.in_(_IDS)).order_by(Job.id))


def daemon_holds(s: Session, job_ids: Iterable[int]) -> set[int]:
    """Ids (``jobs.id``) among ``job_ids`` whose current hold is the daemon's.

    A job counts when its latest finished action that changed its hold state is
    a HOLD or a REQUEUE to 0 GPUs that reached DONE.
    """
    ids = list(job_ids)
    if not ids:
        return set()
    return {job_id for job_id, kind, to_gpus in run_core(s, _HOLDS, {"ids": ids})
            if kind == ActionKind.HOLD.value
            or (kind == ActionKind.REQUEUE.value and to_gpus == 0)}


MAX_BACKOFF_S = 7 * 86400.0
"""The longest requeue back-off, seconds (a week): a job that keeps missing its
checkpoint is asked again at least this often."""


def requeue_backoff(s: Session, job_ids: Iterable[int], now: datetime, base_s: float,
                    ) -> dict[int, datetime]:
    """Jobs backed off from requeues now, with the time the back-off ends.

    Args:
        job_ids: candidate ``jobs.id`` values.
        now: the daemon's clock.
        base_s: the first back-off, seconds (``DaemonConfig.requeue_backoff_s``); it
            doubles with each missed checkpoint, up to `MAX_BACKOFF_S`.

    Returns:
        ``{jobs.id: until}`` for jobs whose back-off has not ended at ``now``.
    """
    ids = list(job_ids)
    if not ids:
        return {}
    out: dict[int, datetime] = {}
    rows = run_core(s, _NO_CHECKPOINT, {"ids": ids})
    for job_id, n, last in rows:
        # Capped: 2**(n-1) overflows a timedelta after ~30 missed checkpoints, and
        # the decide cycle would then fail at every interval.
        until = last + timedelta(seconds=min(MAX_BACKOFF_S, base_s * 2.0 ** min(int(n) - 1, 64)))
        if until > now:
            out[job_id] = until
    return out


def reporting_runs(s: Session, job_ids: Iterable[int]) -> dict[int, int]:
    """The latest run (Slurm restart count) in which each job has logged progress.

    A job that has not logged progress in its current run is not ready to
    checkpoint: it may not even have installed its signal handler yet, so the
    daemon does not ask it to (``requeue_blocked``). Jobs that never logged
    progress are absent. Samples whose restart is above the job's stored Slurm
    restart count plus `RESTART_SLACK` (stored before ingestion refused them as
    ``future_restart``) count as no run: a job's own attempt counter logged as
    999 no longer makes it ready in every run.
    """
    ids = list(job_ids)
    if not ids:
        return {}
    rows = run_core(s, _RUNS, {"ids": ids})
    return {j: int(r if r is not None else 0) for j, r, logged in rows if logged}
