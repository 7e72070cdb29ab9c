"""The repository the daemon calls: small typed functions over a `Session`.

No function here commits: the caller owns the transaction, so one cycle's
changes land together or not at all::

    Session = session_factory(engine)
    with Session() as s, s.begin():
        upsert_jobs(s, slurm.jobs(), now)

Keep write transactions short (no Slurm call inside one): on SQLite a
read-write session holds the database's write lock from its first statement
to its commit. Jobs are referred to by ``jobs.id`` (an int, see `job_ids`);
times are timezone-aware UTC datetimes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    CursorResult,
    Executable,
    Row,
    Select,
    String,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.types import NullType

from malleable.db.models import (
    FINISHED_STATES,
    Action,
    Decision,
    Estimate,
    Job,
    JobEvent,
    ProgressFile,
    ProgressSample,
    Setting,
    Target,
)
from malleable.slurm.records import JobState, SlurmJob

_log = logging.getLogger(__name__)

# Bound parameters per IN (...) list; SQLite allows 32766, PostgreSQL 65535.
_CHUNK = 500

PAUSED_KEY = "paused"
LAST_POLL_KEY = "daemon.last_poll"
"""When the daemon's last poll of Slurm succeeded (ISO time, UTC): `malleable status`."""
POLICY_NAME_KEY = "policy.name"
POLICY_PARAMS_KEY = "policy.params"
PAUSED_BY_KEY = "paused.by"
POLICY_BY_KEY = "policy.by"
"""Who last changed the pause (``malleable pause``/``resume``) and the operator's policy
(``policy set``/``reset``): `record_operator_change`'s document."""

SpecParser = Callable[[str], Mapping[str, Any] | None]
"""Parses a job's comment: the spec as a mapping, None for no spec (rigid job);
raises ValueError naming the field and value for a bad spec."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""Default of optional arguments of `update_action`: leave the column as it is."""


def run_core(session: Session, statement: Executable, params: Any = None) -> CursorResult:
    """Execute a Core statement on the session's connection, skipping the ORM's
    execution layer (the daemon's hot reads and bulk writes; about half the cost of
    ``session.execute`` per statement). Pending ORM changes are flushed first, as
    ``session.execute`` would autoflush. Build ``statement`` once (a module constant,
    with ``bindparam(..., expanding=True)`` for IN lists): constructing a statement
    costs more than executing it.

    Args:
        session: an open session (its transaction begins here if it has not).
        statement: a Core statement (table columns or ORM attributes; rows, not entities).
        params: bound parameters: a mapping, or a list of mappings (executemany).

    Returns:
        The `CursorResult` (rows for a SELECT).
    """
    if session.new or session.deleted or session.dirty:
        session.flush()
    return session.connection().execute(statement, params)


def _json_each(session: Session) -> bool:
    """Whether the session's database is SQLite with ``json_each``: built in since
    SQLite 3.38.0 (older libraries: the chunked statement instead)."""
    return session.get_bind().dialect.name == "sqlite" and _SQLITE_JSON


_SQLITE_JSON = sqlite3.sqlite_version_info >= (3, 38, 0)


def _chunks(seq: Sequence, n: int = _CHUNK) -> Iterable[Sequence]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


# ---------------------------------------------------------------- jobs


@dataclass(frozen=True)
class UpsertResult:
    """What `upsert_jobs` did: jobs added, jobs changed, events written, Slurm id -> jobs.id
    of the jobs given; ``unlisted``: Slurm id -> jobs.id of the stored jobs in one of the
    ``unlisted_in`` states that were not given (empty if none were asked for);
    ``resized``: jobs.id of the jobs given a "size" or "restart" event; ``evented``:
    jobs.id of the jobs given any event (new, state, size, restart, renamed);
    ``spec_errors``: Slurm id -> the error of each spec parsed in this call (a new job,
    or a changed comment) that is invalid."""

    new: int
    changed: int
    events: int
    ids: dict[str, int]
    unlisted: dict[str, int] = field(default_factory=dict)
    resized: frozenset[int] = frozenset()
    evented: frozenset[int] = frozenset()
    spec_errors: dict[str, str] = field(default_factory=dict)


def _parse(comment: str, parse_spec: SpecParser) -> tuple[dict | None, str | None]:
    try:
        spec = parse_spec(comment)
    except ValueError as exc:
        return None, str(exc) or type(exc).__name__
    return (dict(spec) if spec is not None else None), None


_JOB_FIELDS = ("spec_text", "name", "user", "uid", "account", "partition", "state", "reason",
               "held", "gpus", "nodes", "gpus_per_node", "submit_time", "start_time",
               "end_time", "restart_count")
_EVENT_COLUMNS = ("job_id", "time", "kind", "old_state", "new_state", "old_gpus", "new_gpus",
                  "old_nodes", "new_nodes", "detail")


def _event(job_id: int, time: datetime, kind: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(_EVENT_COLUMNS)
    row.update(job_id=job_id, time=time, kind=kind, **values)
    return row


# What `upsert_jobs` reads and keeps (`JobRows`): the compared fields and what the
# daemon's policy inputs read of an unfinished job (`JobRows.in_states`).
_UPSERT_KEYS = ("id", "slurm_job_id", "last_seen", "attained_gpu_s", *_JOB_FIELDS,
                "malleable", "spec", "spec_error", "first_seen", "arrival_time")
_UPSERT_COLUMNS = [Job.__table__.c[c] for c in _UPSERT_KEYS]
# A kept row's columns (`JobRows`): all of those but ``last_seen``, the same for every
# kept row (`JobRows.seen_at`).
_KEPT_KEYS = tuple(k for k in _UPSERT_KEYS if k != "last_seen")
_UPSERT_SELECT = select(*_UPSERT_COLUMNS).where(
    Job.__table__.c.slurm_job_id.in_(bindparam("ids", expanding=True)))
# The same, and the jobs in the states :states (`upsert_jobs`'s ``unlisted_in``).
_UPSERT_SELECT_OR_IN_STATES = select(*_UPSERT_COLUMNS).where(
    Job.__table__.c.slurm_job_id.in_(bindparam("ids", expanding=True))
    | Job.__table__.c.state.in_(bindparam("states", expanding=True)))
_INSERT_JOB = insert(Job.__table__).returning(Job.__table__.c.id)
_RUNNING = JobState.RUNNING.value   # (an enum member's value is slow to read in a loop)
# Jobs whose only change is the poll's time: one UPDATE per 500 of them.
_TOUCH_JOBS = (update(Job.__table__)
               .where(Job.__table__.c.id.in_(bindparam("ids", expanding=True)))
               .values(last_seen=bindparam("now", type_=Job.__table__.c.last_seen.type)))
# The same for any number of jobs in one statement on SQLite 3.38+ (JSON functions built
# in; `_json_each`): the ids as one JSON array (no parameter per id to render and
# bind; SQLite walks the array and looks each id up by its key).
_TOUCH_JOBS_JSON = (update(Job.__table__)
                    .where(text("jobs.id IN (SELECT value FROM json_each(:ids_json))")
                           .bindparams(bindparam("ids_json", type_=String())))
                    .values(last_seen=bindparam("now", type_=Job.__table__.c.last_seen.type)))
_RENAME_JOB = (update(Job.__table__).where(Job.__table__.c.id == bindparam("_id"))
               .values(slurm_job_id=bindparam("_sid")))
_MOVE_PROGRESS_FILE = (update(ProgressFile.__table__)
                       .where(ProgressFile.__table__.c.job_id == bindparam("_old"))
                       .values(job_id=bindparam("_new")))


def reused_id(stored: Mapping[str, Any], sj: SlurmJob) -> bool:
    """Whether Slurm gave the id of the finished job ``stored`` (a row of ``jobs``) to
    the new job ``sj``: its job ids started again (e.g. the controller's state was
    reset) or wrapped at MaxJobId. A finished job that Slurm requeued comes back with
    a higher restart count; a new one with a later submit time and no more restarts."""
    return (stored["state"] in FINISHED_STATES and sj.restart_count <= stored["restart_count"]
            and stored["submit_time"] is not None and sj.submit_time is not None
            and sj.submit_time > stored["submit_time"])


def renamed_id(slurm_job_id: str, row_id: int) -> str:
    """The ``slurm_job_id`` a finished job's rows keep once Slurm reused its id:
    ``<id>~<jobs.id>`` (no Slurm id has a ``~``)."""
    return f"{slurm_job_id}~{row_id}"
_INSERT_EVENTS = insert(JobEvent.__table__)
_INSERT_SAMPLES = insert(ProgressSample.__table__)
_INSERT_ESTIMATES = insert(Estimate.__table__)
_INSERT_TARGETS = insert(Target.__table__)
_INSERT_DECISION = insert(Decision.__table__)
_UPDATES: dict[tuple[str, tuple[str, ...]], Any] = {}


def _update_by_id(table, keys: tuple[str, ...]):
    """``UPDATE table SET k = :v_k ... WHERE id = :_id`` for these columns (built once)."""
    stmt = _UPDATES.get((table.name, keys))
    if stmt is None:
        stmt = _UPDATES[(table.name, keys)] = update(table).where(
            table.c.id == bindparam("_id", type_=table.c.id.type)).values(
            {k: bindparam(f"v_{k}", type_=table.c[k].type) for k in keys})
    return stmt


def _expire_loaded(session: Session, model: type) -> None:
    """Expire the ``model`` entities the session has loaded (after a Core write to
    their table: they reload on their next access), and no others."""
    for obj in [o for o in session.identity_map.values() if isinstance(o, model)]:
        session.expire(obj)


class JobRow(dict):
    """A row of ``jobs`` as `upsert_jobs` keeps it (`JobRows`): a dict of column name ->
    value whose columns also read as attributes (``row.state``, as a `Job`'s), so the
    readers of table rows take it as they are. Raises AttributeError for a column it
    does not hold.

    The instance's attribute dict is the dict itself, so an attribute reads as fast as
    an item (a ``__getattr__`` would be a call per read: the policy inputs read some
    ten columns of every pending job in every cycle)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__dict__ = self

    def __reduce__(self) -> tuple:
        # A copy or pickle is built as a new row (attributes its own items again),
        # not from a snapshot of the attribute dict.
        return JobRow, (dict(self),)


class JobRows:
    """The ``jobs`` rows of the unfinished jobs as `upsert_jobs` last wrote them, kept in
    memory by a caller that is the only writer of those rows (the daemon), so that a
    poll reads from the database only the jobs not kept here, and the daemon's policy
    inputs read none (`in_states`).

    What it holds: Slurm id -> the row's columns ``_UPSERT_KEYS`` but ``last_seen``
    (`JobRow`; every kept job was in the last poll, so its ``last_seen`` is
    ``seen_at``, that poll's time; and, under ``_sig`` and ``_src``, what was
    compared of the `SlurmJob` it was written from and that record itself), for
    the jobs whose state after the last upsert is one of that call's ``unlisted_in``
    states (unfinished). Finished jobs are not kept (retention deletes only finished
    jobs, so no kept row is deleted under it); nor are the ``unlisted`` jobs an upsert
    returns (the caller changes their rows, e.g. marks them finished). ``complete``:
    every stored job in those states is kept (set by an upsert that read them all).

    The holder must `clear` it when a transaction in which `upsert_jobs` used it
    does not commit (the kept values would then be ahead of the database), and
    whenever something else may have written job rows.
    """

    __slots__ = ("rows", "complete", "states", "seen_at")

    def __init__(self) -> None:
        self.rows: dict[str, JobRow] = {}
        self.complete = False
        self.states: frozenset[str] = frozenset()
        self.seen_at: datetime | None = None

    def clear(self) -> None:
        """Forget every row: the next upsert reads them from the database."""
        self.rows.clear()
        self.complete = False
        self.seen_at = None

    def __len__(self) -> int:
        return len(self.rows)

    def in_states(self, states: Collection[str]) -> list[JobRow] | None:
        """The kept rows of the jobs in ``states`` (in no particular order) when every
        stored job in them is kept (``complete``, and ``states`` among the kept ones);
        None when the database must be read instead. The rows are shared, not copied:
        read-only (`upsert_jobs` replaces a row, it never changes one)."""
        if not self.complete or not self.states.issuperset(states):
            return None
        return [r for r in self.rows.values() if r["state"] in states]


def _signature(sj: SlurmJob) -> tuple:
    """What `upsert_jobs` stores and compares of a Slurm job, in ``_JOB_FIELDS`` order."""
    return (sj.comment or None, sj.name, sj.user, sj.uid, sj.account, sj.partition,
            sj.state.value, sj.reason, sj.held, sj.gpus, sj.node_count, sj.gpus_per_node,
            sj.submit_time, sj.start_time, sj.end_time, sj.restart_count)


def _attained(job: Mapping[str, Any], now: datetime, seen: datetime | None = None
              ) -> float | None:
    """A stored job's attained service at ``now``: the GPUs it held since the last poll
    added while it runs (GPU-seconds), else as stored. ``seen``: the last poll's time,
    for a row that does not hold its ``last_seen`` (a kept one)."""
    if job["state"] == _RUNNING:
        last = job.get("last_seen", seen)
        if last is not None:
            return (job["attained_gpu_s"] or 0.0) + max(0.0, (now - last).total_seconds()) \
                * job["gpus"]
    return job["attained_gpu_s"]   # unchanged: see `upsert_jobs`'s docstring


def upsert_jobs(session: Session, jobs: Iterable[SlurmJob] | dict[str, SlurmJob],
                now: datetime, *,
                parse_spec: SpecParser | None = None,
                unlisted_in: Collection[str] = (),
                known: JobRows | None = None) -> UpsertResult:
    """Insert or update one row per Slurm job, writing a job event for every change.

    Events (`JobEvent.kind`): "new" on first sight; "state" when the state
    changes; "size" when GPUs or nodes change; "restart" when Slurm's restart
    count grows (a requeue); "renamed" on a finished job whose id Slurm gave to a
    new job (`reused_id`): its rows are kept under `renamed_id`, the new job gets
    a row of its own and the finished job's progress-file read position.

    Works on table rows (SQLAlchemy Core), not ORM entities: one SELECT of the
    compared columns per 500 jobs, one INSERT per new job, one executemany per
    set of changed columns and one for the events. Every job given gets
    ``last_seen`` written (and ``attained_gpu_s``, which changes only while it
    runs); the jobs whose only change is the poll's time get it by one
    ``UPDATE ... WHERE id IN (...)`` per 500 jobs. `Job` entities the session had
    loaded are expired (they reload on their next access).

    Args:
        session: an open read-write session (the caller commits).
        jobs: what Slurm reports now (`SlurmJob`, one poll), or a dict of them by
            ``job_id`` (as the caller keeps them: not copied).
        now: the poll's time (aware UTC); becomes ``last_seen`` (and ``first_seen``
            for new jobs) and the events' time.
        parse_spec: called with the job's comment when it is new or changed;
            returns the malleable spec (job becomes malleable), None (rigid), or
            raises ValueError (stored in ``spec_error``; the job is treated as
            rigid; the other jobs are unaffected). None: leave ``spec`` and
            ``malleable`` as they are (new jobs rigid).
        unlisted_in: states (e.g. the active ones): the stored jobs in one of them
            that ``jobs`` does not list are returned in ``UpsertResult.unlisted``
            (read by the same SELECT; they are not changed here).
        known: the caller's `JobRows` (None: every job given is read). Jobs kept
            there are not read; once it is ``complete`` (after the first call that
            read every stored job in the ``unlisted_in`` states), the unlisted jobs
            are found in it too. Updated here with what this call writes. The
            same rows, events and result as without it, as long as the caller is
            the only writer of job rows (see `JobRows`). A kept job whose values in
            Slurm are those of the last write (its kept signature, or the very
            `SlurmJob` object it was written from: records are frozen) gets only its
            poll time written, and attained service while it runs.

    Returns:
        An `UpsertResult` with counts and the ``jobs.id`` of every job given.
    """
    incoming = jobs if isinstance(jobs, dict) else {j.job_id: j for j in jobs}
    t = Job.__table__
    existing: dict[str, dict[str, Any]] = {}
    unlisted: dict[str, int] = {}
    states = sorted(set(unlisted_in))
    if known is not None and known.states != frozenset(states):
        known.clear()   # (kept for other states: not complete for these)
        known.states = frozenset(states)
    kept = known.rows if known is not None else {}
    from_kept = known is not None and known.complete
    seen = known.seen_at if known is not None else None   # (a kept row's last_seen)
    to_read = [sid for sid in incoming if sid not in kept] if from_kept else list(incoming)
    if from_kept:
        for sid, row in kept.items():
            if sid in incoming:
                existing[sid] = row
            elif row["state"] in known.states:
                unlisted[sid] = row["id"]
        read_states = False
    else:
        read_states = bool(states)
    for i, part in enumerate(_chunks(to_read) if to_read or not read_states else [[]]):
        query, params = _UPSERT_SELECT, {"ids": part}
        if read_states and i == 0:
            query, params = _UPSERT_SELECT_OR_IN_STATES, {"ids": part, "states": states}
        for row in run_core(session, query, params):
            if row.slurm_job_id in incoming:
                existing[row.slurm_job_id] = JobRow(row._mapping)
            else:
                unlisted[row.slurm_job_id] = row.id
    new = changed = 0
    spec_errors: dict[str, str] = {}
    events: list[dict[str, Any]] = []
    ids: dict[str, int] = {}
    updates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    touched: list[int] = []   # jobs.id of the jobs whose only change is last_seen
    moved: dict[str, int] = {}   # Slurm id -> jobs.id of the finished job that had it
    written: dict[str, dict[str, Any]] = {}   # Slurm id -> the row as written, for ``known``

    def write(sid: str, jid: int, job: dict[str, Any], diff: dict[str, Any], sig: tuple,
              src: SlurmJob) -> None:
        # Only what changed is written: a job whose only change is the poll's time is
        # touched with the others.
        only_seen = len(diff) == 2 and diff["attained_gpu_s"] == job["attained_gpu_s"]
        if only_seen:
            touched.append(jid)
        else:
            updates.setdefault(tuple(diff), []).append({"_id": jid, **diff})
        if known is None:
            return
        if job.get("_sig") == sig:   # a kept row, the same but for the poll's time
            written[sid] = job if only_seen else JobRow(job, attained_gpu_s=diff[
                "attained_gpu_s"])
        else:
            written[sid] = JobRow({k: diff.get(k, job[k]) for k in _KEPT_KEYS}, _sig=sig,
                                  _src=src)

    for sid, sj in incoming.items():
        job = existing.get(sid)
        if job is not None and job.get("_src") is sj:
            # A kept row written from this very record (records are frozen; a client
            # may return the same object for an unchanged job, as the simulator's does):
            # nothing Slurm shows changed, no signature to build or compare.
            jid = ids[sid] = job["id"]
            if job["state"] != _RUNNING:
                touched.append(jid)   # (the kept row stays as it is: no copy, no write)
            else:
                write(sid, jid, job, {"last_seen": now,
                                      "attained_gpu_s": _attained(job, now, seen)},
                      job["_sig"], sj)
            continue
        sig = _signature(sj)
        if known is not None and job is not None and job.get("_sig") == sig:
            # Nothing Slurm shows changed since this caller's last write: no event, no
            # field to compare. (The kept row keeps the record it was written from.)
            jid = ids[sid] = job["id"]
            write(sid, jid, job, {"last_seen": now, "attained_gpu_s": _attained(job, now, seen)},
                  sig, sj)
            continue
        if job is not None and reused_id(job, sj):
            # A new job: the finished one keeps its rows under another id, and its
            # progress file's read position passes to the new job (the new job appends
            # to the same spool file, named by the id), so old lines are not read again.
            run_core(session, _RENAME_JOB, {"_id": job["id"], "_sid": renamed_id(sid, job["id"])})
            events.append(_event(job["id"], now, "renamed", detail=(
                f"Slurm gave id {sid} to a new job submitted at "
                f"{sj.submit_time.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}; "
                f"this job's rows are kept as {renamed_id(sid, job['id'])}")))
            moved[sid] = job["id"]
            job = None
        state = sj.state.value
        comment = sj.comment or None
        values = dict(zip(_JOB_FIELDS, sig, strict=True))
        if job is None:
            row = {**values, "slurm_job_id": sid, "first_seen": now, "last_seen": now,
                   "arrival_time": sj.submit_time or now, "attained_gpu_s": 0.0,
                   "malleable": False, "spec": None, "spec_error": None}
            if parse_spec is not None and comment:
                spec, error = _parse(sj.comment, parse_spec)
                row.update(spec=spec, spec_error=error, malleable=spec is not None)
                if error:
                    spec_errors[sid] = error
            jid = run_core(session, _INSERT_JOB, row).scalar_one()
            ids[sid] = jid
            if known is not None:
                written[sid] = JobRow({k: row.get(k) for k in _KEPT_KEYS}, id=jid, _sig=sig,
                                      _src=sj)
            if sid in moved:
                run_core(session, _MOVE_PROGRESS_FILE, {"_old": moved[sid], "_new": jid})
            events.append(_event(jid, now, "new", new_state=state, new_gpus=sj.gpus,
                                 new_nodes=sj.node_count))
            new += 1
            continue
        jid = ids[sid] = job["id"]
        before = len(events)
        diff: dict[str, Any] = {"last_seen": now, "attained_gpu_s": _attained(job, now, seen)}
        if job["state"] != state:
            events.append(_event(jid, now, "state", old_state=job["state"], new_state=state))
        if job["gpus"] != sj.gpus or job["nodes"] != sj.node_count:
            events.append(_event(jid, now, "size", old_gpus=job["gpus"], new_gpus=sj.gpus,
                                 old_nodes=job["nodes"], new_nodes=sj.node_count))
        if sj.restart_count > job["restart_count"]:
            events.append(_event(jid, now, "restart", detail=str(sj.restart_count)))
        changed += len(events) > before
        if parse_spec is not None and comment != job["spec_text"]:
            spec, error = _parse(sj.comment, parse_spec) if comment else (None, None)
            diff.update(spec=spec, spec_error=error, malleable=spec is not None)
            if error:
                spec_errors[sid] = error
        for attr, value in values.items():
            if job[attr] != value:
                diff[attr] = value
        write(sid, jid, job, diff, sig, sj)
    if touched and _json_each(session):
        run_core(session, _TOUCH_JOBS_JSON, {"ids_json": json.dumps(touched), "now": now})
    else:
        for part in _chunks(touched):
            run_core(session, _TOUCH_JOBS, {"ids": list(part), "now": now})
    for keys, rows in updates.items():
        run_core(session, _update_by_id(t, keys),
                 [{"_id": r["_id"], **{f"v_{k}": r[k] for k in keys}} for r in rows])
    if events:
        run_core(session, _INSERT_EVENTS, events)
    # `Job` entities this session had loaded would show the old values: reload on access.
    _expire_loaded(session, Job)
    if known is not None:
        for sid in unlisted:
            kept.pop(sid, None)
        for sid, row in written.items():
            if row["state"] in known.states:
                kept[sid] = row
            else:
                kept.pop(sid, None)
        # Every stored job in the states was read (or kept): the rows are complete.
        known.complete = bool(states) and (from_kept or read_states)
        known.seen_at = now
    resized = frozenset(e["job_id"] for e in events if e["kind"] in ("size", "restart"))
    return UpsertResult(new, changed, len(events), ids, unlisted, resized,
                        frozenset(e["job_id"] for e in events), spec_errors)


def job_ids(session: Session, slurm_job_ids: Iterable[str]) -> dict[str, int]:
    """Slurm job id -> ``jobs.id`` for the ids known to the store (unknown ids are left out)."""
    ids = list(dict.fromkeys(slurm_job_ids))
    out: dict[str, int] = {}
    for part in _chunks(ids):
        out.update((sid, jid) for sid, jid in session.execute(
            select(Job.slurm_job_id, Job.id).where(Job.slurm_job_id.in_(part))))
    return out


def get_job(session: Session, slurm_job_id: str) -> Job | None:
    """The job with this Slurm id, or None."""
    return session.scalars(select(Job).where(Job.slurm_job_id == slurm_job_id)).first()


def jobs_in_states(session: Session, states: Iterable[str], *,
                   malleable: bool | None = None) -> list[Job]:
    """Jobs whose ``state`` is one of ``states`` (e.g. {"PENDING", "RUNNING"}), by ``jobs.id``.

    Args:
        malleable: only malleable (True) or only rigid (False) jobs; None: both.
    """
    q = select(Job).where(Job.state.in_(sorted(set(states))))
    if malleable is not None:
        q = q.where(Job.malleable.is_(malleable))
    return list(session.scalars(q.order_by(Job.id)))


def active_jobs(session: Session, *, malleable: bool | None = None) -> list[Job]:
    """Jobs not in a finished state (PENDING, RUNNING, ...), by ``jobs.id``."""
    q = select(Job).where(Job.state.not_in(sorted(FINISHED_STATES)))
    if malleable is not None:
        q = q.where(Job.malleable.is_(malleable))
    return list(session.scalars(q.order_by(Job.id)))


def reparse_specs(session: Session, parse_spec: SpecParser) -> dict[str, str]:
    """Parse the comment of every active job again with ``parse_spec`` and store the
    result where it differs from the stored one (``spec``, ``spec_error``, ``malleable``).

    The poll parses a comment only when it is new or changed, so a spec stored by an
    older malleable keeps that version's reading; the daemon calls this at start, so
    that stricter rules (batch=2**63-1, no size that holds the batch) hold for the jobs
    it finds too.

    Returns:
        Slurm job id -> error, for the jobs whose spec is invalid now and was not.
    """
    newly_invalid: dict[str, str] = {}
    for job in active_jobs(session):
        if not job.spec_text:
            continue
        spec, error = _parse(job.spec_text, parse_spec)
        if (spec, error) == (job.spec, job.spec_error):
            continue
        if error and not job.spec_error:
            newly_invalid[job.slurm_job_id] = error
        job.spec, job.spec_error, job.malleable = spec, error, spec is not None
    session.flush()
    return newly_invalid


def add_job_event(session: Session, job_id: int, time: datetime, kind: str,
                  detail: str | None = None) -> JobEvent:
    """Record a job-reported event (e.g. kind "checkpointed" from its progress file)."""
    ev = JobEvent(job_id=job_id, time=time, kind=kind, detail=detail)
    session.add(ev)
    return ev


def add_job_events(session: Session, events: Iterable[tuple[int, datetime, str, str | None]]
                   ) -> int:
    """Record job-reported events in bulk (one executemany; `add_job_event` for many).

    Args:
        events: (``jobs.id``, time (aware UTC), kind, detail) per event, in the order
            their ids are to be given.

    Returns:
        The number stored.
    """
    rows = [_event(job_id, time, kind, detail=detail) for job_id, time, kind, detail in events]
    if rows:
        run_core(session, _INSERT_EVENTS, rows)
    return len(rows)


def job_events(session: Session, job_id: int, *, kind: str | None = None) -> list[JobEvent]:
    """A job's events, oldest first (optionally of one kind)."""
    q = select(JobEvent).where(JobEvent.job_id == job_id)
    if kind is not None:
        q = q.where(JobEvent.kind == kind)
    return list(session.scalars(q.order_by(JobEvent.time, JobEvent.id)))


# ---------------------------------------------------------------- progress


@dataclass(frozen=True, slots=True)
class SampleIn:
    """One progress sample to store (see `ProgressSample` for the fields' meaning)."""

    job_id: int
    time: datetime
    step: int
    samples: int
    gpus: int
    batch_size: int
    nodes: int | None = None
    metric: float | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    restart: int | None = None


_SAMPLE_FIELDS = tuple(f.name for f in fields(SampleIn))


def add_progress_samples(session: Session, samples: Iterable[SampleIn | Mapping[str, Any]]
                         ) -> int:
    """Append progress samples in bulk (one executemany). Returns the number stored.

    Raises:
        ValueError: a naive time.
        sqlalchemy.exc.IntegrityError: a ``job_id`` that is not in ``jobs``.
    """
    rows = [{f: getattr(s, f) for f in _SAMPLE_FIELDS} if isinstance(s, SampleIn) else dict(s)
            for s in samples]
    if rows:
        # Core executemany: no ORM identity bookkeeping for rows nobody reads back.
        run_core(session, _INSERT_SAMPLES, rows)
    return len(rows)


SAMPLE_COLUMNS = ("id", "job_id", "time", "step", "samples", "gpus", "nodes", "batch_size",
                  "metric", "grad_sqr", "grad_var", "restart")


def _latest_samples_query():
    cols = [ProgressSample.__table__.c[c] for c in SAMPLE_COLUMNS]
    rn = func.row_number().over(partition_by=cols[1], order_by=(
        ProgressSample.__table__.c.time.desc(), ProgressSample.__table__.c.id.desc())).label("rn")
    inner = select(*cols, rn).where(cols[1].in_(bindparam("ids", expanding=True))).subquery()
    return (select(*[inner.c[c] for c in SAMPLE_COLUMNS]).where(inner.c.rn <= bindparam("n"))
            .order_by(inner.c.job_id, inner.c.time, inner.c.id))


# The latest :n samples of each job in :ids (built once).
_LATEST_SAMPLES = _latest_samples_query()


def latest_samples(session: Session, job_ids: Iterable[int], n: int) -> dict[int, list[Row]]:
    """The latest ``n`` progress samples of each job, oldest first.

    Args:
        job_ids: ``jobs.id`` values.
        n: samples per job (>= 1).

    Returns:
        ``jobs.id`` -> list of rows with attributes ``SAMPLE_COLUMNS`` (time
        ascending); a job without samples maps to an empty list.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n = {n}: expected at least 1 sample per job")
    ids = list(dict.fromkeys(job_ids))
    out: dict[int, list[Row]] = {j: [] for j in ids}
    for part in _chunks(ids):
        for row in run_core(session, _LATEST_SAMPLES, {"ids": part, "n": n}):
            out[row.job_id].append(row)
    return out


def count_samples(session: Session, job_id: int | None = None) -> int:
    """Progress samples stored (of one job, or in all)."""
    q = select(func.count()).select_from(ProgressSample)
    if job_id is not None:
        q = q.where(ProgressSample.job_id == job_id)
    return int(session.scalar(q) or 0)


def get_progress_file(session: Session, job_id: int) -> ProgressFile | None:
    """How far a job's progress file has been read (None: never)."""
    return session.scalars(select(ProgressFile).where(ProgressFile.job_id == job_id)).first()


def save_progress_file(session: Session, *, job_id: int, path: str, device: int | None,
                       inode: int | None, offset: int, size: int, now: datetime,
                       accepted: int = 0, rejected: Mapping[str, int] | None = None,
                       row: ProgressFile | None = UNSET, flush: bool = True,
                       ) -> ProgressFile:
    """Record a read of a job's progress file: where the next read starts and what was rejected.

    Args:
        offset: bytes consumed (the next read starts here); size: the file's size seen.
        device, inode: ``os.stat`` of the file read (a different pair means a new file).
        accepted: lines stored by this read (added to ``lines_accepted``).
        rejected: rejected lines of this read by reason (added to ``rejected``).
        row: the job's `ProgressFile` row if the caller already loaded it in this
            session (None: it has none yet); left UNSET, it is looked up.
        flush: flush now; a caller saving many files flushes once at the end.

    Raises:
        ValueError: a negative offset or size.
    """
    if offset < 0 or size < 0:
        raise ValueError(f"progress file {path}: offset = {offset}, size = {size}: "
                         "expected values >= 0")
    pf = get_progress_file(session, job_id) if row is UNSET else row
    if pf is None:
        pf = ProgressFile(job_id=job_id, path=path, rejected={}, lines_accepted=0)
        session.add(pf)
    pf.path, pf.device, pf.inode, pf.offset, pf.size = path, device, inode, offset, size
    pf.last_read_at = now
    pf.lines_accepted = (pf.lines_accepted or 0) + accepted
    if rejected:
        merged = dict(pf.rejected or {})
        for reason, count in rejected.items():
            merged[reason] = int(merged.get(reason, 0)) + int(count)
        pf.rejected = merged
    if flush:
        session.flush()
    return pf


PROGRESS_FILE_COLUMNS = ("id", "job_id", "path", "device", "inode", "offset", "size",
                         "last_read_at", "lines_accepted", "rejected")


_PROGRESS_FILES = select(*(ProgressFile.__table__.c[c] for c in PROGRESS_FILE_COLUMNS)).where(
    ProgressFile.__table__.c.job_id.in_(bindparam("ids", expanding=True)))


def progress_file_rows(session: Session, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """How far each job's progress file has been read, as plain dicts (no ORM entities).

    Returns:
        ``jobs.id`` -> dict with the keys ``PROGRESS_FILE_COLUMNS``, for the jobs that
        have a `ProgressFile` row; pass them, changed, to `save_progress_files`.
    """
    out: dict[int, dict[str, Any]] = {}
    for part in _chunks(list(dict.fromkeys(job_ids))):
        for row in run_core(session, _PROGRESS_FILES, {"ids": part}):
            out[row.job_id] = row._asdict()
    return out


_PF_PREFIX = "pf_"


def with_progress_files(query: Select) -> Select:
    """``query`` (a SELECT of ``jobs`` columns) with each job's `ProgressFile` row
    joined (LEFT OUTER: None columns for a job without one), its columns labelled
    for `progress_files_of`. Build it once: the daemon reads the jobs to ingest and
    their rows in one statement instead of two."""
    t = ProgressFile.__table__
    return query.outerjoin(t, t.c.job_id == Job.__table__.c.id).add_columns(
        *(t.c[c].label(_PF_PREFIX + c) for c in PROGRESS_FILE_COLUMNS))


def progress_files_of(rows: Iterable[Row]) -> dict[int, dict[str, Any]]:
    """The `progress_file_rows` result (same keys, same values) from the rows of a
    `with_progress_files` query: ``jobs.id`` -> row dict, for the jobs that have one."""
    out: dict[int, dict[str, Any]] = {}
    keys = [(c, _PF_PREFIX + c) for c in PROGRESS_FILE_COLUMNS]
    for row in rows:
        m = row._mapping
        if m[_PF_PREFIX + "id"] is not None:
            out[m[_PF_PREFIX + "job_id"]] = {c: m[k] for c, k in keys}
    return out


def read_progress_file(pf: dict[str, Any] | None, *, job_id: int, path: str,
                       device: int | None, inode: int | None, offset: int, size: int,
                       now: datetime, accepted: int = 0,
                       rejected: Mapping[str, int] | None = None) -> dict[str, Any]:
    """`save_progress_file` on a row dict of `progress_file_rows` (None: the job has no
    row yet), in memory: returns the updated dict (``id`` None for a new row) for
    `save_progress_files`.

    Raises:
        ValueError: a negative offset or size.
    """
    if offset < 0 or size < 0:
        raise ValueError(f"progress file {path}: offset = {offset}, size = {size}: "
                         "expected values >= 0")
    if pf is None:
        pf = {"id": None, "job_id": job_id, "rejected": {}, "lines_accepted": 0}
    pf.update(path=path, device=device, inode=inode, offset=offset, size=size,
              last_read_at=now, lines_accepted=(pf.get("lines_accepted") or 0) + accepted)
    if rejected:
        merged = dict(pf.get("rejected") or {})
        for reason, count in rejected.items():
            merged[reason] = int(merged.get(reason, 0)) + int(count)
        pf["rejected"] = merged
    return pf


def save_progress_files(session: Session, rows: Iterable[dict[str, Any]],
                        before: Mapping[int, Mapping[str, Any]] | None = None) -> int:
    """Write row dicts of `read_progress_file`: one executemany for the new rows
    (``id`` None) and, for the rows that exist, one per set of columns written.

    Args:
        rows: the row dicts.
        before: ``jobs.id`` -> the row as it was read (`progress_file_rows`), before
            `read_progress_file` changed it: a column still equal to it is not
            written (usually only offset, size, last_read_at and lines_accepted
            change). None, or a row missing from it: every column is written.

    Returns:
        The number of rows given.
    """
    t = ProgressFile.__table__
    rows = list(rows)
    new = [{c: r.get(c) for c in PROGRESS_FILE_COLUMNS if c != "id"} for r in rows
           if r.get("id") is None]
    keys = [c for c in PROGRESS_FILE_COLUMNS if c not in ("id", "job_id")]
    updates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("id") is None:
            continue
        was = before.get(r["job_id"]) if before is not None else None
        changed = tuple(k for k in keys if was is None or was.get(k) != r[k])
        if changed:
            updates.setdefault(changed, []).append(
                {"_id": r["id"], **{f"v_{k}": r[k] for k in changed}})
    for changed, params in updates.items():
        run_core(session, _update_by_id(t, changed), params)
    if new:
        run_core(session, insert(t), new)
    return len(rows)


# ---------------------------------------------------------------- estimates and decisions


def record_estimate(session: Session, *, job_id: int, time: datetime, model: str,
                    params: Mapping[str, Any], remaining_work: float | None,
                    remaining_work_sd: float | None,
                    flags: Mapping[str, Any] | None = None) -> Estimate:
    """Store an estimator's output for one job (see `Estimate`)."""
    est = Estimate(job_id=job_id, time=time, model=model, params=dict(params),
                   remaining_work=remaining_work, remaining_work_sd=remaining_work_sd,
                   flags=dict(flags) if flags is not None else None)
    session.add(est)
    session.flush()
    return est


def record_estimates(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Store many estimates in one executemany (the daemon's per-cycle write).

    Args:
        rows: mappings with the keyword arguments of `record_estimate` (job_id, time,
            model, params, remaining_work, remaining_work_sd, flags).

    Returns:
        The number stored.
    """
    rows = [{"job_id": r["job_id"], "time": r["time"], "model": r["model"],
             "params": dict(r["params"]), "remaining_work": r.get("remaining_work"),
             "remaining_work_sd": r.get("remaining_work_sd"),
             "flags": dict(r["flags"]) if r.get("flags") is not None else None}
            for r in rows]
    if rows:
        run_core(session, _INSERT_ESTIMATES, rows)
    return len(rows)


def latest_estimates(session: Session, job_ids: Iterable[int]) -> dict[int, Estimate]:
    """The newest estimate of each job that has one (``jobs.id`` -> `Estimate`)."""
    ids = list(dict.fromkeys(job_ids))
    out: dict[int, Estimate] = {}
    for part in _chunks(ids):
        newest = (select(Estimate.job_id, func.max(Estimate.id).label("id"))
                  .where(Estimate.job_id.in_(part)).group_by(Estimate.job_id).subquery())
        for est in session.scalars(select(Estimate).join(newest, Estimate.id == newest.c.id)):
            out[est.job_id] = est
    return out


@dataclass(frozen=True)
class TargetIn:
    """A policy's target for one job: GPUs (0 = not running), batch size, reason."""

    job_id: int
    gpus: int
    batch_size: int | None = None
    reason: str = ""


def record_decision(session: Session, *, time: datetime, policy: str,
                    params: Mapping[str, Any], inputs_digest: str, objective: float | None,
                    duration_s: float, dry_run: bool, targets: Iterable[TargetIn]) -> int:
    """Store one policy run and its targets (one row per job). Returns the decision's id
    (``decisions.id``; `latest_decision` or ``session.get(Decision, id)`` loads it).

    Two Core statements, no ORM entity (the daemon records one decision per cycle).

    Raises:
        ValueError: a negative duration or GPU count.
        sqlalchemy.exc.IntegrityError: two targets for one job, or an unknown job.
    """
    if duration_s < 0:
        raise ValueError(f"duration_s = {duration_s}: expected a value >= 0")
    rows = []
    for t in targets:
        if t.gpus < 0:
            raise ValueError(f"target for job {t.job_id}: gpus = {t.gpus}: expected >= 0")
        rows.append({"job_id": t.job_id, "gpus": t.gpus, "batch_size": t.batch_size,
                     "reason": t.reason})
    decision_id = run_core(session, _INSERT_DECISION, {
        "time": time, "policy": policy, "params": dict(params), "inputs_digest": inputs_digest,
        "objective": objective, "duration_s": duration_s, "dry_run": dry_run,
    }).inserted_primary_key[0]
    if rows:
        # Core executemany: one statement for all targets.
        run_core(session, _INSERT_TARGETS, [{"decision_id": decision_id, **r} for r in rows])
    return int(decision_id)


def latest_decision(session: Session) -> Decision | None:
    """The newest decision (its ``targets`` load on access), or None."""
    return session.scalars(select(Decision).order_by(Decision.id.desc()).limit(1)).first()


# ---------------------------------------------------------------- actions


def create_action(session: Session, *, job_id: int, kind: str, state: str, to_gpus: int,
                  now: datetime, from_gpus: int | None = None, from_nodes: int | None = None,
                  to_nodes: int | None = None, decision_id: int | None = None,
                  next_attempt_at: datetime | None = None, restart_count_at_start: int = 0,
                  note: str | None = None) -> Action:
    """Record a new action (before it runs). Returns it with its id.

    Raises:
        ValueError: a negative size.
    """
    for name, v in (("to_gpus", to_gpus), ("from_gpus", from_gpus), ("to_nodes", to_nodes),
                    ("from_nodes", from_nodes)):
        if v is not None and v < 0:
            raise ValueError(f"action {kind} for job {job_id}: {name} = {v}: expected >= 0")
    a = Action(job_id=job_id, kind=kind, state=state, from_gpus=from_gpus, to_gpus=to_gpus,
               from_nodes=from_nodes, to_nodes=to_nodes, decision_id=decision_id, attempts=0,
               created_at=now, updated_at=now, next_attempt_at=next_attempt_at,
               restart_count_at_start=restart_count_at_start, note=note)
    session.add(a)
    session.flush()
    return a


def update_action(session: Session, action_id: int, *, now: datetime, state: str = UNSET,
                  attempts: int = UNSET, add_attempt: bool = False, last_error: str | None = UNSET,
                  next_attempt_at: datetime | None = UNSET, note: str | None = UNSET,
                  signalled_at: datetime | None = UNSET, finished: bool = False) -> Action:
    """Change an action; arguments left UNSET keep their value; ``updated_at`` becomes ``now``.

    One Core ``UPDATE`` of the changed columns (the actuator's per-step write; the
    ORM's flush of one entity costs about three times as much). The session's
    `Action` entity gets the same values as loaded ones, so it stays what the row is.

    Args:
        add_attempt: add one to ``attempts`` (after ``attempts`` if both given).
        finished: the state machine reached a terminal step: set ``finished_at``.

    Returns:
        The action's entity, with the new values.

    Raises:
        LookupError: no action with this id.
    """
    a = session.get(Action, action_id)
    if a is None:
        raise LookupError(f"action {action_id}: no such action")
    values: dict[str, Any] = {}
    if state is not UNSET:
        values["state"] = state
    if attempts is not UNSET:
        values["attempts"] = attempts
    if add_attempt:
        values["attempts"] = (values.get("attempts", a.attempts) or 0) + 1
    if last_error is not UNSET:
        values["last_error"] = last_error
    if next_attempt_at is not UNSET:
        values["next_attempt_at"] = next_attempt_at
    if note is not UNSET:
        values["note"] = note
    if signalled_at is not UNSET:
        values["signalled_at"] = signalled_at
    if finished and a.finished_at is None:
        values["finished_at"] = now
    values["updated_at"] = now
    run_core(session, _update_by_id(Action.__table__, tuple(values)),
             {"_id": a.id, **{f"v_{k}": v for k, v in values.items()}})
    for k, v in values.items():
        set_committed_value(a, k, v)
    return a


# No ORDER BY in SQL: with one, SQLite walks the whole table in id order instead of the
# partial index ix_actions_unfinished (which holds only the unfinished few).
_UNFINISHED_ACTIONS = select(Action.__table__).where(Action.finished_at.is_(None))
_BY_ID = attrgetter("id")


def unfinished_action_rows(session: Session) -> list[Row]:
    """The actions not finished yet, oldest (lowest id) first, as read-only table rows
    (every `Action` column). One indexed read: its cost follows the unfinished actions,
    not all the actions ever recorded."""
    return sorted(run_core(session, _UNFINISHED_ACTIONS).all(), key=_BY_ID)


def unfinished_actions(session: Session, *, job_id: int | None = None) -> list[Action]:
    """Actions whose state machine has not finished (``finished_at`` is NULL), oldest first."""
    q = select(Action).where(Action.finished_at.is_(None))
    if job_id is not None:
        q = q.where(Action.job_id == job_id)
    return sorted(session.scalars(q), key=_BY_ID)  # (see _UNFINISHED_ACTIONS)


# ---------------------------------------------------------------- settings


_SETTING = select(Setting.value).where(Setting.key == bindparam("key"))
_POLICY_SETTINGS = select(Setting.key, Setting.value).where(
    Setting.key.in_((POLICY_NAME_KEY, POLICY_PARAMS_KEY)))


_RAW_SETTINGS = select(Setting.key, type_coerce(Setting.value, NullType())).where(
    Setting.key.in_(bindparam("keys", expanding=True)))


def corrupt_setting(session: Session, keys: Collection[str]) -> tuple[str, str] | None:
    """The first of ``keys`` whose stored value is not valid JSON, or None.

    Reading such a row through `Setting` raises the JSON decoder's ValueError (an
    SQLite file edited by hand: ``UPDATE settings SET value = '{bad'``); the admin
    commands ask here first to name the key instead. PostgreSQL's JSONB holds valid
    JSON only: None there, without a query.

    Returns:
        ``(key, the stored value as text)``, or None when every row of ``keys`` that
        exists decodes.
    """
    if session.get_bind().dialect.name != "sqlite":
        return None
    _, bad = _decode_settings(session, keys)
    return next(iter(bad.items()), None)


def _decode_settings(session: Session, keys: Collection[str]
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """Settings ``keys`` read as stored and decoded one by one (SQLite; on another
    database the driver has decoded them already).

    Returns:
        (key -> value for the rows that decode, SQL NULL as None; key -> stored text
        for those that do not, not text (an INTEGER, a BLOB) as its repr), each in key
        order.
    """
    decode = session.get_bind().dialect.name == "sqlite"
    good: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for key, raw in sorted(run_core(session, _RAW_SETTINGS, {"keys": list(keys)}).all()):
        if raw is None or not decode:   # (SQL NULL: None, as `get_setting` reads it)
            good[key] = raw
            continue
        try:
            good[key] = json.loads(raw)
        except (TypeError, ValueError):   # not text, or not JSON
            bad[key] = raw if isinstance(raw, str) else repr(raw)
    return good, bad


def get_setting(session: Session, key: str, default: Any = None) -> Any:
    """The value (any JSON value) of setting ``key``, or ``default`` when unset."""
    row = run_core(session, _SETTING, {"key": key}).first()
    return default if row is None else row[0]


_UPSERT_SETTING: dict[str, Any] = {}


def _upsert_setting(dialect: str):
    """``INSERT ... ON CONFLICT (key) DO UPDATE`` of one setting, for SQLite or
    PostgreSQL (built once per dialect; the values are bound at execution)."""
    stmt = _UPSERT_SETTING.get(dialect)
    if stmt is None:
        ins = (sqlite_insert if dialect == "sqlite" else pg_insert)(Setting.__table__)
        stmt = _UPSERT_SETTING[dialect] = ins.on_conflict_do_update(
            index_elements=["key"], set_={"value": ins.excluded.value,
                                          "updated_at": ins.excluded.updated_at})
    return stmt


def set_setting(session: Session, key: str, value: Any, now: datetime | None = None) -> None:
    """Set ``key`` to a JSON-serialisable ``value`` (insert or update in one statement).

    On SQLite and PostgreSQL one upsert, no read; `Setting` entities the session
    had loaded are expired (they reload on their next access).
    """
    now = now or datetime.now(UTC)
    dialect = session.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        run_core(session, _upsert_setting(dialect),
                 {"key": key, "value": value, "updated_at": now})
        _expire_loaded(session, Setting)
        return
    row = session.get(Setting, key)
    if row is None:
        session.add(Setting(key=key, value=value, updated_at=now))
    else:
        row.value, row.updated_at = value, now
    session.flush()


def is_paused(session: Session) -> bool:
    """True when an operator paused the daemon (it plans nothing and changes nothing)."""
    return bool(get_setting(session, PAUSED_KEY, False))


def set_paused(session: Session, paused: bool, now: datetime | None = None) -> None:
    """Pause (True) or resume (False) the daemon."""
    set_setting(session, PAUSED_KEY, bool(paused), now)


def active_policy(session: Session, default_name: str,
                  default_params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The active policy: (name, params) as set by an operator, else the given defaults
    (``[policy] name`` and ``params`` from the configuration)."""
    got = dict(run_core(session, _POLICY_SETTINGS).all())  # one query
    name = got.get(POLICY_NAME_KEY)
    if name is None:
        return default_name, dict(default_params or {})
    return str(name), dict(got.get(POLICY_PARAMS_KEY) or {})


_OPERATOR_SETTINGS = select(Setting.key, Setting.value).where(
    Setting.key.in_((PAUSED_KEY, POLICY_NAME_KEY, POLICY_PARAMS_KEY)))


def operator_settings(session: Session) -> tuple[bool, tuple[str, dict[str, Any]] | None]:
    """What operators set, in one query: (paused, (policy name, params) or None when no
    operator chose a policy). The same values as `is_paused` and `active_policy`.

    A row that is not valid JSON (an SQLite file edited by hand, `corrupt_setting`), or
    policy parameters that are not a JSON object, must not stop the daemon's poll,
    which reads them: an unreadable pause reads as paused (the daemon then starts no
    action, the safe side), unreadable policy rows as no operator's choice (the
    configuration's policy), each with an error in the log saying how to repair it
    (`malleable resume` or `pause`, `malleable policy reset`).
    """
    try:
        got = dict(run_core(session, _OPERATOR_SETTINGS).all())
    except (TypeError, ValueError):   # (the JSON type's decoder: `corrupt_setting`)
        got = _readable_settings(session, (PAUSED_KEY, POLICY_NAME_KEY, POLICY_PARAMS_KEY))
    params = got.get(POLICY_PARAMS_KEY) or {}
    if not isinstance(params, Mapping):
        _log.error("settings row %r holds %r, not a JSON object: using the configuration's "
                   "policy; `malleable policy reset` clears it", POLICY_PARAMS_KEY, params)
        got[POLICY_NAME_KEY] = None
    name = got.get(POLICY_NAME_KEY)
    policy = None if name is None else (str(name), dict(params))
    return bool(got.get(PAUSED_KEY, False)), policy


def _readable_settings(session: Session, keys: Sequence[str]) -> dict[str, Any]:
    """The values of settings ``keys``, each decoded on its own (`operator_settings`):
    a pause that is not JSON reads as True, a policy row that is not JSON drops the
    operator's policy (name and params); each is logged as an error."""
    out, bad = _decode_settings(session, keys)
    for key, raw in bad.items():
        paused = key == PAUSED_KEY
        _log.error("settings row %r holds %r, which is not valid JSON: %s; %s", key, raw,
                   "taken as paused (no action is started)" if paused
                   else "using the configuration's policy",
                   "`malleable resume` (or `pause`) rewrites it" if paused
                   else "`malleable policy reset` clears it")
        if paused:
            out[key] = True
        else:
            out.pop(POLICY_NAME_KEY, None)
            out.pop(POLICY_PARAMS_KEY, None)
    return out


def record_operator_change(session: Session, key: str, command: str, by: str, host: str,
                           now: datetime) -> None:
    """Record who made an operator's change, under ``key`` (`PAUSED_BY_KEY` or
    `POLICY_BY_KEY`): ``{"command": "pause", "by": "alice (uid 1000)", "host": ...,
    "time": ISO 8601 UTC}``. The daemon's log line for the change and `malleable status`
    name them."""
    set_setting(session, key, {"command": command, "by": by, "host": host,
                               "time": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                now)


def operator_change(session: Session, key: str,
                    commands: Collection[str] | None = None) -> dict[str, str] | None:
    """The document `record_operator_change` stored under ``key``, or None: none stored,
    not one it writes (a store older than this record), or, with ``commands``, a record
    of another command (e.g. the ``resume`` after the ``pause`` asked about)."""
    got = get_setting(session, key)
    if not isinstance(got, Mapping) or not all(isinstance(got.get(f), str)
                                               for f in ("command", "by", "host", "time")):
        return None
    if commands is not None and got["command"] not in commands:
        return None
    # Printable only: the values go into log lines and the status view.
    return {f: "".join(c if c.isprintable() else "?" for c in got[f])
            for f in ("command", "by", "host", "time")}


def set_policy(session: Session, name: str, params: Mapping[str, Any] | None = None,
               now: datetime | None = None) -> None:
    """Make ``name`` with ``params`` the active policy (the daemon uses it from its next cycle)."""
    set_setting(session, POLICY_NAME_KEY, name, now)
    set_setting(session, POLICY_PARAMS_KEY, dict(params or {}), now)


_CLEAR_POLICY = delete(Setting).where(Setting.key.in_((POLICY_NAME_KEY, POLICY_PARAMS_KEY)))


def clear_policy(session: Session) -> bool:
    """Forget an operator's policy choice: the configuration's ``[policy]`` applies again
    from the daemon's next cycle. Returns True if a choice was stored.

    The rows are deleted without being read, so a value that is not valid JSON
    (`corrupt_setting`) is cleared too; `Setting` entities the session had loaded
    are expired."""
    deleted = run_core(session, _CLEAR_POLICY).rowcount
    _expire_loaded(session, Setting)
    return bool(deleted)
