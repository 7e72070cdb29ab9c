"""The spool directory on the daemon side: safe, bounded reads of untrusted progress files.

Every file here is written by a user's job, so every read is defensive:

* the file name comes from the job id (checked: no "/", no leading "."), opened
  relative to the spool directory's descriptor with ``O_NOFOLLOW`` (a symlink
  is refused, never followed) and ``O_NONBLOCK`` (a FIFO cannot block the
  daemon), then checked with ``fstat``: a regular file owned by the job's user;
* only bytes after the stored offset are read, at most ``max_bytes`` per call
  (and at most 64 KiB more than the size ``fstat`` gave: no 1 MiB buffer per read);
* the file's identity (device, inode) and size are returned, so the caller
  notices a replaced or truncated file and starts again from 0.

`SpoolDir.read` (or, for many files, `SpoolDir.opened` and its `OpenSpool.read`:
the directory opened once) returns a `SpoolRead` whatever happens; it never raises for a
problem with one file. `process_read` cuts a read into validated lines and the
next offset (pure). This module touches the file system and no database;
`malleable.progress.ingest` turns the results into database rows.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from malleable.progress.lines import LineValidator, ProgressRecord, Reason, Rejection, split_lines
from malleable.progress.reporter import MAX_LINE_BYTES, PROGRESS_SUFFIX

SPOOL_MODE = 0o1733   # sticky, writable by all, not listable: like /tmp without `ls`
_SAFE_ID = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]{0,63}")


class FileProblem(enum.StrEnum):
    """Why a job's progress file was not read (counted like line rejections)."""

    SYMLINK = "file_symlink"            # the name is a symbolic link
    NOT_REGULAR = "file_not_regular"    # a directory, FIFO, device, socket
    WRONG_OWNER = "file_wrong_owner"    # owned by another uid than the job's user
    UNREADABLE = "file_unreadable"      # open/read failed (permissions, I/O error)
    BAD_NAME = "file_bad_name"          # the job id cannot name a file safely


@dataclass(frozen=True)
class SpoolRead:
    """The outcome of one read of a job's progress file.

    Attributes:
        exists: False when there is no file (nothing to do, not a problem).
        problem: why the file was refused (None: read fine).
        device, inode: identity of the file (or of the refused entry; None if absent).
        size: the file's size in bytes.
        start: the offset ``data`` starts at: the requested offset, or 0 when the
            file is new, replaced (other device/inode) or truncated (size < offset).
        reset: True when ``start`` went back to 0 for one of those reasons.
        data: the bytes read (at most ``max_bytes``); empty when nothing new.
        mid_line: the byte before ``start`` is not a newline: ``data`` begins inside
            a line the caller skipped (an over-long line); drop it up to its newline.
        detail: a short description of the problem.
    """

    exists: bool
    problem: FileProblem | None = None
    device: int | None = None
    inode: int | None = None
    size: int = 0
    start: int = 0
    reset: bool = False
    data: bytes = b""
    mid_line: bool = False
    detail: str = ""


def progress_file_name(job_id: str) -> str:
    """``<job_id>.jsonl``.

    Raises:
        ValueError: a job id that could name a file outside the directory.
    """
    if not _SAFE_ID.fullmatch(job_id or ""):
        raise ValueError(f"job_id={job_id!r}: expected letters, digits and _ . + - "
                         f"(at most 64, not starting with '.')")
    return job_id + PROGRESS_SUFFIX


def ensure_spool_dir(path: str | os.PathLike, mode: int = SPOOL_MODE) -> list[str]:
    """Create the spool directory (and its parents, 0755) with ``mode`` if missing.

    An existing directory is left as the administrator made it; the returned
    warnings say what is unsafe about it.

    Returns:
        Warnings (empty when all is well): world-writable without the sticky bit
        (users could delete each other's files), world-readable listing.

    Raises:
        OSError: it cannot be created, or the path exists and is not a directory.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, mode=0o755, exist_ok=True)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if not os.path.isdir(path):
                raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory",
                                         path) from None
        else:
            os.chmod(path, mode)   # mkdir's mode is cut by the umask
    st = os.stat(path)
    warnings = []
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        warnings.append(f"{path}: world-writable without the sticky bit: users can remove "
                        f"or replace each other's progress files (chmod 1733)")
    if st.st_mode & stat.S_IROTH:
        warnings.append(f"{path}: world-readable: users can list every job's progress file "
                        f"(chmod 1733)")
    return warnings


class SpoolDir:
    """A directory of per-job progress files (the daemon's, or the simulator's own).

    Attributes:
        path: the directory.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def file_path(self, job_id: str) -> str:
        """Where job ``job_id`` writes (``<path>/<job_id>.jsonl``); ValueError for a bad id."""
        return os.path.join(self.path, progress_file_name(job_id))

    def file_path_safe(self, job_id: str) -> str:
        """`file_path`, or ``<path>/<invalid job id>`` for an id that cannot name a file."""
        try:
            return self.file_path(job_id)
        except ValueError:
            return os.path.join(self.path, "<invalid job id>")

    def read(self, job_id: str, uid: int | None, *, offset: int, device: int | None,
             inode: int | None, max_bytes: int) -> SpoolRead:
        """Read the new bytes of one job's progress file.

        Args:
            job_id: the Slurm job id (names the file).
            uid: the job's user id; the file must be owned by it. None: refused as
                WRONG_OWNER (an owner that cannot be checked is not trusted).
            offset, device, inode: where the previous read stopped and the identity
                of that file (None/0 for a first read).
            max_bytes: at most this many bytes are read (>= 1).

        Returns:
            A `SpoolRead`; never raises for a problem with the file.
        """
        with self.opened() as spool:
            return spool.read(job_id, uid, offset=offset, device=device, inode=inode,
                              max_bytes=max_bytes)

    @contextmanager
    def opened(self) -> Iterator[OpenSpool]:
        """The directory opened once for many reads (one ingest call): yields an
        `OpenSpool` whose ``read`` is `SpoolDir.read`'s; the directory's descriptor is
        closed on exit. If the directory cannot be opened, every read says so (a
        `SpoolRead` with ``exists`` False)."""
        try:
            dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            yield OpenSpool(None, f"spool {self.path}: {exc.strerror}")
            return
        try:
            yield OpenSpool(dfd)
        finally:
            os.close(dfd)


class OpenSpool:
    """The spool directory's open descriptor (from `SpoolDir.opened`), for many reads.

    Attributes:
        dfd: the directory's descriptor (None: it could not be opened).
        error: why it could not be opened ("" when open).
    """

    def __init__(self, dfd: int | None, error: str = ""):
        self.dfd = dfd
        self.error = error

    def read(self, job_id: str, uid: int | None, *, offset: int, device: int | None,
             inode: int | None, max_bytes: int) -> SpoolRead:
        """`SpoolDir.read` relative to the open directory (same arguments and result)."""
        try:
            name = progress_file_name(job_id)
        except ValueError as exc:
            return SpoolRead(exists=True, problem=FileProblem.BAD_NAME, detail=str(exc))
        if self.dfd is None:
            return SpoolRead(exists=False, detail=self.error)
        return _read(self.dfd, name, uid, offset, device, inode, max_bytes)


# Bytes read beyond the size ``fstat`` reported (lines appended between the two calls),
# instead of a buffer of ``max_bytes`` (1 MiB by default) for every read of a few lines.
_GROWTH_SLACK = 1 << 16


def _read(dfd: int, name: str, uid: int | None, offset: int, device: int | None,
          inode: int | None, max_bytes: int) -> SpoolRead:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        return SpoolRead(exists=False)
    except OSError as exc:
        try:
            lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return SpoolRead(exists=False)
        ident = dict(device=lst.st_dev, inode=lst.st_ino, size=lst.st_size)
        if stat.S_ISLNK(lst.st_mode) or exc.errno == errno.ELOOP:
            return SpoolRead(exists=True, problem=FileProblem.SYMLINK, **ident,
                             detail=f"{name} is a symbolic link (not followed)")
        return SpoolRead(exists=True, problem=FileProblem.UNREADABLE, **ident,
                         detail=f"{name}: {exc.strerror}")
    try:
        st = os.fstat(fd)
        ident = dict(device=st.st_dev, inode=st.st_ino, size=st.st_size)
        if not stat.S_ISREG(st.st_mode):
            return SpoolRead(exists=True, problem=FileProblem.NOT_REGULAR, **ident,
                             detail=f"{name} is not a regular file")
        if uid is None or st.st_uid != uid:
            return SpoolRead(exists=True, problem=FileProblem.WRONG_OWNER, **ident,
                             detail=f"{name} is owned by uid {st.st_uid}, the job's "
                                    f"user is uid {uid}")
        same = device == st.st_dev and inode == st.st_ino
        reset = not same or st.st_size < offset
        start = 0 if reset else offset
        if start >= st.st_size:
            return SpoolRead(exists=True, start=start, reset=reset and offset > 0, **ident)
        # One byte before `start` tells whether `start` is at a line boundary.
        lead = 1 if start > 0 else 0
        want = min(max(1, max_bytes), st.st_size - start + _GROWTH_SLACK)
        data = os.pread(fd, want + lead, start - lead)
        mid_line = bool(lead and data[:1] != b"\n")
        return SpoolRead(exists=True, start=start, reset=reset and offset > 0,
                         data=data[lead:], mid_line=mid_line, **ident)
    except OSError as exc:
        return SpoolRead(exists=True, problem=FileProblem.UNREADABLE,
                         detail=f"{name}: {exc.strerror}")
    finally:
        os.close(fd)


@dataclass
class FileResult:
    """What one read of one file yields (before anything is written).

    Attributes:
        records: accepted lines, in file order.
        rejected: rejected lines (and a refused file) counted by reason.
        offset: where the next read starts.
        bytes_read: bytes consumed by this read.
    """

    records: list[ProgressRecord] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    offset: int = 0
    bytes_read: int = 0


def process_read(read: SpoolRead, validator: LineValidator, now: float) -> FileResult:
    """Turn the bytes of one `SpoolRead` into accepted records, counted rejections and
    the next offset. Pure: no I/O.

    Rules: data that begins inside a skipped over-long line is dropped up to its
    newline; complete lines are validated in order; a trailing partial line is
    left for the next read unless it is already longer than the longest valid
    line (then it is counted once as ``too_long`` and skipped).
    """
    result = FileResult(offset=read.start)
    data = read.data
    pos = 0
    if read.mid_line:
        newline = data.find(b"\n")
        if newline < 0:
            result.offset = read.start + len(data)
            result.bytes_read = len(data)
            return result
        pos = newline + 1
    lines, rest = split_lines(data[pos:])
    for line in lines:
        outcome = validator.feed(line, now)
        if isinstance(outcome, Rejection):
            result.rejected[outcome.reason.value] += 1
        else:
            result.records.append(outcome)
    consumed = len(data) - len(rest)
    if len(rest) > MAX_LINE_BYTES:
        result.rejected[Reason.TOO_LONG.value] += 1
        consumed = len(data)
    result.offset = read.start + consumed
    result.bytes_read = consumed
    return result
