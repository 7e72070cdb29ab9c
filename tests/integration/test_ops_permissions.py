"""Reading the state store as a member of the operator group, with the permissions
docs/operator-guide.md ("Who may do what") sets up, and no daemon running.

Real permissions need a user other than root: the commands run as ``nobody`` through
``setpriv`` with the group ``users``. No Slurm is needed (status, job show and actions
only read the store).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.unit.ops_store import build_store

EXE = str(Path(sys.executable).parent / "malleable")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to run as another user")


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "SLURM_CONF": "/nonexistent/slurm.conf"}
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--groups=users",
                           EXE, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def shared_store():
    """A store in a 0751 directory owned by root; the file root:users 0660 (writable by
    the operator group, as for `pause`), and no -wal/-shm files (no daemon running)."""
    base = Path(tempfile.mkdtemp(prefix="malleable-perm-"))
    try:
        base.chmod(0o751)
        db = base / "m.db"
        build_store(db)
        for extra in (Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert not extra.exists()
        os.chown(db, 0, grp.getgrnam("users").gr_gid)
        db.chmod(0o660)
        yield f"sqlite:///{db}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_group_writable_store_in_a_closed_directory_reads_with_no_daemon(shared_store):
    # SQLite cannot create the -wal/-shm files in a directory the user cannot write: the
    # commands used to fail with "attempt to write a readonly database" (exit 2) exactly
    # when the daemon was down, and `status --check` said that, not that it is down.
    r = _as_nobody("status", "--json", "--database-url", shared_store)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # (the store's lease is an old one: no daemon renews it)
    assert doc["daemon"]["health"] == "stale" and [j["job_id"] for j in doc["jobs"]] == \
        ["101", "102"]
    r = _as_nobody("status", "--check", "--database-url", shared_store)
    assert r.returncode == 1 and "daemon stale" in r.stderr, r.stderr
    for args in (("job", "show", "101"), ("actions",)):
        r = _as_nobody(*args, "--database-url", shared_store)
        assert r.returncode == 0, (args, r.stderr)
