"""The job side of the contract: log progress, catch the checkpoint signal, save safely.

Standard library only, and no import of any other malleable module: a training
job may copy this one file next to its script (or import it from an installed
malleable) whatever its environment holds. Typical use (docs/job-author-guide.md)::

    rep = Reporter.from_env(batch_size=256)       # ids, sizes and restart count from Slurm
    state = read_checkpoint(ckpt) or fresh_state()
    rep.started(state.step, state.samples)
    while not done:
        train_one_step()
        rep.log(step, samples, metric=loss)
        if rep.checkpoint_requested:              # the spec's signal (default USR1) arrived
            write_checkpoint(ckpt, serialize(state))
            rep.checkpointed(ckpt)
            rep.wait_for_requeue(timeout_s=600)   # the daemon now requeues the job
    rep.finished()

Progress file (docs/progress-format.md): ``<spool>/<job id>.jsonl``, one JSON
object per line, appended with ``O_APPEND`` and one ``write()`` per line::

    {"v": 1, "t": 1714000000.5, "job": "123_4", "event": "progress", "step": 1200,
     "samples": 307200, "gpus": 4, "nodes": 1, "batch": 256, "restart": 0,
     "metric": 0.71, "grad_sqr": 0.5, "grad_var": 2.1}

Plan file (written by the daemon, read here): ``<spool>/<job id>.plan.json``,
one JSON object ``{"v": 1, "job": "123", "t": <unix s>, "gpus": 4, "nodes": 1,
"batch": 512}`` (``batch`` may be null); see `Plan`.

Checkpoints: `write_checkpoint` writes to a temporary name in the same
directory, fsyncs the file, renames it over the target and fsyncs the
directory; the file carries its length and SHA-256, and `read_checkpoint`
returns only a complete, verified payload.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import operator
import os
import re
import signal as _signal
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

FORMAT_VERSION = 1
EVENTS = ("started", "progress", "checkpointed", "finished")
DEFAULT_SPOOL = "/var/spool/malleable/progress"
ENV_SPOOL = "MALLEABLE_SPOOL"
ENV_SIGNAL = "MALLEABLE_SIGNAL"
ENV_BATCH = "MALLEABLE_BATCH_SIZE"
PROGRESS_SUFFIX = ".jsonl"
PLAN_SUFFIX = ".plan.json"
MAX_LINE_BYTES = 4096       # a longer line is rejected by the daemon ("too_long")
MAX_PLAN_BYTES = 4096
MAX_INT = 2**63 - 1
# The largest global or per-GPU batch (samples) a line or a spec may hold: far above any
# training run's, and low enough that the estimators' arithmetic on it (float64, int64
# products with GPU counts) stays exact; batch=2**63-1 came back from them as -2**63.
MAX_BATCH = 2**31 - 1

CKPT_MAGIC = b"MALLEABLE-CKPT 1\n"
_CKPT_HEADER = struct.Struct(">Q32s")   # payload length, SHA-256 of the payload
# Directory -> the other processes' temporary files in it when this process first wrote
# there, not removed yet (`atomic_write`).
_STALE: dict[str, set[str]] = {}


class CheckpointError(OSError):
    """A checkpoint file exists but is not a complete checkpoint written by `write_checkpoint`."""


# --- Slurm's environment --------------------------------------------------------------------

def job_id_from_env(env: Mapping[str, str]) -> str | None:
    """The job's id as the daemon knows it: "J_T" for an array task, else SLURM_JOB_ID.

    Returns None outside a Slurm job.
    """
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


#: The most GPUs per node, nodes and restarts read from the environment: far above any
#: real cluster's, so a larger value is a malformed one (read as unset), not a count.
MOST_GPUS_PER_NODE = 2**16
MOST_NODES = 2**20
MOST_RESTARTS = 2**31 - 1


#: The counts a job line takes from the environment: (variable, least, most). A value
#: outside them is malformed: `Reporter.from_env` reads it as its default and says so,
#: ``malleable report`` refuses it.
ENV_COUNTS = (("SLURM_RESTART_COUNT", 0, MOST_RESTARTS),
              ("SLURM_GPUS_ON_NODE", 0, MOST_GPUS_PER_NODE),
              ("SLURM_JOB_NUM_NODES", 1, MOST_NODES), ("SLURM_NNODES", 1, MOST_NODES))
#: A job id as squeue shows it: 123, or 123_4 for an array task (task ids start at 0,
#: job ids at 1), never with a leading zero (007.jsonl is never read: squeue shows 7).
JOB_ID = re.compile(r"[1-9][0-9]{0,19}(_(0|[1-9][0-9]{0,19}))?")


def env_int(text: str, most: int) -> int | None:
    """The count an environment value spells, or None if it is not a count.

    Args:
        text: the value (blanks around it are ignored).
        most: the largest count accepted.

    Returns:
        The integer, if ``text`` is 1 to 10 ASCII digits and the value is <= ``most``;
        else None (``str.isdigit`` alone takes "²" and other Unicode digits, which
        `int` refuses, and any number of digits).
    """
    text = text.strip()
    if not (0 < len(text) <= 10 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= most else None


def _count_list(text: str) -> int:
    """Devices in a list like "0,1,3" or "0-3,6" (0 for "", unparseable, a reversed range
    or more than `MOST_GPUS_PER_NODE` devices)."""
    total = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        first = env_int(lo, MOST_GPUS_PER_NODE)
        last = env_int(hi, MOST_GPUS_PER_NODE) if dash else first
        if first is None or last is None or last < first:
            return 0
        total += last - first + 1
    return total if total <= MOST_GPUS_PER_NODE else 0


def _gpus_in_tres(text: str) -> int:
    """GPUs in a TRES string like "gres/gpu:2", "gres:gpu:tesla:2,cpu=4" (0 if none)."""
    for item in text.split(","):
        item = item.strip()
        for prefix in ("gres/gpu", "gres:gpu", "gpu"):
            if item.startswith(prefix):
                rest = item[len(prefix):].lstrip(":=")
                count = env_int(rest.rsplit(":", 1)[-1].rsplit("=", 1)[-1], MOST_GPUS_PER_NODE)
                if count is not None:
                    return count
                if rest == "":
                    return 1
    return 0


def gpus_per_node_from_env(env: Mapping[str, str]) -> int:
    """GPUs on this node, from Slurm's variables (0 if none says so).

    Tried in order: SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS (index list),
    SLURM_TRES_PER_NODE, SLURM_GPUS_PER_NODE, GPU_DEVICE_ORDINAL (index list),
    CUDA_VISIBLE_DEVICES (index list). CUDA_VISIBLE_DEVICES comes last and an
    empty value is ignored: with file-backed GRES (the test harness) it is empty.
    A value that is not ASCII digits, or above `MOST_GPUS_PER_NODE`, is passed over.
    """
    value = env_int(env.get("SLURM_GPUS_ON_NODE", ""), MOST_GPUS_PER_NODE)
    if value is not None:
        return value
    n = _count_list(env.get("SLURM_JOB_GPUS", ""))
    if n:
        return n
    for name in ("SLURM_TRES_PER_NODE", "SLURM_GPUS_PER_NODE"):
        n = _gpus_in_tres(env.get(name, ""))
        if n:
            return n
    for name in ("GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES"):
        n = _count_list(env.get(name, ""))
        if n:
            return n
    return 0


def nodes_from_env(env: Mapping[str, str]) -> int:
    """Nodes of the job (SLURM_JOB_NUM_NODES, else SLURM_NNODES, else 1); a value that is
    not an integer from 1 to `MOST_NODES` in ASCII digits is passed over."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env_int(env.get(name, ""), MOST_NODES)
        if value:
            return value
    return 1


def restart_count_from_env(env: Mapping[str, str]) -> int:
    """How often Slurm requeued the job (SLURM_RESTART_COUNT; unset on the first run, or
    not an integer up to `MOST_RESTARTS` in ASCII digits -> 0)."""
    value = env_int(env.get("SLURM_RESTART_COUNT", ""), MOST_RESTARTS)
    return 0 if value is None else value


# --- the plan file ------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What the daemon planned for this job, read from ``<spool>/<job>.plan.json``.

    Attributes:
        job: the job id the plan is for.
        t: when the daemon wrote it, unix seconds.
        gpus, nodes: the size the daemon requeued the job at (total GPUs, nodes).
        batch: the recommended global batch size at that size (None: keep yours).
    """

    job: str
    t: float
    gpus: int
    nodes: int
    batch: int | None


def _is_int(v: object, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= MAX_INT


def _integral(v: object) -> int | None:
    """``v`` as an int if it is integral (int, numpy or torch integer, via ``__index__``).

    Returns:
        The exact int, or None for a bool (Python's, numpy's or a torch bool tensor),
        a float, a string or anything else without ``__index__``.
    """
    if isinstance(v, bool) or str(getattr(v, "dtype", "")) in ("bool", "torch.bool"):
        return None
    try:
        return operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        return None


def parse_plan(data: bytes, job_id: str) -> Plan:
    """Parse a plan file's bytes.

    Raises:
        ValueError: not JSON, another version, another job, or a field of the wrong
            type (the message names it).
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"plan: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise ValueError(f"plan: unknown version {doc.get('v') if isinstance(doc, dict) else doc!r}")
    if doc.get("job") != job_id:
        raise ValueError(f"plan: job={doc.get('job')!r} is not this job ({job_id})")
    for name in ("gpus", "nodes"):
        if not _is_int(doc.get(name), 1):
            raise ValueError(f"plan: {name}={doc.get(name)!r}: expected an integer >= 1")
    batch = doc.get("batch")
    if batch is not None and not _is_int(batch, 1):
        raise ValueError(f"plan: batch={batch!r}: expected an integer >= 1 or null")
    t = doc.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise ValueError(f"plan: t={t!r}: expected a number")
    return Plan(job=job_id, t=float(t), gpus=doc["gpus"], nodes=doc["nodes"], batch=batch)


def format_plan(plan: Plan) -> bytes:
    """The plan file's bytes for ``plan`` (the daemon's side of `parse_plan`)."""
    doc = {"v": FORMAT_VERSION, "job": plan.job, "t": plan.t, "gpus": plan.gpus,
           "nodes": plan.nodes, "batch": plan.batch}
    return (json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n").encode()


# --- atomic files ---------------------------------------------------------------------------

def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes, *, mode: int = 0o644,
                 chunk_size: int = 1 << 20,
                 on_chunk: Callable[[int, int], None] | None = None) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, whole.

    Writes a temporary file in the same directory (created exclusively, not
    following symlinks), fsyncs it, renames it over ``path`` and fsyncs the
    directory. A process killed at any point leaves ``path`` as it was (and at
    worst a stale ``.<name>.<pid>.tmp`` file). A write removes the stale
    temporary files of its own ``path`` that were there when this process first
    wrote into the directory: the directory is listed once per process, not on
    every write (a spool directory holds a file per job, and the daemon writes a
    plan file into it on every requeue). A file that another process leaves
    later is removed by the next process that writes there.

    Args:
        path: the target file.
        data: its new content.
        mode: permission bits of the new file.
        chunk_size: bytes per write() call.
        on_chunk: called as ``on_chunk(written, total)`` after each chunk (progress
            display, or a deliberately slow save in tests).

    Raises:
        OSError: the directory is not writable, the disk is full, ...
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    prefix = f".{name}."
    stale = _STALE.get(directory)
    if stale is None:
        with contextlib.suppress(OSError):
            stale = _STALE[directory] = {e for e in os.listdir(directory)
                                         if e.startswith(".") and e.endswith(".tmp")}
    for entry in [e for e in stale or () if e.startswith(prefix)]:
        stale.discard(entry)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, entry))
    tmp = os.path.join(directory, f"{prefix}{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:written + chunk_size])
            if on_chunk is not None:
                on_chunk(written, len(view))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)


def write_checkpoint(path: str | os.PathLike, payload: bytes, *, chunk_size: int = 1 << 20,
                     on_chunk: Callable[[int, int], None] | None = None) -> None:
    """Save a checkpoint atomically (see `atomic_write`), with its length and SHA-256.

    Args:
        path: the checkpoint file.
        payload: the serialized training state (e.g. ``torch.save`` into a BytesIO).
        chunk_size, on_chunk: as for `atomic_write`.

    Raises:
        OSError: as for `atomic_write`.
    """
    header = CKPT_MAGIC + _CKPT_HEADER.pack(len(payload), hashlib.sha256(payload).digest())
    atomic_write(path, header + payload, mode=0o600, chunk_size=chunk_size, on_chunk=on_chunk)


def read_checkpoint(path: str | os.PathLike) -> bytes | None:
    """Load a checkpoint written by `write_checkpoint`; only a complete one is ever returned.

    Returns:
        The payload, or None when ``path`` does not exist (a fresh start).

    Raises:
        CheckpointError: the file is not a checkpoint, is truncated, or its SHA-256
            does not match (never a half-written file: `write_checkpoint` renames
            into place only after fsync, so this means outside damage).
        OSError: the file exists but cannot be read.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    head = len(CKPT_MAGIC) + _CKPT_HEADER.size
    if not data.startswith(CKPT_MAGIC) or len(data) < head:
        raise CheckpointError(errno.EINVAL, "not a malleable checkpoint", os.fspath(path))
    length, digest = _CKPT_HEADER.unpack_from(data, len(CKPT_MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise CheckpointError(errno.EINVAL, f"truncated checkpoint ({len(payload)} of {length} "
                              f"bytes)", os.fspath(path))
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(errno.EINVAL, "checkpoint checksum mismatch", os.fspath(path))
    return payload


# --- the reporter -----------------------------------------------------------------------------

def _signal_number(name: str) -> int:
    name = name.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(getattr(_signal.Signals, name))
    except AttributeError:
        raise ValueError(f"signal={name!r}: unknown signal") from None


class Reporter:
    """Appends a job's progress lines and watches for the checkpoint signal.

    Never lets reporting stop training: an unwritable spool or a progress file
    owned by someone else produces one warning on stderr and the line is
    dropped (counted in ``dropped``). Wrong arguments (a negative step, an
    unknown batch size) raise ValueError/TypeError, since they are bugs.

    Attributes:
        job_id: the job id the daemon knows ("123", or "123_4" for an array task).
        spool_dir: the directory of progress and plan files.
        path: this job's progress file, ``<spool_dir>/<job_id>.jsonl``.
        plan_path: this job's plan file, ``<spool_dir>/<job_id>.plan.json``.
        restart_count: Slurm's restart count (0 on the first run).
        gpus: GPUs the job runs on now, in total over its nodes.
        nodes: nodes the job runs on now.
        batch_size: the global batch size last given (None until known).
        signal_name: the checkpoint signal, e.g. "USR1"; signum: its number.
        step, samples: the last values written (0 before the first line).
        dropped: lines not written because of an I/O problem.
    """

    def __init__(self, job_id: str, spool_dir: str | os.PathLike, *, restart_count: int = 0,
                 gpus: int = 0, nodes: int = 1, batch_size: int | None = None,
                 signal: str = "USR1", install_handler: bool = True,
                 clock: Callable[[], float] = time.time):
        """Create a reporter; see `from_env` for the usual way.

        Raises:
            ValueError: an empty job id, a job id with "/" in it, a negative count,
                or an unknown signal name.
        """
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"job_id={job_id!r}: expected a Slurm job id such as 123 or 123_4")
        for name, v, lo in (("restart_count", restart_count, 0), ("gpus", gpus, 0),
                            ("nodes", nodes, 1)):
            if not _is_int(v, lo):
                raise ValueError(f"{name}={v!r}: expected an integer >= {lo}")
        self.job_id = job_id
        self.spool_dir = os.fspath(spool_dir)
        self.path = os.path.join(self.spool_dir, job_id + PROGRESS_SUFFIX)
        self.plan_path = os.path.join(self.spool_dir, job_id + PLAN_SUFFIX)
        self.restart_count = restart_count
        self.gpus = gpus
        self.nodes = nodes
        self.batch_size = self._check_batch(batch_size) if batch_size is not None else None
        self.signal_name = signal.upper().removeprefix("SIG")
        self.step = 0
        self.samples = 0
        self.dropped = 0
        self._line_ended = False   # the file is known to end in a newline (`append_line`)
        self._clock = clock
        self._requested = threading.Event()
        self._warned: set[str] = set()
        self._plan: Plan | None = None
        self._plan_read = False
        self.signum = _signal_number(self.signal_name)
        self._previous_handler: object = None
        self._handler_installed = False
        if install_handler:
            self.install_signal_handler()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 spool_dir: str | os.PathLike | None = None, signal: str | None = None,
                 batch_size: int | None = None, install_handler: bool = True,
                 clock: Callable[[], float] = time.time) -> Reporter:
        """A reporter for the current Slurm job.

        Reads SLURM_JOB_ID (or SLURM_ARRAY_JOB_ID + SLURM_ARRAY_TASK_ID -> "J_T"),
        SLURM_RESTART_COUNT, SLURM_JOB_NUM_NODES and the GPUs per node (see
        `gpus_per_node_from_env`); the spool directory from ``spool_dir``, else
        MALLEABLE_SPOOL, else /var/spool/malleable/progress; the signal from
        ``signal``, else MALLEABLE_SIGNAL, else USR1; the batch size from
        ``batch_size``, else MALLEABLE_BATCH_SIZE (unset or blank: none). A malformed
        count (restarts, GPUs, nodes) is read as its default, and said once on stderr.

        Raises:
            ValueError: not inside a Slurm job (no SLURM_JOB_ID); a job id that is not
                one Slurm gives (123 or 123_4); MALLEABLE_BATCH_SIZE
                set to anything but an integer from 1 to `MAX_BATCH` (the message
                names the variable and its value); or a bad value given here.
        """
        env = os.environ if env is None else env
        job_id = job_id_from_env(env)
        if job_id is None:
            raise ValueError("SLURM_JOB_ID is not set: not running inside a Slurm job "
                             "(construct Reporter(job_id, spool_dir) directly)")
        if not JOB_ID.fullmatch(job_id):
            # (the id names the progress file: '1\n2' or '5_²' wrote files the daemon never
            # reads; `malleable report` refused them already)
            shown = repr(job_id) if len(job_id) <= 60 else repr(job_id[:40]) + "..."
            raise ValueError(f"job id {shown} (from SLURM_JOB_ID or SLURM_ARRAY_JOB_ID and "
                             f"SLURM_ARRAY_TASK_ID): expected a Slurm job id such as 123 or "
                             f"123_4 (it names the progress file <spool>/<id>.jsonl)")
        nodes = nodes_from_env(env)
        raw = env.get(ENV_BATCH, "").strip()
        if batch_size is None and raw:
            # (it was read as unset when malformed: the job then logged no batch, and
            # the daemon priced it at the spec's batch without a word)
            batch_size = env_int(raw, MAX_BATCH)
            if not batch_size:
                raise ValueError(f"{ENV_BATCH}={raw!r}: expected an integer from 1 to "
                                 f"{MAX_BATCH} (the global batch, samples per step)")
        spool = spool_dir or env.get(ENV_SPOOL) or DEFAULT_SPOOL
        rep = cls(job_id, spool, restart_count=restart_count_from_env(env),
                  gpus=gpus_per_node_from_env(env) * nodes, nodes=nodes,
                  batch_size=batch_size, signal=signal or env.get(ENV_SIGNAL) or "USR1",
                  install_handler=install_handler, clock=clock)
        # Malformed counts are read as their defaults (training must not stop over a
        # report), but said once: a restart count of 0 after a requeue gets the job's
        # lines refused as stale, and 0 GPUs prices it wrongly (`malleable report`
        # refuses them).
        used = {"SLURM_RESTART_COUNT": f"restart {rep.restart_count}",
                "SLURM_GPUS_ON_NODE": f"{rep.gpus} GPUs in all"}
        for name, least, most in ENV_COUNTS:
            raw_count = env.get(name, "").strip()
            value = env_int(raw_count, most)
            if raw_count and (value is None or value < least):
                shown = raw_count if len(raw_count) <= 40 else \
                    f"{raw_count[:20]}... ({len(raw_count)} characters)"
                rep._warn(f"env-{name}", f"{name}={shown!r} is not a count from {least} to "
                          f"{most}: ignored (using {used.get(name, f'{nodes} node(s)')})")
        if not os.path.isabs(os.fspath(spool)):   # (`malleable report` refuses one)
            rep._warn("relative-spool", f"spool {os.fspath(spool)!r} is a relative path: lines "
                      f"go to {os.path.abspath(rep.path)}, which the daemon reads only if "
                      f"that is its spool (give the absolute path of the site's spool_dir)")
        return rep

    # -- the checkpoint signal --

    def install_signal_handler(self) -> bool:
        """Catch the checkpoint signal (sets `checkpoint_requested`); chains a previous
        Python handler. Returns False (with a warning) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            self._warn("thread", "the checkpoint signal handler can only be installed from "
                       "the main thread; call request_checkpoint() yourself")
            return False
        self._previous_handler = _signal.signal(self.signum, self._on_signal)
        self._handler_installed = True
        return True

    def _on_signal(self, signum: int, frame: object) -> None:
        self._requested.set()
        prev = self._previous_handler
        if callable(prev):
            prev(signum, frame)

    @property
    def checkpoint_requested(self) -> bool:
        """True once the checkpoint signal arrived (until `clear_checkpoint_request`)."""
        return self._requested.is_set()

    def request_checkpoint(self) -> None:
        """Set `checkpoint_requested` (e.g. when another rank received the signal)."""
        self._requested.set()

    def clear_checkpoint_request(self) -> None:
        """Reset `checkpoint_requested` (e.g. the requeue did not come and training goes on)."""
        self._requested.clear()

    def wait_for_requeue(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` seconds after a checkpoint, for the daemon to requeue the
        job (the requeue ends this process). If it returns, no requeue came: the
        checkpoint request is cleared so training can go on."""
        time.sleep(max(0.0, timeout_s))
        self.clear_checkpoint_request()

    # -- the plan --

    @property
    def plan(self) -> Plan | None:
        """The daemon's plan for this job, read once (None if absent or unusable).

        A plan file owned by a user other than root, this user or the spool
        directory's owner is ignored (with a warning).
        """
        if not self._plan_read:
            self._plan_read = True
            self._plan = self._read_plan()
        return self._plan

    def _read_plan(self) -> Plan | None:
        try:
            fd = os.open(self.plan_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn("plan", f"cannot open {self.plan_path}: {exc.strerror}")
            return None
        try:
            st = os.fstat(fd)
            trusted = {0, os.geteuid()}
            with contextlib.suppress(OSError):
                trusted.add(os.stat(self.spool_dir).st_uid)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in trusted:
                self._warn("plan", f"ignoring {self.plan_path}: not a regular file written "
                           f"by the daemon (uid {st.st_uid})")
                return None
            data = os.read(fd, MAX_PLAN_BYTES + 1)
        finally:
            os.close(fd)
        try:
            if len(data) > MAX_PLAN_BYTES:
                raise ValueError(f"plan: larger than {MAX_PLAN_BYTES} bytes")
            return parse_plan(data, self.job_id)
        except ValueError as exc:
            self._warn("plan", f"ignoring {self.plan_path}: {exc}")
            return None

    @property
    def recommended_batch_size(self) -> int | None:
        """The global batch size the daemon's plan recommends at this restart.

        None when there is no plan, it recommends none, or it was made for
        another GPU count than the job runs on now (then the recommendation
        does not apply; keep your batch size).
        """
        plan = self.plan
        if plan is None or plan.batch is None or (self.gpus and plan.gpus != self.gpus):
            return None
        return plan.batch

    # -- lines --

    def started(self, step: int = 0, samples: int = 0, *, batch_size: int | None = None) -> None:
        """Write the ``started`` event: the job (re)started at this step (from its checkpoint)."""
        self._write("started", step, samples, batch_size=batch_size)

    def log(self, step: int, samples: int, *, metric: float | None = None,
            batch_size: int | None = None, grad_sqr: float | None = None,
            grad_var: float | None = None) -> None:
        """Write a ``progress`` line.

        Args:
            step: cumulative training iterations (>= 0), across restarts.
            samples: cumulative training samples processed (>= 0), across restarts.
                Both may be any integral number: an int, or a numpy or torch integer
                (anything with ``__index__``); the line holds the plain int.
            metric: the current training or validation metric (e.g. loss, accuracy).
            batch_size: the global batch size now (remembered for later lines; integral,
                as step).
            grad_sqr, grad_var: gradient statistics, if computed: an estimate of the
                squared norm of the true gradient, and the trace of the gradient
                estimate's covariance normalised to the initial batch m0 (AdaptDL's
                convention: noise scale phi = m0 * grad_var / grad_sqr).
                Non-finite floats are left out of the line, with one warning.

        Raises:
            TypeError: a step/samples that is not integral (a float, even 10.0, a
                bool, a string).
            ValueError: a negative step/samples or one above 2**63 - 1, or no batch
                size known yet.
        """
        self._write("progress", step, samples, batch_size=batch_size, metric=metric,
                    grad_sqr=grad_sqr, grad_var=grad_var)

    def checkpointed(self, path: str | os.PathLike, *, step: int | None = None,
                     samples: int | None = None) -> None:
        """Write the ``checkpointed`` event for a checkpoint just saved at ``path``
        (made absolute; step and samples default to the last ones written)."""
        self._write("checkpointed", self.step if step is None else step,
                    self.samples if samples is None else samples,
                    path=os.path.abspath(os.fspath(path)))

    def finished(self, *, step: int | None = None, samples: int | None = None) -> None:
        """Write the ``finished`` event: the job reached its target and ends now.

        From here on the checkpoint signal is ignored (if this reporter caught it): a
        request that arrives while the process exits would otherwise kill it once
        Python has restored the signal's default action, and a job that completed
        would end FAILED with status 128 + signal.
        """
        self._write("finished", self.step if step is None else step,
                    self.samples if samples is None else samples)
        if self._handler_installed and threading.current_thread() is threading.main_thread():
            _signal.signal(self.signum, _signal.SIG_IGN)

    @staticmethod
    def _check_batch(batch_size: object) -> int:
        value = _integral(batch_size)
        if value is None or not 1 <= value <= MAX_BATCH:
            raise ValueError(f"batch_size={batch_size!r}: expected an integer in [1, "
                             f"{MAX_BATCH}] (2**31 - 1: the daemon rejects a larger batch)")
        return value

    @staticmethod
    def _check_count(name: str, v: object) -> int:
        """``v`` (a step or samples count) as an int in [0, 2**63 - 1].

        Any integral object is accepted (int, numpy or torch integer: ``__index__``).

        Raises:
            TypeError: a bool, float, string or other non-integral object.
            ValueError: negative, or above 2**63 - 1.
        """
        value = _integral(v)
        if value is None:
            raise TypeError(f"{name}={v!r}: expected an int")
        if value < 0:
            raise ValueError(f"{name}={v!r}: expected an integer >= 0")
        if value > MAX_INT:
            raise ValueError(f"{name}={v!r}: too large; expected an integer <= {MAX_INT} "
                             "(2**63 - 1)")
        return value

    def format_line(self, event: str, step: int, samples: int, *, metric: float | None = None,
                    grad_sqr: float | None = None, grad_var: float | None = None,
                    path: str | None = None) -> bytes:
        """The line this reporter writes for these values, stamped with its clock now.

        Nothing is checked here (`started`, `log`, `checkpointed` and `finished`
        check their arguments first; ``malleable report`` hands the line to the
        daemon's validator instead), so the result may be a line the daemon
        rejects: too long, a step above 2**63 - 1, no batch size (``null``), ...

        Args:
            event: one of `EVENTS`.
            step, samples: the counts, as ints.
            metric, grad_sqr, grad_var: finite floats, or None to leave the key out.
            path: the checkpoint path (``checkpointed``), or None.

        Returns:
            The UTF-8 JSON object and its newline, keys in the documented order.

        Raises:
            ValueError: a non-finite float. TypeError: a value JSON cannot hold.
        """
        record: dict[str, object] = {
            "v": FORMAT_VERSION, "t": float(self._clock()), "job": self.job_id,
            "event": event, "step": step, "samples": samples, "gpus": self.gpus,
            "nodes": self.nodes, "batch": self.batch_size, "restart": self.restart_count}
        for name, v in (("metric", metric), ("grad_sqr", grad_sqr), ("grad_var", grad_var)):
            if v is not None:
                record[name] = v
        if path is not None:
            record["path"] = path
        return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()

    def _write(self, event: str, step: object, samples: object, *,
               batch_size: int | None = None, metric: float | None = None,
               grad_sqr: float | None = None, grad_var: float | None = None,
               path: str | None = None) -> None:
        step = self._check_count("step", step)
        samples = self._check_count("samples", samples)
        if batch_size is not None:
            self.batch_size = self._check_batch(batch_size)
        if self.batch_size is None:
            raise ValueError("batch_size: unknown; pass batch_size= to Reporter.from_env, "
                             "started() or log(), or set MALLEABLE_BATCH_SIZE")
        stats: dict[str, float] = {}
        for name, v in (("metric", metric), ("grad_sqr", grad_sqr), ("grad_var", grad_var)):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                try:
                    v = float(v)  # numpy and torch scalars
                except (TypeError, ValueError):
                    raise TypeError(f"{name}={v!r}: expected a number") from None
            if not math.isfinite(v):
                self._warn(f"nan-{name}", f"{name}={v}: not finite, left out of the line")
                continue
            stats[name] = float(v)
        if event != "started" and (step < self.step or samples < self.samples):
            self._warn("decreasing", f"step={step}, samples={samples} after step={self.step}, "
                       f"samples={self.samples}: the daemon rejects a line whose step or "
                       f"samples go back within a run (log cumulative counts; after "
                       f"reloading a checkpoint, call started() first)")
        line = self.format_line(event, step, samples, path=path, **stats)
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"progress line of {len(line)} bytes exceeds {MAX_LINE_BYTES} "
                             f"(is the checkpoint path that long?)")
        if self.append_line(line):
            self.step, self.samples = step, samples

    def append_line(self, line: bytes) -> bool:
        """Append one line (bytes ending in a newline, as `format_line` makes) to the
        progress file, as it is. On this reporter's first write, and after a short
        write, a file that does not end in a newline (a line torn by a writer killed
        mid-write, e.g. before a requeue) is ended first, so the torn fragment is
        rejected alone and this line is read whole. (A writer appending at the same
        moment can make that a blank line, which readers skip.)

        Returns:
            True if written. False if not (the file cannot be opened or written, or
            is not a regular file of this user's): counted in `dropped`, and warned
            once per kind on stderr. Never raises.
        """
        # O_RDWR: the last byte is read (pread) to see whether the file ends a line.
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self.path, flags, 0o644)
            except FileNotFoundError:
                os.makedirs(self.spool_dir, exist_ok=True)
                fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            self.dropped += 1
            self._warn("open", f"cannot write progress to {self.path}: {exc.strerror}; "
                       f"progress is not reported")
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                self.dropped += 1
                self._warn("owner", f"{self.path} is not a regular file owned by uid "
                           f"{os.geteuid()} (owner {st.st_uid}); progress is not reported")
                return False
            if (not self._line_ended and st.st_size > 0
                    and os.pread(fd, 1, st.st_size - 1) != b"\n"):
                line = b"\n" + line
            n = os.write(fd, line)
            self._line_ended = n == len(line)
            if n != len(line):
                self.dropped += 1
                self._warn("short", f"short write to {self.path} ({n} of {len(line)} bytes)")
                return False
            return True
        except OSError as exc:
            self.dropped += 1
            self._warn("write", f"cannot write progress to {self.path}: {exc.strerror}")
            return False
        finally:
            os.close(fd)

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            print(f"malleable reporter: {message}", file=sys.stderr, flush=True)
