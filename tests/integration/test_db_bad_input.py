"""Unusable databases: a file that is not SQLite, a read-only file, a full disk.

`malleable db upgrade` and `malleable db current` run as real processes and
must print ONE line on stderr naming the path and the cause, exit with 2, and
show no traceback; the Python API raises `DatabaseUnavailable` with the same
message. The full disk is a tiny tmpfs mounted here (as root; as another user
a file size limit, RLIMIT_FSIZE, plays the full disk); the read-only cases are
a file without write permission for the user running the command (as root,
the command runs as ``nobody``, because root may write any file) and a
read-only mount; there `db current`, which only reads, works.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from malleable.db import schema
from malleable.db.engine import make_engine
from malleable.db.errors import DatabaseUnavailable

MALLEABLE = [sys.executable, "-m", "malleable"]
ROOT = os.geteuid() == 0


def run_db(*args: str, url: str, user: str | None = None,
           preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*MALLEABLE, "db", *args, "--database-url", url], capture_output=True,
                          text=True, timeout=60, user=user, preexec_fn=preexec, cwd="/",
                          env={k: v for k, v in os.environ.items() if k != "MALLEABLE_CONFIG"})


def assert_one_line_error(proc: subprocess.CompletedProcess, cmd: str, path: Path,
                          *causes: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"malleable db {cmd}: error: {path}: "), line
    assert any(c in line for c in causes), line
    return line


@pytest.fixture
def mount_tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                               str(point)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs as root: {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_not_sqlite(tmp_path):
    db = tmp_path / "m.db"
    db.write_text("[database]\nurl = 'this is a TOML file, not a database'\n" * 100)
    url = f"sqlite:///{db}"
    for cmd in ("upgrade", "current"):
        assert_one_line_error(run_db(cmd, url=url), cmd, db, "not an SQLite database")
    with pytest.raises(DatabaseUnavailable, match=f"^{db}: not an SQLite database"):
        make_engine(url)
    assert db.read_text().startswith("[database]")      # untouched


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory outside pytest's private (0700) tree, so another user can reach it."""
    d = Path(tempfile.mkdtemp(prefix="malleable-ro-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_read_only_file(shared_dir):
    db = shared_dir / "m.db"
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    if ROOT:
        db.chmod(0o644)          # readable, writable only by root; the commands run as nobody
        user = "nobody"
        pwd.getpwnam(user)
    else:
        db.chmod(0o444)
        user = None
    assert_one_line_error(run_db("upgrade", url=url, user=user), "upgrade", db,
                          "read-only file (no write permission)")
    # `current` only reads: a file the user may only read is enough
    proc = run_db("current", url=url, user=user)
    assert proc.returncode == 0 and proc.stdout.endswith(" (head)\n"), proc.stderr
    if not ROOT:
        with pytest.raises(DatabaseUnavailable, match="read-only file"):
            make_engine(url)


@pytest.mark.skipif(not ROOT, reason="mounting a read-only file system needs root")
def test_read_only_file_system(mount_tmpfs):
    point = mount_tmpfs("2m")
    db = point / "m.db"
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
    assert_one_line_error(run_db("upgrade", url=url), "upgrade", db, "read-only file system")
    proc = run_db("current", url=url)      # only reads
    assert proc.returncode == 0 and proc.stdout.endswith(" (head)\n"), proc.stderr
    with pytest.raises(DatabaseUnavailable, match=f"^{db}: read-only file system$"):
        make_engine(url)


def _fill(point: Path) -> None:
    fd = os.open(point / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError:
        pass  # ENOSPC: the file system is full, as wanted
    finally:
        os.close(fd)


@pytest.mark.skipif(not ROOT, reason="mounting a tmpfs needs root (see the RLIMIT test)")
def test_full_disk(mount_tmpfs):
    point = mount_tmpfs("2m")
    existing = point / "old.db"
    engine = make_engine(f"sqlite:///{existing}")
    schema.upgrade(engine)
    engine.dispose()
    _fill(point)
    new = point / "new.db"
    for db in (new, existing):
        for cmd in ("upgrade", "current"):
            # The failed upgrade removes the new.db it made: a read-only command then
            # finds no file (it never creates one).
            cause = "no such database file" if (db, cmd) == (new, "current") else "disk full"
            assert_one_line_error(run_db(cmd, url=f"sqlite:///{db}"), cmd, db, cause)
            assert new.exists() is False
    with pytest.raises(DatabaseUnavailable, match=f"^{new}: disk full"):
        engine = make_engine(f"sqlite:///{new}")
        schema.upgrade(engine)


def test_file_size_limit_as_full_disk(tmp_path):
    db = tmp_path / "m.db"

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    assert_one_line_error(run_db("upgrade", url=f"sqlite:///{db}", preexec=limit), "upgrade",
                          db, "disk I/O error", "disk full")
    # The file the failed upgrade made is removed, with its WAL and shared memory.
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # nothing half-done: without the limit the upgrade succeeds from scratch
    engine = make_engine(f"sqlite:///{db}")
    assert schema.upgrade(engine) == (None, schema.head_revision())
    engine.dispose()


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path):
    """`malleable db upgrade` wrote its tables into a file of another application, and
    showed a traceback when that file had a `jobs` table of its own (a new-user tester).
    Now it exits 2 naming the path and a few tables; the file is byte for byte the same
    (not even switched to WAL mode); an empty database and malleable's own upgrade."""
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE jobs (x TEXT)")
        for name in ("users", "orders", "invoices", "items", "zones"):
            conn.execute(f"CREATE TABLE {name} (id INTEGER)")
    conn.close()
    before = db.read_bytes()
    url = f"sqlite:///{db}"
    line = assert_one_line_error(run_db("upgrade", url=url), "upgrade", db,
                                 "not a malleable database")
    assert line.endswith(f"{db}: not a malleable database: it holds tables (invoices, "
                         f"items, jobs, orders, users and 1 more) but no malleable schema "
                         f"version (alembic_version); malleable writes its tables only into "
                         f"an empty database or its own: give a new file or an empty "
                         f"database")
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    # `db current` says so too, as every other command (it exited 0 with "not a malleable
    # database?": a new-user tester).
    assert_one_line_error(run_db("current", url=url), "current", db, "not a malleable database")
    assert db.read_bytes() == before
    own = tmp_path / "own.db"
    for _ in range(2):
        proc = run_db("upgrade", url=f"sqlite:///{own}")
        assert proc.returncode == 0, proc.stderr
    assert "schema already at revision" in proc.stdout
