"""The state store's tables as SQLAlchemy 2.0 typed ORM models.

One class per table. Every time is a timezone-aware UTC `datetime`
(`malleable.db.types.UTCDateTime`: INTEGER microseconds since the epoch on
SQLite, TIMESTAMPTZ on PostgreSQL). Every child row refers to its job by the
surrogate integer ``jobs.id`` (not the Slurm id string) and is deleted with it
(``ON DELETE CASCADE``; SQLite enforces it because the engine turns
``foreign_keys`` on). Each foreign-key column is indexed, so a cascade never
scans a whole table.

Hot queries and the index that serves each:

* latest N progress samples of a job: ``ix_progress_samples_job_time``
  (job_id, time);
* unfinished actions: partial index ``ix_actions_unfinished`` (job_id) WHERE
  finished_at IS NULL;
* jobs by state: ``ix_jobs_state`` (state, malleable).

The schema itself is created and changed only by the Alembic migrations in
``malleable/db/migrations``; a test checks that the migrations and these
models agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from malleable.db.types import BigId, JSONDoc, UTCDateTime
from malleable.slurm.records import JobState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every malleable table (constraint names follow NAMING_CONVENTION)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONDoc}


def _job_fk() -> ForeignKey:
    return ForeignKey("jobs.id", ondelete="CASCADE")


class Job(Base):
    """One Slurm job the daemon has seen (malleable or rigid).

    ``slurm_job_id`` is the id a user types ("123", array task "123_4", het
    component "123+0"); it is unique here, so a Slurm id reused after a
    controller reset updates the old row. ``spec_text`` is the malleable spec
    as the job gave it (its comment), ``spec`` the parsed spec (JSON), and
    ``spec_error`` the parser's message when the spec is bad (the job is then
    treated as rigid). ``gpus``/``nodes``/``gpus_per_node``: allocated when
    running, requested when pending. ``arrival_time``: the first submit time
    (Slurm's ``submit_time`` restarts with every requeue); ``attained_gpu_s``:
    GPU-seconds the job has run so far (attained service).
    """

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state", "state", "malleable"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slurm_job_id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(256), default="", server_default="")
    user: Mapped[str] = mapped_column(String(128), default="", server_default="")
    uid: Mapped[int | None]
    account: Mapped[str] = mapped_column(String(128), default="", server_default="")
    partition: Mapped[str] = mapped_column(String(128), default="", server_default="")
    malleable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    spec_text: Mapped[str | None] = mapped_column(Text)
    spec: Mapped[dict[str, Any] | None]
    spec_error: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(128), default="", server_default="")
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    nodes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpus_per_node: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    submit_time: Mapped[datetime | None]
    start_time: Mapped[datetime | None]
    end_time: Mapped[datetime | None]
    restart_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    # Set once: Slurm resets submit_time on every requeue (revision 0002).
    arrival_time: Mapped[datetime | None]
    # Attained service, GPU-seconds, accumulated at each poll while running (revision 0002).
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class JobEvent(Base):
    """A change of a job seen by the daemon, with its time.

    ``kind``: "new" (first seen), "state" (old_state -> new_state), "size"
    (old/new GPUs and nodes), "restart" (Slurm's restart count grew; ``detail``
    holds the new count), or a job-reported event written by progress
    ingestion (e.g. "checkpointed"; ``detail`` free text).
    """

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_time", "job_id", "time"),
                      # the rare kinds read per cycle, e.g. no_checkpoint (revision 0005)
                      Index("ix_job_events_kind_job", "kind", "job_id", "time"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(_job_fk())
    time: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    old_state: Mapped[str | None] = mapped_column(String(32))
    new_state: Mapped[str | None] = mapped_column(String(32))
    old_gpus: Mapped[int | None]
    new_gpus: Mapped[int | None]
    old_nodes: Mapped[int | None]
    new_nodes: Mapped[int | None]
    detail: Mapped[str | None] = mapped_column(Text)

    # Lets a new job's events be built before the job has an id (no back-reference:
    # the database deletes events with their job).
    job: Mapped[Job] = relationship()


class ProgressSample(Base):
    """One line of a job's progress file.

    ``step``: optimizer steps done; ``samples``: training samples processed in
    total; ``gpus``/``nodes``: what the job ran on; ``batch_size``: global batch
    size; ``metric``: the job's target metric (optional); ``grad_sqr``,
    ``grad_var``: gradient statistics for the noise scale (optional; Pollux's
    estimate of |g|^2 and the gradient variance).
    """

    __tablename__ = "progress_samples"
    __table_args__ = (Index("ix_progress_samples_job_time", "job_id", "time"),
                      # the latest run that logged progress (revision 0004)
                      Index("ix_progress_samples_job_restart", "job_id", "restart"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(_job_fk())
    time: Mapped[datetime]
    step: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[int]
    nodes: Mapped[int | None]
    batch_size: Mapped[int]
    metric: Mapped[float | None] = mapped_column(Float)
    grad_sqr: Mapped[float | None] = mapped_column(Float)
    grad_var: Mapped[float | None] = mapped_column(Float)
    # The run (Slurm restart count) the sample belongs to (revision 0002).
    restart: Mapped[int | None]


class Estimate(Base):
    """An estimator's output for one job at one time.

    ``model``: the estimator's name; ``params``: its fitted parameters (JSON,
    e.g. {"p": 0.7} or Pollux's throughput parameters); ``remaining_work`` and
    ``remaining_work_sd``: remaining work W and its standard deviation (units
    named by the estimator, samples at the initial batch size or steps);
    ``flags``: notes such as {"extrapolated": true}.
    """

    __tablename__ = "estimates"
    __table_args__ = (Index("ix_estimates_job_time", "job_id", "time"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(_job_fk())
    time: Mapped[datetime]
    model: Mapped[str] = mapped_column(String(64), default="", server_default="")
    params: Mapped[dict[str, Any]]
    remaining_work: Mapped[float | None] = mapped_column(Float)
    remaining_work_sd: Mapped[float | None] = mapped_column(Float)
    flags: Mapped[dict[str, Any] | None]


class Decision(Base):
    """One run of the policy: what decided, on which inputs, how well, how fast.

    ``inputs_digest``: a hash of the inputs (jobs, estimates, capacity), so two
    runs on the same inputs can be recognised; ``objective``: the policy's
    objective value (None if it has none); ``duration_s``: wall time of the
    run, seconds; ``dry_run``: the plan was logged but not applied.
    """

    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decisions_time", "time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime]
    policy: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]]
    inputs_digest: Mapped[str] = mapped_column(String(128), default="", server_default="")
    objective: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    targets: Mapped[list[Target]] = relationship(
        back_populates="decision", cascade="all, delete-orphan", passive_deletes=True)


class Target(Base):
    """The plan of one decision for one job: GPUs (0 = not running), batch size, why."""

    __tablename__ = "targets"
    __table_args__ = (
        UniqueConstraint("decision_id", "job_id"),
        Index("ix_targets_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(_job_fk())
    gpus: Mapped[int]
    batch_size: Mapped[int | None]
    reason: Mapped[str] = mapped_column(Text, default="", server_default="")

    decision: Mapped[Decision] = relationship(back_populates="targets")


class Action(Base):
    """A change the actuator makes to one job, recorded before it runs.

    ``kind``: e.g. hold, admit, resize_pending, release, shrink, requeue
    (the daemon's `ActionKind`); ``state``: the step of its state machine as a
    string (the daemon's `Step`); ``from_*``/``to_*``: sizes before and after;
    ``attempts``: Slurm calls tried for the current step; ``next_attempt_at``:
    not before this time (back-off); ``finished_at``: set when the state
    machine reached a terminal step (None = unfinished: retention never touches
    the job); ``restart_count_at_start``: the job's restart count when the
    action began; ``signalled_at``: when the checkpoint signal was recorded.
    """

    __tablename__ = "actions"
    __table_args__ = (
        Index("ix_actions_job_id", "job_id"),
        Index("ix_actions_decision_id", "decision_id"),
        # a job's latest finished hold change, read per cycle (revision 0005)
        Index("ix_actions_job_state_kind", "job_id", "state", "kind", "finished_at"),
        Index("ix_actions_unfinished", "job_id",
              sqlite_where=text("finished_at IS NULL"),
              postgresql_where=text("finished_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(_job_fk())
    decision_id: Mapped[int | None] = mapped_column(
        ForeignKey("decisions.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(32))
    from_gpus: Mapped[int | None]
    to_gpus: Mapped[int]
    from_nodes: Mapped[int | None]
    to_nodes: Mapped[int | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)
    restart_count_at_start: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    signalled_at: Mapped[datetime | None]


class Setting(Base):
    """A key/value setting that admin commands change while the daemon runs.

    Keys in use: "paused" (bool), "policy.name" (str), "policy.params" (object),
    "schema.written_by" (the malleable version that last migrated the schema),
    "retention.thinned.progress_samples" and "retention.thinned.estimates"
    (object: the last thinning run's `malleable.db.retention.ThinMark`).
    """

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONDoc)
    updated_at: Mapped[datetime]


class Lease(Base):
    """The single-daemon lease: exactly one row (id = 1).

    ``holder`` is "host:pid" (None when released); ``heartbeat_at`` is the
    holder's last heartbeat; ``timeout_s`` the holder's own lease timeout in
    seconds (None: taken before revision 0003). See `malleable.db.lease`.
    """

    __tablename__ = "lease"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(256))
    acquired_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    timeout_s: Mapped[float | None] = mapped_column(Float)


class ProgressFile(Base):
    """How far progress ingestion has read one job's progress file.

    ``device``/``inode`` identify the file that ``offset`` belongs to (a new
    file at the same path starts again at 0); ``offset``: bytes consumed so far
    (always at a line boundary); ``size``: the file's size at the last read;
    ``lines_accepted``: lines stored as samples or events so far;
    ``rejected``: rejected-line counts by reason, e.g. {"not_json": 2}.
    """

    __tablename__ = "progress_files"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(_job_fk(), unique=True)
    path: Mapped[str] = mapped_column(Text)
    device: Mapped[int | None] = mapped_column(BigInteger)
    inode: Mapped[int | None] = mapped_column(BigInteger)
    offset: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    size: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    last_read_at: Mapped[datetime | None]
    lines_accepted: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rejected: Mapped[dict[str, Any]] = mapped_column(JSONDoc, default=dict)


#: ``jobs.state`` of a job Slurm stopped listing before the daemon saw how it ended (it
#: was purged after MinJobAge while no poll ran, e.g. the daemon was down) and whose
#: progress does not say it finished. Not a Slurm state: it may have completed, failed or
#: been cancelled, so it is finished but not COMPLETED, and the estimators' work priors
#: and Gittins' size history (which read COMPLETED jobs) leave it out.
VANISHED = "VANISHED"

# States a job never leaves, as stored in ``jobs.state``: Slurm's, and VANISHED.
FINISHED_STATES: frozenset[str] = frozenset(s.value for s in JobState if s.finished) | {VANISHED}
