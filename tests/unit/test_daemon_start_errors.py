"""``malleable daemon`` refuses to start with exit code 2 and one line naming the cause.

No Slurm is needed: every check here fails before the daemon talks to Slurm. The
command runs as a subprocess, exactly as systemd runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from malleable.db import schema
from malleable.db.engine import make_engine
from malleable.db.lease import acquire_lease, read_lease

MALLEABLE = Path(sys.executable).parent / "malleable"
ROOT = Path(__file__).resolve().parents[2]


def _with_this_tree(env: dict) -> dict:
    """``env`` with this checkout first on PYTHONPATH: the console script imports the tree
    under test, not the one the virtualenv was installed from (another git worktree)."""
    return {**env, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)}


def run(config: Path) -> subprocess.CompletedProcess:
    env = _with_this_tree({k: v for k, v in os.environ.items()
                           if k not in ("MALLEABLE_CONFIG", "MALLEABLE_DATABASE_URL",
                                        "MALLEABLE_TEST_CRASH_AT")})
    return subprocess.run([str(MALLEABLE), "daemon", "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=60)


def write(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "spool").mkdir(exist_ok=True)
    p = tmp_path / "m.toml"
    p.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/m.db"\n'
                 f'[progress]\nspool_dir = "{tmp_path}/spool"\n{extra}')
    return p


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("malleable daemon: error: "), proc.stderr
    return lines[-1]


@pytest.mark.parametrize("extra, key", [
    ('[daemon]\npoll_interval_s = "fast"\n', "daemon.poll_interval_s = 'fast': expected number"),
    ("[policy]\nnmae = \"equi\"\n", "policy.nmae: unknown key"),
    ('[policy]\nname = "nosuch"\n', "policy.name='nosuch'"),
    ('[policy]\nname = "pollux"\nparams = {p = "x"}\n', "policy.params={'p': 'x'}"),
])
def test_a_bad_config_exits_2_naming_the_key(tmp_path, extra, key):
    line = one_error_line(run(write(tmp_path, extra)))
    assert key in line
    assert not (tmp_path / "m.db").exists()     # refused before anything was touched


def test_a_database_with_an_older_schema_refuses_with_the_upgrade_hint(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/m.db")
    schema.upgrade(engine, schema.known_revisions()[0])
    engine.dispose()
    line = one_error_line(run(write(tmp_path)))
    old, head = schema.known_revisions()[0], schema.head_revision()
    assert f"schema revision {old} is older than this malleable's {head}" in line
    assert "run `malleable db upgrade`" in line


def test_a_lease_held_by_another_daemon_refuses_naming_the_holder(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/m.db")
    schema.upgrade(engine)
    acquire_lease(engine, "other-host:4242", timeout_s=300)
    engine.dispose()
    line = one_error_line(run(write(tmp_path, "[daemon]\nlease_timeout_s = 300\n")))
    assert "another malleable daemon holds the lease: other-host:4242" in line


def test_a_second_daemon_names_the_lease_holder_before_binding_the_metrics_port(tmp_path):
    """The first daemon serves metrics on the port; a second one with the same configuration
    must say who holds the lease, not fail on the port (it bound the port first once)."""
    engine = make_engine(f"sqlite:///{tmp_path}/m.db")
    schema.upgrade(engine)
    acquire_lease(engine, "other-host:4242", timeout_s=300)
    engine.dispose()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(run(write(tmp_path, f'[daemon]\nlease_timeout_s = 300\n'
                                                   f'[metrics]\naddress = "127.0.0.1:{port}"\n')))
    assert "another malleable daemon holds the lease: other-host:4242" in line


def test_a_busy_metrics_port_exits_2_naming_metrics_address_and_the_port(tmp_path):
    """It took the lease, then failed with a raw "[Errno 98] ... Address already in use":
    now one line names the key and the port, exit 2, and the lease is given back."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(run(write(tmp_path, f'[metrics]\naddress = "127.0.0.1:{port}"\n')))
    assert line == (f"malleable daemon: error: metrics.address = '127.0.0.1:{port}': cannot "
                    f"listen: port {port} is already in use by another process (stop it, or "
                    f"set another port in [metrics] address)")
    engine = make_engine(f"sqlite:///{tmp_path}/m.db", create=False)
    assert read_lease(engine).holder is None
    engine.dispose()


def test_a_malformed_crash_hook_refuses_to_start(tmp_path):
    """The test hook is off unless set; set wrongly, it is a start error, not a silent no-op."""
    env = _with_this_tree({**os.environ, "MALLEABLE_TEST_CRASH_AT": "requeue.signal"})
    env.pop("MALLEABLE_CONFIG", None)
    proc = subprocess.run([str(MALLEABLE), "daemon", "--config", str(write(tmp_path))],
                          env=env, capture_output=True, text=True, timeout=60)
    line = one_error_line(proc)
    assert "MALLEABLE_TEST_CRASH_AT: 'requeue.signal' is not of the form" in line


def test_a_config_file_that_is_not_utf8_exits_2_naming_the_file(tmp_path):
    p = write(tmp_path, "# \xff\n")
    p.write_bytes(p.read_bytes().replace("\xff".encode(), b"\xff"))
    line = one_error_line(run(p))
    assert str(p) in line and "not UTF-8" in line
