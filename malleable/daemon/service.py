"""The service: the decision loop on APScheduler, with lease, signals and systemd.

`run_service` is what ``malleable daemon`` runs in the foreground:

1. open the state store and refuse an older or newer schema (an empty
   database is created at the current schema);
2. take the single-daemon lease (a second daemon refuses to start, naming the
   holder). A lease whose holder is a process of this host that no longer
   exists (this daemon's previous run, killed or crashed) is taken over at
   once instead of after ``lease_timeout_s``;
3. read the cluster (version, nodes: logged with the RPCs it took; Slurm being
   down is logged and not fatal), one poll (so the first decision sees the
   cluster), then READY=1 to systemd;
4. APScheduler (3.x, blocking scheduler, ONE worker thread so jobs never
   overlap, missed runs coalesced): ``poll`` every poll_interval_s, ``ingest``
   every ingest_interval_s, ``decide`` every decide_interval_s,
   ``housekeeping`` (retention) every housekeeping_interval_s, and the lease
   heartbeat with the systemd watchdog ping;
5. SIGHUP: reload the configuration (a bad file is refused, the old one kept);
   SIGTERM/SIGINT: stop after the job in progress (its current Slurm call
   completes and is recorded), release the daemon's admission holds, give the
   lease back, exit 0.

Test hook: with ``MALLEABLE_TEST_CRASH_AT`` set, the actuator kills the
process at the listed points (`malleable.daemon.testhook`); unset, nothing.

``--once`` runs one decide cycle (after the same checks) and exits, 1 if Slurm did
not answer its poll (nothing decided), else 0: for cron
and tests.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy.exc import DBAPIError

from malleable.config import Config, check_policy, load_config
from malleable.daemon.cycle import CycleReport, Daemon, spec_as_dict
from malleable.daemon.logs import job_logger
from malleable.daemon.systemd import Notifier
from malleable.daemon.testhook import crash_points_from_env
from malleable.db import schema, store
from malleable.db.engine import engine_from_config, session_factory
from malleable.db.errors import DatabaseUnavailable, StoreError
from malleable.db.lease import (
    LeaseLost,
    acquire_lease,
    dead_local_holder,
    default_holder,
    heartbeat_lease,
    read_lease,
    release_lease,
)
from malleable.db.retention import apply_retention
from malleable.progress.spool import ensure_spool_dir
from malleable.slurm import connect
from malleable.slurm.client import SlurmError, SlurmUnavailable

log = logging.getLogger(__name__)

# The exit code of a daemon whose SQLite file went away under it: the unit's
# RestartPreventExitStatus, so that systemd does not restart it into a new, empty
# database that knows nothing of the jobs it held.
DATABASE_GONE_EXIT = 3


def utcnow() -> datetime:
    """The daemon's wall clock (the only place the service reads it)."""
    return datetime.now(UTC)


def log_failure(what: str, exc: Exception,
                then: str = "will run again at the next interval") -> None:
    """Log a scheduled job's failure: one error line when the database is unusable (full,
    read-only, locked, gone: `DatabaseUnavailable`, which names the database and the
    cause), which can last for many cycles; with the traceback for anything else (a bug).

    Args:
        what: the job ("poll cycle", "decide cycle", "heartbeat", ...).
        exc: what it raised.
        then: what happens next, ending the line.
    """
    if isinstance(exc, DatabaseUnavailable):
        log.error("%s failed, database unavailable: %s; %s", what, exc, then)
    else:
        log.exception("%s failed (%s); %s", what, exc, then)


@dataclass(frozen=True)
class DatabaseFile:
    """The SQLite file the daemon opened, by path and identity (device, inode).

    Attributes:
        path: the file (absolute); dev, ino: its ``os.stat`` identity at start.
    """

    path: str
    dev: int
    ino: int

    @classmethod
    def of(cls, engine) -> DatabaseFile | None:
        """The file of an SQLite ``engine`` (None: another database, or in memory)."""
        if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return None
        path = os.path.abspath(engine.url.database)
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(path, st.st_dev, st.st_ino)

    def changed(self) -> str | None:
        """How the file changed since start ("was removed", "was replaced by another
        file"), or None while it is the same file."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "was removed (or moved away)"
        except OSError:
            return None   # (unreadable now: the cycles report why)
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            return "was replaced by another file"
        return None

    def save_gone(self, stamp: str) -> str:
        """After the file went (`changed`): save what this process still holds open of
        it, and remove its stale companions at the path.

        SQLite keeps the newest writes in the write-ahead log beside the path
        (``<path>-wal``) until a checkpoint, which a connection to a moved or deleted file
        can no longer make; so the moved file lacks them, and a file put in its place
        is corrupted by that log when it is next opened. The old file and its log, read
        through this process's open descriptors (``/proc/self/fd``), are copied to
        ``<path>.gone-<stamp>`` and ``<path>.gone-<stamp>-wal`` (0600; opened as a
        database, the pair is the store as the daemon last had it); then ``<path>-wal``
        and ``<path>-shm`` are removed if they are the ones this process has open.

        Args:
            stamp: names the copy (e.g. a UTC time, ``20261205T080000Z``).

        Returns:
            One sentence for the log: what was saved and removed, or why not.
        """
        try:
            files = _open_files()
            db = next((f for f in files if (f.dev, f.ino) == (self.dev, self.ino)), None)
            if db is None:
                return "this process no longer holds the old file open: nothing was saved"
            # The log is named after the path the file was opened by (moved together with
            # the file, it is named after the file's new path).
            names = {db.name.removesuffix(" (deleted)") + "-wal", self.path + "-wal"}
            wal = next((f for f in files if f.name.removesuffix(" (deleted)") in names), None)
            target = f"{self.path}.gone-{stamp}"
            _copy_private(db.proc, target)
            if wal is not None:
                _copy_private(wal.proc, target + "-wal")
            removed = []
            for suffix in ("-wal", "-shm"):
                try:
                    st = os.stat(self.path + suffix)
                except OSError:
                    continue
                if any((f.dev, f.ino) == (st.st_dev, st.st_ino) for f in files):
                    os.unlink(self.path + suffix)
                    removed.append(self.path + suffix)
        except OSError as exc:
            return f"saving the old file failed ({exc.strerror or exc})"
        said = f"the database as this daemon last had it is saved as {target}"
        if wal is not None:
            said += f" with its write-ahead log {target}-wal (open it as a database)"
        if removed:
            said += (f"; the old file's {' and '.join(removed)} removed, so that a file put "
                     "in its place does not replay them")
        return said


@dataclass(frozen=True)
class _OpenFile:
    proc: str    # /proc/self/fd/N
    name: str    # where it points ("... (deleted)" for a removed file)
    dev: int
    ino: int


def _open_files() -> list[_OpenFile]:
    """This process's open files (Linux ``/proc/self/fd``)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        proc = f"/proc/self/fd/{fd}"
        try:
            st = os.stat(proc)
            name = os.readlink(proc)
        except OSError:
            continue
        out.append(_OpenFile(proc, name, st.st_dev, st.st_ino))
    return out


def _copy_private(src: str, dst: str) -> None:
    """Copy ``src`` to a new file ``dst`` of mode 0600 (never over an existing one)."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        shutil.copyfileobj(fin, fout)


@dataclass
class ServiceOptions:
    """How ``malleable daemon`` was started.

    Attributes:
        config_path: the TOML file (None: default search).
        dry_run: plan and log, change nothing (overrides the file's ``daemon.dry_run``).
        once: one decide cycle, then exit.
        metrics_factory: makes the metrics sink (a callable receiving each `CycleReport`:
            the Prometheus exporter, or None) once the lease is taken; the exporter binds
            its port then, so a second daemon names the lease holder rather than failing
            on the first one's port. It may raise OSError or ValueError, which stop the
            start.
    """

    config_path: str | None = None
    dry_run: bool = False
    once: bool = False
    metrics_factory: Callable[[], Callable[[CycleReport], None] | None] | None = None


class Service:
    """One daemon process: owns the engine, the lease, the scheduler and the `Daemon`."""

    def __init__(self, config: Config, options: ServiceOptions) -> None:
        self.config = config
        self.options = options
        self.notifier = Notifier()
        # The spool first: a bad one is refused before the database is created.
        try:
            problems = ensure_spool_dir(config.progress.spool_dir)
        except OSError as exc:
            raise ValueError(f"progress.spool_dir = {config.progress.spool_dir!r}: "
                             f"{exc.strerror or exc}") from None
        for p in problems:
            log.warning("spool %s: %s", config.progress.spool_dir, p)
        self.engine = engine_from_config(config)
        schema.prepare_schema(self.engine)
        self.db_file = DatabaseFile.of(self.engine)
        self.exit_code = 0   # what `start` returns after a stop (DATABASE_GONE_EXIT)
        self.sessions = session_factory(self.engine)
        self._reparse_specs()
        self.holder = default_holder()
        self.dry_run = bool(options.dry_run or config.daemon.dry_run)
        self._stopping = threading.Event()
        # A stop ends the port's retries (their back-off waits), so that a stop while
        # Slurm does not answer completes within systemd's TimeoutStopSec.
        self.daemon = Daemon(slurm=connect(config.slurm, sleep=self._retry_wait),
                             sessions=self.sessions, clock=utcnow,
                             spool_dir=config.progress.spool_dir, config=config,
                             dry_run=self.dry_run)
        self.daemon.actuator.step_hook = crash_points_from_env()
        self.scheduler: BlockingScheduler | None = None
        self.metrics: Callable[[CycleReport], None] | None = None   # see metrics_factory
        self.daemon.stopping = self._stopping.is_set   # a poll the stop cut short is no outage
        # Held while a scheduled job runs: the stop waits for it before cleaning up.
        self._busy = threading.Lock()
        # time.monotonic() when the running cycle started (None: idle), for the heartbeat.
        self._cycle_since: float | None = None

    # ------------------------------------------------------------------ jobs

    def _reparse_specs(self) -> None:
        """Read the active jobs' specs again under this version's rules (`store.reparse_specs`):
        a spec an older malleable accepted and this one refuses leaves its job rigid."""
        with self.sessions() as s, s.begin():
            invalid = store.reparse_specs(s, spec_as_dict)
        for sid, error in invalid.items():
            job_logger(log, sid).warning("invalid malleable spec under this version's rules, "
                                         "left to Slurm as a rigid job: %s", error)

    def _database_gone(self) -> bool:
        """True (and the daemon stopping, exit code `DATABASE_GONE_EXIT`) once the SQLite
        file was removed or replaced under the running daemon: it would go on writing to
        the old file until a new connection created an empty one in its place (no
        schema: every cycle then failed)."""
        why = self.db_file.changed() if self.db_file is not None else None
        if why is None:
            return False
        if not self._stopping.is_set():
            log.error("the database file %s %s while the daemon ran; stopping (exit %d) "
                      "without writing to it again (what it held is saved beside it as it "
                      "stops)", self.db_file.path, why, DATABASE_GONE_EXIT)
            self.exit_code = DATABASE_GONE_EXIT
            self.stop()
        return True

    def _run(self, fn: Callable[[], CycleReport | None], what: str) -> None:
        """Run one scheduled job; an exception is logged and the next run tries again."""
        with self._busy:
            if self._stopping.is_set() or self._database_gone():
                return
            self._cycle_since = time.monotonic()
            try:
                report = fn()
            except Exception as exc:  # the service must outlive any single cycle's failure
                log_failure(what, exc)
                if isinstance(exc, StoreError | DBAPIError):
                    # A connection opened while the database could not be written (a full
                    # or read-only disk, an immutable WAL) stays read-only for good: the
                    # next cycle opens new ones, so the daemon recovers with the disk.
                    self.engine.dispose()
                return
            finally:
                self._cycle_since = None
        if report is not None and self.metrics is not None:
            self.metrics(report)
        if report is not None:
            self.notifier.status(f"{report.kind} cycle {report.number}: "
                                 f"{report.managed} malleable jobs, {report.rpc} RPCs"
                                 + (" (Slurm unavailable)" if report.slurm_unavailable else ""))

    def _retry_wait(self, seconds: float) -> None:
        """The Slurm port's back-off wait: ends early, with `SlurmUnavailable`, when a
        stop is requested (no more retries)."""
        if self._stopping.wait(seconds):
            raise SlurmUnavailable("the daemon is stopping: no more retries")

    def _stop_if_requested(self) -> None:
        """Run once as the scheduler starts: a stop requested before the scheduler ran
        (a signal between the start-up poll and `BlockingScheduler.start`) ends it."""
        if self._stopping.is_set() and self.scheduler is not None:
            self.scheduler.shutdown(wait=False)

    def _heartbeat(self) -> None:
        """Renew the lease and ping the systemd watchdog, on a thread of its own.

        A cycle that waits on a slow Slurm (retries) must not make a live daemon look
        dead, so the heartbeat does not queue behind the cycles; but a cycle running
        longer than ``lease_timeout_s`` counts as hung: the heartbeat is withheld, so
        another daemon may take over and systemd's watchdog restarts this one.
        """
        if self._stopping.is_set() or self._database_gone():
            return
        since = self._cycle_since
        limit = self.config.daemon.lease_timeout_s
        if since is not None and time.monotonic() - since > limit:
            log.warning("a cycle has run for %.0f s, longer than lease_timeout_s (%g s): "
                        "heartbeat withheld", time.monotonic() - since, limit)
            return
        try:
            heartbeat_lease(self.engine, self.holder)
        except LeaseLost as exc:
            log.error("%s; stopping so that only one daemon acts", exc)
            self.stop()
            return
        except DatabaseUnavailable as exc:
            # (no watchdog ping: a database unusable for longer than systemd's watchdog
            # interval gets the daemon restarted)
            log_failure("heartbeat", exc)
            return
        self.notifier.watchdog()

    def _housekeeping(self) -> None:
        r = apply_retention(self.engine, self.config.retention)
        log.info("retention: %s", r)

    # ------------------------------------------------------------------ life cycle

    def _take_lease(self) -> None:
        """Acquire the lease; a holder that is a dead process of this host is taken over.

        Raises:
            LeaseHeld: another daemon holds it (names the holder).
        """
        timeout = self.config.daemon.lease_timeout_s
        held = read_lease(self.engine)
        dead = None
        if held.holder and held.holder != self.holder and dead_local_holder(held.holder):
            log.warning("the lease holder %s is no process of this host any more (a daemon "
                        "that was killed); taking the lease over", held.holder)
            dead = held.holder
        acquire_lease(self.engine, self.holder, timeout_s=timeout, dead_holder=dead)

    def _cluster(self) -> None:
        """Read and log the cluster and the node list at start (also primes the port's
        version cache, so that no cycle pays for it)."""
        slurm = self.daemon.slurm
        rpc0 = self.daemon.rpc_count()
        try:
            info = slurm.cluster()
        except SlurmError as exc:
            log.warning("Slurm does not answer at start (%s); polling until it does "
                        "(start-up: %d Slurm RPCs)", exc, self.daemon.rpc_count() - rpc0)
            return
        self.daemon.refresh_nodes(utcnow(), force=True)
        log.info("Slurm %s: %d nodes, %d GPUs per node, partitions %s (start-up: %d Slurm "
                 "RPCs)", info.version, info.nodes, info.gpus_per_node,
                 ",".join(info.partitions) or "-", self.daemon.rpc_count() - rpc0)

    def start(self) -> int:
        """Take the lease, run until stopped (or once). Returns the exit code."""
        self._take_lease()
        log.info("lease taken by %s; configured policy %s; %s", self.holder,
                 self.config.policy.name,
                 "DRY RUN: no change to Slurm" if self.dry_run else "acting on Slurm")
        self.daemon.read_operator_settings(start=True)   # a pause in force: said now
        try:
            if self.options.metrics_factory is not None:
                self.metrics = self.options.metrics_factory()
            self._cluster()
            if self.options.once:
                if self.daemon.decide_cycle().slurm_unavailable:
                    log.error("--once: Slurm did not answer the poll; nothing was decided "
                              "(exit 1)")
                    return 1
                return 0
            # A stop (SIGTERM) during the start-up reads ends here: the scheduler, which
            # a stop shuts down, is not running yet.
            if not self._stopping.is_set():
                self.daemon.poll_cycle()
            if self._stopping.is_set():
                return 0
            self.notifier.ready(f"polling every {self.config.daemon.poll_interval_s:.0f} s")
            self._schedule()
            self._run_scheduler()  # blocks until stop()
            return self.exit_code
        finally:
            # A job still running in the worker thread finishes (its Slurm call and the
            # step after it are recorded) before the cleanup.
            with self._busy:
                gone = self.db_file is not None and self.db_file.changed() is not None
                if gone:   # (a new connection would create an empty file in its place)
                    saved = self.db_file.save_gone(utcnow().strftime("%Y%m%dT%H%M%SZ"))
                    log.error("stopped without releasing the jobs the daemon held or its "
                              "lease: the database file is gone; %s", saved)
                elif not self.options.once:
                    rpc0 = self.daemon.rpc_count()
                    try:
                        n = self.daemon.release_holds()
                        log.info("stopping: released %d job(s) the daemon held (%d Slurm RPCs)",
                                 n, self.daemon.rpc_count() - rpc0)
                    except Exception as exc:  # the stop must complete whatever happens
                        log_failure("releasing holds on stop", exc,
                                    then="jobs the daemon held may stay held until it runs again")
                if not gone:
                    if release_lease(self.engine, self.holder):
                        log.info("stopped; lease of %s released", self.holder)
                    else:
                        log.info("stopped; %s no longer held the lease (another daemon took "
                                 "it over): left as it is", self.holder)
                self.engine.dispose()

    def _schedule(self) -> None:
        d = self.config.daemon
        sched = BlockingScheduler(executors={"default": ThreadPoolExecutor(max_workers=1),
                                             "heartbeat": ThreadPoolExecutor(max_workers=1)},
                                  job_defaults={"coalesce": True, "max_instances": 1,
                                                "misfire_grace_time": None},
                                  timezone=UTC)
        sched.add_job(self._run, "interval", seconds=d.poll_interval_s,
                      args=[self.daemon.poll_cycle, "poll"], id="poll")
        sched.add_job(self._run, "interval", seconds=d.ingest_interval_s,
                      args=[self._ingest, "ingest"], id="ingest")
        sched.add_job(self._run, "interval", seconds=d.decide_interval_s,
                      args=[self.daemon.decide_cycle, "decide"], id="decide",
                      next_run_time=utcnow())
        sched.add_job(self._run, "interval", seconds=d.housekeeping_interval_s,
                      args=[self._housekeeping, "housekeeping"], id="housekeeping")
        beat = min(self.config.daemon.lease_timeout_s / 3,
                   self.notifier.watchdog_interval_s or 30.0)
        sched.add_job(self._heartbeat, "interval", seconds=max(beat, 1.0), id="heartbeat",
                      executor="heartbeat")
        sched.add_job(self._stop_if_requested, "date", run_date=utcnow(), id="stop-check",
                      executor="heartbeat")
        self.scheduler = sched

    def _run_scheduler(self) -> None:
        """Run the scheduler until a stop shuts it down.

        A stop (SIGTERM) that lands while the scheduler's loop is between handing a job
        to its executor and updating it in the job store empties that store under the
        loop (APScheduler's in-memory store drops its jobs on shutdown), and the loop
        raises JobLookupError: that is the stop, not a failure (it made the daemon exit
        1 with a traceback on an ordinary stop). Raised when no stop was asked for.
        """
        try:
            self.scheduler.start()
        except JobLookupError:
            if not self._stopping.is_set():
                raise
            log.debug("scheduler loop ended by the stop while it updated its jobs")

    def _ingest(self) -> None:
        self.daemon.ingest(utcnow())

    def stop(self) -> None:
        """Stop after the job in progress (SIGTERM/SIGINT)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.info("stop requested: finishing the job in progress")
        self.notifier.stopping()
        if self.scheduler is not None and self.scheduler.running:
            # wait=False: we are called from a signal handler in the main thread, while
            # the worker thread finishes its current job; shutdown joins it below.
            threading.Thread(target=self.scheduler.shutdown, kwargs={"wait": True},
                             daemon=True).start()

    def reload(self) -> None:
        """SIGHUP: re-read the configuration; keep the old one if the new one is bad.

        Never raises (it runs in the signal handler, inside the scheduler's loop): a file
        `load_config` refuses, a policy that cannot be built, or anything failing while
        the new settings are applied logs "reload refused" and keeps the running ones.
        """
        self.notifier.reloading()
        try:
            new = load_config(self.options.config_path)
            check_policy(new)
        except Exception as exc:  # a reload must never stop the daemon
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.notifier.ready("reload refused")
            return
        if new.database.url != self.config.database.url:
            log.warning("database.url changed in %s; it takes effect at the next restart",
                        new.source)
            new = _with_database(new, self.config)
        if new.daemon.dry_run != self.config.daemon.dry_run:
            log.warning("daemon.dry_run changed in %s; it takes effect at the next restart",
                        new.source)
        old_config = self.config
        old = old_config.daemon
        changed: list[tuple[str, float]] = []  # (job id, old interval) of timers rescheduled
        try:
            if self.scheduler is not None:
                # Rescheduling restarts an interval from now: only timers whose interval
                # changed are touched, so a reload does not delay the next decision.
                for job_id, key in (("poll", "poll_interval_s"),
                                    ("ingest", "ingest_interval_s"),
                                    ("decide", "decide_interval_s"),
                                    ("housekeeping", "housekeeping_interval_s")):
                    seconds = getattr(new.daemon, key)
                    if seconds != getattr(old, key):
                        self.scheduler.reschedule_job(job_id, trigger="interval",
                                                      seconds=seconds)
                        changed.append((job_id, getattr(old, key)))
            self.config = new
            self.daemon.config = new
        except Exception as exc:  # a reload must never stop the daemon
            self.config = old_config
            self.daemon.config = old_config
            for job_id, seconds in changed:
                try:
                    self.scheduler.reschedule_job(job_id, trigger="interval", seconds=seconds)
                except Exception:  # keep going: the old timers are the best we have
                    log.exception("restoring the %s timer to %g s failed", job_id, seconds)
            log.error("reload refused, keeping the running configuration: applying %s "
                      "failed: %s", new.source, exc)
            self.notifier.ready("reload refused")
            return
        log.info("configuration reloaded from %s (policy %s, poll %g s, decide %g s)",
                 new.source, new.policy.name, new.daemon.poll_interval_s,
                 new.daemon.decide_interval_s)
        self.notifier.ready("configuration reloaded")


def _with_database(new: Config, old: Config) -> Config:
    from dataclasses import replace

    return replace(new, database=old.database)


def run_service(config: Config, options: ServiceOptions) -> int:
    """Run the daemon in the foreground until SIGTERM (or once). Returns the exit code.

    Raises:
        malleable.db.errors.StoreError: the database is unusable, its schema too old or
            too new, or the lease is held by another daemon (the CLI turns these into
            one-line errors with exit code 2).
    """
    service = Service(config, options)
    if not options.once:
        signal.signal(signal.SIGTERM, lambda *_: service.stop())
        signal.signal(signal.SIGINT, lambda *_: service.stop())
        signal.signal(signal.SIGHUP, lambda *_: service.reload())
    return service.start()
