"""The Prometheus exporter (off by default; ``[metrics] address = "host:port"``).

`exporter_from_config` starts an HTTP server on the configured address (a
daemon thread of the daemon process) that serves ``/metrics`` from the
exporter's own `CollectorRegistry` (not prometheus-client's global default,
so nothing else in the process leaks into it), and returns the `Exporter`:
the service calls it with every `CycleReport` (on its one worker thread,
after the cycle). It updates the cycle metrics from the report and then reads
the state store (read-only, a few aggregate queries) for the metrics of the
cluster's state, so a scrape never touches the database and always sees the
state as of the latest cycle.

Metrics (all prefixed ``malleable_``):

=====================================  =========  ===============================================
name                                   type       meaning
=====================================  =========  ===============================================
up                                     gauge      1 while the daemon runs
build_info{version}                    gauge      1; the malleable version
cycle_duration_seconds{kind}           histogram  wall time of poll and decide cycles
cycles_total{kind,outcome}             counter    cycles by outcome: ok, slurm_unavailable
last_cycle_timestamp_seconds{kind}     gauge      end of the latest cycle, unix seconds
slurm_rpcs_per_cycle{kind}             histogram  Slurm commands one cycle issued
slurm_rpcs_total                       counter    Slurm commands issued, all cycles
jobs{state}                            gauge      malleable jobs in the store by Slurm state
managed_jobs                           gauge      malleable jobs the latest decision allocated
gpus_held                              gauge      GPUs held by running malleable jobs
gpus_target                            gauge      GPUs the latest decision targets in total
policy_objective{policy}               gauge      the latest decision's objective value
policy_duration_seconds{policy}        gauge      how long the latest policy run took
actions_total{kind,outcome}            counter    actions that finished: done, abandoned, failed
actions_in_flight{kind}                gauge      actions not finished yet
actions_planned_total{kind,mode}       counter    actions the reconciler proposed; mode: acting,
                                                  dry_run, paused (only acting ones are started)
progress_lines_accepted_total          counter    progress lines stored as samples or events
progress_lines_rejected_total{reason}  counter    progress lines rejected, by reason
paused, dry_run                        gauge      1 when paused by an operator / in dry-run mode
exporter_errors_total                  counter    store reads that failed while updating metrics
=====================================  =========  ===============================================

Counters count what happened while this daemon process ran: progress lines
and actions that finished before it started are not counted.
"""

from __future__ import annotations

import errno
import logging
import threading
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from malleable import __version__
from malleable.config import Config, parse_metrics_address
from malleable.daemon.actions import Step
from malleable.daemon.cycle import CycleReport
from malleable.daemon.reconcile import ActionKind
from malleable.db.engine import engine_from_config, session_factory
from malleable.db.errors import StoreError
from malleable.db.models import Action, Decision, Job, ProgressFile
from malleable.progress.lines import Reason
from malleable.slurm.records import JobState

log = logging.getLogger(__name__)

CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RPC_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55)
_TERMINAL = (Step.DONE.value, Step.ABANDONED.value, Step.FAILED.value)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host means every interface) to (host, port):
    the configuration's own check (`malleable.config.parse_metrics_address`), so that
    ``config show`` and the exporter accept the same addresses.

    Raises:
        ValueError: (a `ConfigError`) not host:port, or a port outside 1..65535 (names the
            key and value).
    """
    return parse_metrics_address(address)


class MetricsAddressError(OSError):
    """``[metrics] address`` cannot be listened on (the port is in use, a privileged port,
    an address of no interface of this host). ``errno`` is the bind's; ``str()`` is the
    message alone, without "[Errno N]"."""

    def __str__(self) -> str:
        return str(self.strerror)


def _bind_problem(exc: OSError, port: int) -> str:
    """Why binding ``port`` failed, in words an operator can act on."""
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} is already in use by another process (stop it, or set "
                f"another port in [metrics] address)")
    if exc.errno == errno.EACCES:
        return f"permission denied for port {port} (ports below 1024 need root)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"no interface of this host has that address (port {port})"
    return f"{exc.strerror or exc} (port {port})"


class Exporter:
    """Prometheus metrics of one daemon process, updated after every cycle.

    Args:
        config: settings (``[database]`` for the store reads).
        registry: the registry to fill (default: a new one, not the global default).

    Call it with each `CycleReport`; it never raises (a failed store read is
    logged and counted in ``malleable_exporter_errors_total``).
    """

    def __init__(self, config: Config, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.server = None
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        r = self.registry
        self.up = Gauge("malleable_up", "1 while the malleable daemon runs", registry=r)
        self.build = Gauge("malleable_build_info", "the malleable version (value 1)",
                           ["version"], registry=r)
        self.cycle_seconds = Histogram("malleable_cycle_duration_seconds",
                                       "wall time of one daemon cycle", ["kind"],
                                       buckets=CYCLE_BUCKETS, registry=r)
        self.cycles = Counter("malleable_cycles", "daemon cycles by outcome",
                              ["kind", "outcome"], registry=r)
        self.last_cycle = Gauge("malleable_last_cycle_timestamp_seconds",
                                "end of the latest cycle, unix seconds", ["kind"], registry=r)
        self.rpc_hist = Histogram("malleable_slurm_rpcs_per_cycle",
                                  "Slurm commands issued by one cycle", ["kind"],
                                  buckets=RPC_BUCKETS, registry=r)
        self.rpcs = Counter("malleable_slurm_rpcs", "Slurm commands issued by the daemon",
                            registry=r)
        self.jobs = Gauge("malleable_jobs", "malleable jobs in the state store by Slurm state",
                          ["state"], registry=r)
        self.managed = Gauge("malleable_managed_jobs",
                             "malleable jobs the latest decision allocated", registry=r)
        self.gpus_held = Gauge("malleable_gpus_held", "GPUs held by running malleable jobs",
                               registry=r)
        self.gpus_target = Gauge("malleable_gpus_target",
                                 "GPUs the latest decision targets for malleable jobs",
                                 registry=r)
        self.objective = Gauge("malleable_policy_objective",
                               "objective value of the latest decision", ["policy"], registry=r)
        self.policy_seconds = Gauge("malleable_policy_duration_seconds",
                                    "run time of the latest policy decision", ["policy"],
                                    registry=r)
        self.actions = Counter("malleable_actions", "actions that finished, by kind and outcome",
                               ["kind", "outcome"], registry=r)
        self.in_flight = Gauge("malleable_actions_in_flight", "actions not finished yet",
                               ["kind"], registry=r)
        self.planned = Counter("malleable_actions_planned",
                               "actions the reconciler proposed, by kind and mode",
                               ["kind", "mode"], registry=r)
        self.accepted = Counter("malleable_progress_lines_accepted",
                                "progress lines stored as samples or events", registry=r)
        self.rejected = Counter("malleable_progress_lines_rejected",
                                "progress lines rejected by ingestion, by reason", ["reason"],
                                registry=r)
        self.paused = Gauge("malleable_paused", "1 when paused by an operator", registry=r)
        self.dry_run = Gauge("malleable_dry_run", "1 in dry-run mode", registry=r)
        self.errors = Counter("malleable_exporter_errors",
                              "state store reads that failed while updating metrics", registry=r)
        self.build.labels(version=__version__).set(1)
        for s in JobState:
            self.jobs.labels(state=s.value)
        for k in ActionKind:
            self.in_flight.labels(kind=k.value)
            for o in _TERMINAL:
                self.actions.labels(kind=k.value, outcome=o)
        for reason in Reason:
            self.rejected.labels(reason=reason.value)
        for kind in ("poll", "decide"):
            for outcome in ("ok", "slurm_unavailable"):
                self.cycles.labels(kind=kind, outcome=outcome)
        # Baselines: only what happens from now on is counted.
        self._action_mark: tuple[datetime, int] = (datetime.now(UTC), 0)
        self._files: dict[int, tuple[int, dict]] | None = None
        self._baseline()

    # ------------------------------------------------------------------ serving

    def serve(self, address: str) -> tuple[str, int]:
        """Serve ``/metrics`` on ``address`` (host:port) from a daemon thread.

        Returns:
            The (host, port) listened on.

        Raises:
            ValueError: a malformed address.
            MetricsAddressError: (an OSError) the address cannot be bound; the message
                names ``metrics.address``, its value and the port, e.g. "metrics.address =
                '127.0.0.1:9464': cannot listen: port 9464 is already in use by another
                process (...)".
        """
        host, port = parse_address(address)
        try:
            self.server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsAddressError(exc.errno, f"metrics.address = {address!r}: cannot "
                                                 f"listen: {_bind_problem(exc, port)}") from None
        self.up.set(1)
        log.info("Prometheus metrics on http://%s:%d/metrics", host, port)
        return host, port

    def close(self) -> None:
        """Stop serving and close the store connection."""
        self.up.set(0)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # ------------------------------------------------------------------ updates

    def __call__(self, report: CycleReport) -> None:
        """Record one cycle's report and refresh the state metrics from the store."""
        with self._lock:
            kind = report.kind
            self.cycle_seconds.labels(kind=kind).observe(max(report.duration_s, 0.0))
            self.cycles.labels(kind=kind, outcome="slurm_unavailable"
                               if report.slurm_unavailable else "ok").inc()
            self.last_cycle.labels(kind=kind).set(
                report.started.timestamp() + max(report.duration_s, 0.0))
            self.rpc_hist.labels(kind=kind).observe(report.rpc)
            self.rpcs.inc(report.rpc)
            self.paused.set(1 if report.paused else 0)
            self.dry_run.set(1 if report.dry_run else 0)
            mode = "dry_run" if report.dry_run else "paused" if report.paused else "acting"
            for p in report.planned:
                self.planned.labels(kind=p.kind.value, mode=mode).inc()
            if kind == "decide" and report.decision_id is not None:
                self.managed.set(report.managed)
            try:
                self._from_store(report)
            except (SQLAlchemyError, StoreError) as exc:
                self.errors.inc()
                log.warning("metrics: reading the state store failed: %s", exc)

    def _sessions(self):
        if self._engine is None:
            self._engine = engine_from_config(self.config, create=False)
        return session_factory(self._engine, readonly=True)

    def _baseline(self) -> None:
        """Remember what the store already holds, so that counters start at zero."""
        try:
            with self._sessions()() as s:
                self._files = self._read_files(s)
                last = s.execute(select(func.max(Action.finished_at))).scalar()
                if last is not None:
                    top = s.execute(select(func.max(Action.id))
                                    .where(Action.finished_at == last)).scalar() or 0
                    self._action_mark = (last, int(top))
        except (SQLAlchemyError, StoreError) as exc:
            # A new installation: the daemon creates the database after this; nothing to skip.
            log.debug("metrics baseline: no state store yet (%s)", exc)
            self._files = {}
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

    @staticmethod
    def _read_files(s) -> dict[int, tuple[int, dict]]:
        return {jid: (int(acc or 0), dict(rej or {})) for jid, acc, rej in s.execute(
            select(ProgressFile.job_id, ProgressFile.lines_accepted, ProgressFile.rejected))}

    def _from_store(self, report: CycleReport) -> None:
        with self._sessions()() as s:
            counts = dict(s.execute(select(Job.state, func.count()).where(Job.malleable.is_(True))
                                    .group_by(Job.state)).all())
            for st in JobState:
                self.jobs.labels(state=st.value).set(counts.get(st.value, 0))
            held = s.scalar(select(func.coalesce(func.sum(Job.gpus), 0)).where(
                Job.malleable.is_(True), Job.state == JobState.RUNNING.value))
            self.gpus_held.set(int(held or 0))
            if report.decision_id is not None:
                d = s.get(Decision, report.decision_id)
                if d is not None:
                    self.gpus_target.set(sum(t.gpus for t in d.targets))
                    self.objective.clear()
                    self.policy_seconds.clear()
                    if d.objective is not None:
                        self.objective.labels(policy=d.policy).set(d.objective)
                    self.policy_seconds.labels(policy=d.policy).set(d.duration_s)
            flying = dict(s.execute(select(Action.kind, func.count())
                                    .where(Action.finished_at.is_(None))
                                    .group_by(Action.kind)).all())
            for k in {*(a.value for a in ActionKind), *flying}:
                self.in_flight.labels(kind=k).set(flying.get(k, 0))
            t0, id0 = self._action_mark
            done = s.execute(select(Action.id, Action.kind, Action.state, Action.finished_at)
                             .where(or_(Action.finished_at > t0,
                                        and_(Action.finished_at == t0, Action.id > id0)))
                             .order_by(Action.finished_at, Action.id)).all()
            for a in done:
                self.actions.labels(kind=a.kind, outcome=a.state).inc()
            if done:
                self._action_mark = (done[-1].finished_at, done[-1].id)
            files = self._read_files(s)
        old = self._files or {}
        for jid, (acc, rej) in files.items():
            acc0, rej0 = old.get(jid, (0, {}))
            if acc > acc0:
                self.accepted.inc(acc - acc0)
            for reason, n in rej.items():
                delta = int(n) - int(rej0.get(reason, 0))
                if delta > 0:
                    self.rejected.labels(reason=reason).inc(delta)
        self._files = files


def exporter_from_config(config: Config) -> Exporter | None:
    """The metrics sink for cycle reports, serving ``/metrics``; None when
    ``metrics.address`` is empty (the default: no exporter, no listening socket).

    Raises:
        ValueError: a malformed ``metrics.address``.
        MetricsAddressError: (an OSError) the address cannot be bound (e.g. the port is in
            use); the message names the key, its value and the port.
    """
    if not config.metrics.address:
        return None
    exporter = Exporter(config)
    try:
        exporter.serve(config.metrics.address)
    except (OSError, ValueError):
        exporter.close()
        raise
    return exporter
