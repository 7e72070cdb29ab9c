"""The ``cli`` backend: `SlurmClient` through squeue, sinfo, scontrol, scancel, sbatch.

Every command is an argv list run with a timeout and no shell (`CommandRunner`).
Reads use JSON where the release has it and pin the release's own data_parser
(`versions`); where it has none they read the ``-o`` text forms (`text`):

=================  ======================================  ===========================
method             22.05                                   23.02 / 23.11+
=================  ======================================  ===========================
jobs()             squeue --json (one call, all jobs)      squeue --json[=v0.0.4x]
job(id)            scontrol show job -d -o ID (text)       scontrol --json show job ID
nodes()            sinfo --json                            scontrol --json show nodes
cluster()          nodes() + scontrol show partition -o (text, every release)
=================  ======================================  ===========================

If ``squeue --json`` is refused (a Slurm built without JSON support), the backend
logs why and reads ``scontrol show job -d -o`` instead, still one call for all jobs.

Changes map to scontrol/scancel as DESIGN.md section 6 verified on 22.05:
resize_pending ``NumNodes=n-n TresPerNode=<gres:|gres/>gpu:g`` (a bare ``NumNodes=n`` is
refused on a pending job; the GRES prefix depends on the release, see
`gres.tres_per_node_gpus`), shrink_running ``NumNodes=n``, requeue_hold
``requeuehold``, start_now ``StartTime=now``, signal ``scancel --signal [--batch|--full]``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

from malleable.config import SlurmConfig
from malleable.slurm import parse, text, versions
from malleable.slurm.client import (
    InvalidArgument,
    SlurmParseError,
    SlurmRejected,
    SlurmUnavailable,
)
from malleable.slurm.gres import tres_per_node_gpus
from malleable.slurm.jobid import check_count, check_job_id, check_signal
from malleable.slurm.records import (
    ClusterInfo,
    SignalTarget,
    SlurmJob,
    SlurmNode,
    SubmitRequest,
)
from malleable.slurm.runner import CommandResult, CommandRunner, check_exit

log = logging.getLogger(__name__)

# Seconds after a requeue before the job may start again: slurmd refuses a launch
# whose credential is not newer than the revocation of the old one (whole
# seconds), and the job then FAILS instead of running (seen on the harness when
# StartTime=now and release followed a requeuehold within the same second).
# Slurm's own begin-time delay after a requeue exists for this; start_now clears
# it, so it waits this long after this client's own requeue first.
REQUEUE_SETTLE_S = 2.0

_NO_JSON = ("json", "serializer", "data_parser", "unrecognized option", "invalid option")


def _invalid_job(message: str) -> bool:
    return "invalid job id" in message.lower()


def _signal_args(target: SignalTarget) -> list[str]:
    try:
        target = SignalTarget(target)
    except ValueError:
        raise InvalidArgument(f"invalid signal target {target!r}: expected one of "
                              f"{[t.value for t in SignalTarget]}") from None
    return {SignalTarget.BATCH: ["--batch"], SignalTarget.STEPS: [],
            SignalTarget.FULL: ["--full"]}[target]


def most_common_gpus(nodes: list[SlurmNode]) -> int:
    """GPUs per node of a cluster: the most common count (the larger on a tie), 0 if none."""
    counts: dict[int, int] = {}
    for n in nodes:
        counts[n.gpus] = counts.get(n.gpus, 0) + 1
    return max(counts, key=lambda g: (counts[g], g)) if counts else 0


def sbatch_argv(request: SubmitRequest) -> list[str]:
    """The ``sbatch --parsable ...`` command line of ``request`` (its ``env`` is passed
    separately, as the command's environment).

    Raises:
        ValueError: a node or GPU count that is not a positive (GPUs: non-negative) integer.
    """
    nodes = check_count("nodes", request.nodes)
    gpus = check_count("gpus_per_node", request.gpus_per_node, minimum=0)
    argv = ["sbatch", "--parsable", f"--nodes={nodes}"]
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    argv.append("--requeue" if request.requeue else "--no-requeue")
    if request.hold:
        argv.append("--hold")
    if request.open_mode_append:
        argv.append("--open-mode=append")
    for opt, value in (("--comment", request.comment), ("--job-name", request.name),
                       ("--partition", request.partition), ("--output", request.output),
                       ("--chdir", request.workdir)):
        if value:
            argv.append(f"{opt}={value}")
    argv += list(request.extra_args)
    argv.append(os.path.abspath(request.script))
    return argv


class CliSlurmClient:
    """`SlurmClient` over the Slurm command-line tools.

    Args:
        config: timeout and retries (``command_timeout_s``, ``max_retries``).
        version: the Slurm release ("22.05.8") if known; otherwise read once from
            ``squeue --version`` (client) and ``scontrol show config`` (controller).
        runner: a `CommandRunner` (default: one built from ``config`` and ``env``).
        env: environment for the commands (default: this process's, incl. SLURM_CONF).

    Attributes:
        rpc_count: Slurm commands run so far (each retry counts).
        parse_errors: jobs/nodes skipped by the last `jobs`/`nodes` call because
            their record could not be parsed (`SlurmParseError` each, naming the field).
    """

    def __init__(self, config: SlurmConfig | None = None, *, version: str | None = None,
                 runner: CommandRunner | None = None, env: dict | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        config = config or SlurmConfig()
        self.runner = runner or CommandRunner(timeout_s=config.command_timeout_s,
                                              max_retries=config.max_retries, env=env,
                                              sleep=sleep)
        self._client_version = versions.parse_version(version) if version else None
        self._controller_version = self._client_version
        self._json = True
        self._requeued_at: dict[str, float] = {}
        self.parse_errors: list[SlurmParseError] = []

    @property
    def rpc_count(self) -> int:
        """Slurm commands run so far by this client (each retry counts)."""
        return self.runner.rpc_count

    # ------------------------------------------------------------------ versions

    def client_version(self) -> versions.Version:
        """Release of the Slurm commands (``squeue --version``), read once."""
        if self._client_version is None:
            out = self.runner.run(["squeue", "--version"]).stdout
            self._client_version = versions.parse_version(out)
            if not versions.supported(self._client_version):
                log.warning("Slurm %s is outside 22.05-25.11; parsing its output anyway",
                            versions.version_string(self._client_version))
        return self._client_version

    def controller_version(self) -> versions.Version:
        """Release of slurmctld (``SLURM_VERSION`` of ``scontrol show config``), read once."""
        if self._controller_version is None:
            out = self.runner.run(["scontrol", "show", "config"]).stdout
            conf = text.parse_config_text(out)
            self._controller_version = versions.parse_version(conf.get("SLURM_VERSION", ""))
        return self._controller_version

    # ------------------------------------------------------------------ reads

    def _json_doc(self, source: str, allow_invalid_job: bool = False):
        def interpret(result: CommandResult):
            if result.returncode != 0:
                if allow_invalid_job and _invalid_job(result.message):
                    return None
                check_exit(result)
            doc = parse.load_json(result.stdout, source)
            errors = parse.document_errors(doc)
            if errors and allow_invalid_job and any(_invalid_job(e) for e in errors):
                return None
            if errors:
                raise SlurmUnavailable(f"{source}: {'; '.join(errors)}")
            return doc
        return interpret

    def _no_json(self, exc: SlurmRejected) -> bool:
        if any(w in exc.slurm_message.lower() for w in _NO_JSON):
            log.warning("JSON output refused (%s); reading Slurm's text output instead",
                        exc.slurm_message)
            self._json = False
            return True
        return False

    def jobs(self) -> list[SlurmJob]:
        """Every job the controller knows, from one ``squeue --json`` call (text fallback
        ``scontrol show job -d -o``). Unparseable jobs are skipped into ``parse_errors``."""
        self.client_version()
        problems: list[SlurmParseError] = []
        out = None
        if self._json:
            argv = ["squeue", versions.json_option(self.client_version())]
            try:
                doc = self.runner.call(argv, self._json_doc("squeue --json"))
                out = parse.parse_jobs(doc, errors=problems)
            except SlurmRejected as exc:
                if not self._no_json(exc):
                    raise
        if out is None:
            res = self.runner.run(["scontrol", "--all", "show", "job", "-d", "-o"])
            out = text.parse_jobs_text(res.stdout, errors=problems)
        self._note(problems)
        return out

    def _note(self, problems: list[SlurmParseError]) -> None:
        self.parse_errors = problems
        for p in problems:
            log.warning("skipped a record Slurm reported: %s", p)

    @staticmethod
    def _pick(records: list[SlurmJob], job_id: str) -> SlurmJob | None:
        for j in records:
            if j.job_id == job_id:
                return j
        if job_id.isdigit():
            for j in records:
                if j.job_id_num == int(job_id):
                    return j
        return None

    def job(self, job_id: str) -> SlurmJob | None:
        """One job, or None if the controller does not know it (``Invalid job id``)."""
        job_id = check_job_id(job_id)
        v = self.client_version()
        if self._json and versions.has_scontrol_json(v):
            argv = ["scontrol", versions.json_option(v), "show", "job", job_id]
            try:
                doc = self.runner.call(argv, self._json_doc("scontrol show job --json",
                                                            allow_invalid_job=True))
                return None if doc is None else self._pick(parse.parse_jobs(doc), job_id)
            except SlurmRejected as exc:
                if not self._no_json(exc):
                    raise

        def interpret(result: CommandResult):
            if result.returncode != 0 and _invalid_job(result.message):
                return None
            return text.parse_jobs_text(check_exit(result, job_id).stdout)
        records = self.runner.call(["scontrol", "show", "job", "-d", "-o", job_id], interpret)
        return None if records is None else self._pick(records, job_id)

    def nodes(self) -> list[SlurmNode]:
        """Every node: ``sinfo --json`` (22.05), ``scontrol --json show nodes`` (23.02+),
        text ``scontrol show node -d -o`` without JSON."""
        v = self.client_version()
        problems: list[SlurmParseError] = []
        if self._json:
            if versions.has_scontrol_json(v):
                argv = ["scontrol", versions.json_option(v), "show", "nodes"]
            else:
                argv = ["sinfo", "--json"]
            try:
                doc = self.runner.call(argv, self._json_doc(" ".join(argv)))
                out = parse.parse_nodes(doc, errors=problems)
                self._note(problems)
                return out
            except SlurmRejected as exc:
                if not self._no_json(exc):
                    raise
        res = self.runner.run(["scontrol", "show", "node", "-d", "-o"])
        return text.parse_nodes_text(res.stdout)

    def cluster(self) -> ClusterInfo:
        """Controller version, GPUs per node (most common), partitions and the default one."""
        version = self.controller_version()
        nodes = self.nodes()
        res = self.runner.run(["scontrol", "show", "partition", "-o"])
        parts = text.parse_partitions_text(res.stdout)
        return ClusterInfo(
            version=versions.version_string(version), version_tuple=version,
            gpus_per_node=most_common_gpus(nodes),
            partitions=tuple(name for name, _ in parts),
            default_partition=next((name for name, default in parts if default), ""),
            nodes=len(nodes))

    # ------------------------------------------------------------------ changes

    def submit(self, request: SubmitRequest) -> str:
        """``sbatch --parsable`` with the request's options; returns the new job id.

        Not retried after a timeout (the job may exist already). Raises
        `SlurmRejected` with sbatch's message, `SlurmParseError` for odd output.
        """
        res = self.runner.run(sbatch_argv(request), idempotent=False,
                              extra_env=dict(request.env))
        first = res.stdout.strip().split(";")[0].strip()
        try:
            return check_job_id(first)
        except ValueError:
            raise SlurmParseError(f"sbatch --parsable printed {res.stdout.strip()!r}, "
                                  "not a job id", field="sbatch", value=res.stdout) from None

    def _update(self, job_id: str, *fields: str) -> None:
        self.runner.run(["scontrol", "update", f"JobId={job_id}", *fields], job_id=job_id)

    def resize_pending(self, job_id: str, nodes: int, gpus_per_node: int) -> None:
        """``scontrol update JobId=J NumNodes=n-n TresPerNode=<gres:|gres/>gpu:g``."""
        job_id = check_job_id(job_id)
        nodes = check_count("nodes", nodes)
        gpus = check_count("gpus_per_node", gpus_per_node, minimum=0)
        self._update(job_id, f"NumNodes={nodes}-{nodes}",
                     f"TresPerNode={tres_per_node_gpus(self.controller_version(), gpus)}")

    def shrink_running(self, job_id: str, nodes: int) -> None:
        """``scontrol update JobId=J NumNodes=n`` (22.05 refuses a second shrink of a job)."""
        self._update(check_job_id(job_id), f"NumNodes={check_count('nodes', nodes)}")

    def hold(self, job_id: str) -> None:
        """``scontrol hold J``."""
        job_id = check_job_id(job_id)
        self.runner.run(["scontrol", "hold", job_id], job_id=job_id)

    def release(self, job_id: str) -> None:
        """``scontrol release J``."""
        job_id = check_job_id(job_id)
        self.runner.run(["scontrol", "release", job_id], job_id=job_id)

    def requeue_hold(self, job_id: str) -> None:
        """``scontrol requeuehold J``; a job that is not requeueable is refused by Slurm
        ("Requested operation is presently disabled") as `SlurmRejected`."""
        job_id = check_job_id(job_id)
        self.runner.run(["scontrol", "requeuehold", job_id], idempotent=False, job_id=job_id)
        self._requeued_at[job_id] = time.monotonic()

    def start_now(self, job_id: str) -> None:
        """``scontrol update JobId=J StartTime=now``.

        Within `REQUEUE_SETTLE_S` of this client's own requeue of the job it first
        waits out the rest of that time (at most 2 s), so the relaunch is not refused
        by the revoked credential of the previous run. (``StartTime=now+N`` would
        instead leave the start to Slurm's next periodic scheduling pass, tens of
        seconds later.)
        """
        job_id = check_job_id(job_id)
        since = time.monotonic() - self._requeued_at.pop(job_id, -math.inf)
        if since < REQUEUE_SETTLE_S:
            self.runner.sleep(REQUEUE_SETTLE_S - since)
        self._update(job_id, "StartTime=now")

    def signal(self, job_id: str, signal: str, target: SignalTarget = SignalTarget.BATCH) -> None:
        """``scancel --signal=SIG [--batch|--full] J``: batch shell, steps, or both."""
        job_id = check_job_id(job_id)
        argv = ["scancel", f"--signal={check_signal(signal)}", *_signal_args(target), job_id]
        self.runner.run(argv, idempotent=False, job_id=job_id)

    def cancel(self, job_id: str) -> None:
        """``scancel J``."""
        job_id = check_job_id(job_id)
        self.runner.run(["scancel", job_id], job_id=job_id)
