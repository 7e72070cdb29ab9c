"""A private PostgreSQL server for tests marked ``postgres`` (registered by tests/conftest.py).

``postgres_server`` (session scope): installs Debian's ``postgresql`` package
with apt-get if no server binaries are found (``apt-get update`` first), then
runs ``initdb`` and ``pg_ctl start`` as the ``postgres`` OS user (as the
current user when not root) in a fresh temporary directory, listening only on
a Unix socket in that directory (``listen_addresses=''``) under a free random
port number. It stops exactly that server (``pg_ctl -D <its dir> stop``) and
removes the directory at the end. No system-wide cluster is started,
stopped or changed.

``postgres_session_url`` (session scope): a database "malleable" on that
server, created once; its SQLAlchemy URL
(``postgresql+psycopg://postgres@/NAME?host=DIR&port=PORT``).

``postgres_url`` (per test): a new, empty database on that server; its URL.
The database is dropped after the test.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_USER = "postgres"


def _pg_bindir() -> Path | None:
    """The newest Debian PostgreSQL server's bin directory, if installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name
                   .isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _install_postgresql() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    """A running private server: its data directory, socket directory and port."""

    bindir: Path
    root: Path
    datadir: Path
    port: int
    run_as: str | None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{PG_USER}@/{dbname}?host={self.root}&port={self.port}"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a server binary (as the postgres user when we are root); raise on failure."""
        proc = subprocess.run([str(self.bindir / argv[0]), *argv[1:]], capture_output=True,
                              text=True, timeout=timeout, user=self.run_as, cwd=self.root)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc

    def psql(self, sql: str) -> None:
        self.run("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.root), "-p",
                 str(self.port), "-U", PG_USER, "-d", "postgres", "-c", sql)


def start_server() -> PostgresServer:
    """Install (if needed), initialise and start a private server; see the module docstring."""
    bindir = _pg_bindir()
    if bindir is None:
        if os.geteuid() != 0:
            pytest.skip("PostgreSQL is not installed and installing it needs root (apt-get)")
        _install_postgresql()
        bindir = _pg_bindir()
        if bindir is None:
            raise RuntimeError("apt-get installed postgresql but no initdb was found")
    run_as = None
    root = Path(tempfile.mkdtemp(prefix="malleable-pg-"))
    if os.geteuid() == 0:
        run_as = PG_USER
        pw = pwd.getpwnam(PG_USER)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PostgresServer(bindir, root, root / "data", _free_port(), run_as)
    try:
        server.run("initdb", "-D", str(server.datadir), "-U", PG_USER, "--auth=trust",
                   "--no-sync", "-E", "UTF8", "--locale=C")
        opts = (f"-c listen_addresses='' -c port={server.port} "
                f"-c unix_socket_directories='{root}' -c fsync=off -c full_page_writes=off "
                f"-c synchronous_commit=off -c max_connections=50")
        server.run("pg_ctl", "-D", str(server.datadir), "-l", str(root / "server.log"),
                   "-o", opts, "-w", "-t", "60", "start")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server


def stop_server(server: PostgresServer) -> None:
    """Stop exactly this server and remove its directory."""
    try:
        server.run("pg_ctl", "-D", str(server.datadir), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the whole session."""
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def postgres_session_url(postgres_server: PostgresServer) -> Iterator[str]:
    """One database ("malleable") on the private server for the whole session; its URL."""
    postgres_server.psql("CREATE DATABASE malleable")
    yield postgres_server.url("malleable")


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database on the private server; its SQLAlchemy URL. Dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres_server.psql(f"CREATE DATABASE {name}")
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
