"""Schema versions on SQLite: check_schema, prepare_schema, and models == migrations."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

import malleable.db.migrations as migrations_pkg
from malleable import __version__
from malleable.db import schema
from malleable.db.engine import make_engine
from malleable.db.errors import (
    NotMalleableDatabase,
    SchemaMissing,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
)
from malleable.db.models import Base

# The newest revision this malleable ships (the test revision 9001 goes on top of it).
SHIPPED = schema.head_revision()
SHIPPED_ALL = schema.known_revisions()

EXTRA_REVISION = '''"""test-only revision on top of the shipped head"""
import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("jobs", sa.Column("test_only", sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table("jobs") as b:
        b.drop_column("test_only")
'''


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/s.db")
    yield eng
    eng.dispose()


@pytest.fixture
def newer_malleable(tmp_path, monkeypatch):
    """A copy of the migrations with one more revision: plays a newer malleable."""
    src = Path(migrations_pkg.__file__).parent
    dst = tmp_path / "newer_migrations"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "versions" / "9001_test_only.py").write_text(
        EXTRA_REVISION.format(head=schema.head_revision()))

    def use(newer: bool) -> None:
        monkeypatch.setattr(schema, "MIGRATIONS", str(dst) if newer else "malleable.db:migrations")
    return use


def test_empty_database(engine):
    st = schema.schema_status(engine)
    assert st.empty and st.current is None and st.head == schema.head_revision()
    with pytest.raises(SchemaMissing, match="run `malleable db upgrade`"):
        schema.check_schema(engine)
    with pytest.raises(SchemaMissing):
        schema.prepare_schema(engine, create_if_empty=False)


def test_daemon_creates_schema_in_empty_database(engine):
    assert schema.prepare_schema(engine) == schema.head_revision()
    st = schema.schema_status(engine)
    assert st.up_to_date and st.written_by == __version__
    assert schema.check_schema(engine) == schema.head_revision()


def test_migrations_match_models(engine):
    schema.upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
        conn.rollback()
    assert diff == []


def test_older_schema_is_refused_with_upgrade_hint(engine, newer_malleable):
    schema.upgrade(engine)                        # this malleable's head
    newer_malleable(True)                         # now a newer malleable starts
    with pytest.raises(SchemaTooOld) as ei:
        schema.check_schema(engine)
    assert ei.value.found == SHIPPED and ei.value.expected == "9001"
    assert "run `malleable db upgrade`" in str(ei.value)
    with pytest.raises(SchemaTooOld):
        schema.prepare_schema(engine)             # the daemon never upgrades on its own
    assert schema.upgrade(engine) == (SHIPPED, "9001")
    assert schema.check_schema(engine) == "9001"


def test_newer_schema_is_refused_naming_revision_and_writer(engine, newer_malleable):
    newer_malleable(True)
    schema.upgrade(engine)
    with engine.begin() as conn:   # pretend the newer malleable had a newer version number
        conn.execute(text("UPDATE settings SET value = '\"9.9.9\"' "
                          "WHERE key = 'schema.written_by'"))
    newer_malleable(False)
    for call in (schema.check_schema, schema.prepare_schema, schema.upgrade):
        with pytest.raises(SchemaTooNew) as ei:
            call(engine)
        msg = str(ei.value)
        assert "schema revision 9001" in msg and "malleable 9.9.9" in msg and "newer" in msg
        assert ei.value.found == "9001" and ei.value.written_by == "9.9.9"
    with pytest.raises(SchemaTooNew):
        schema.downgrade(engine, "base")


def test_newer_schema_of_the_same_version_number_says_another_build(engine, newer_malleable):
    newer_malleable(True)
    schema.upgrade(engine)                # written_by: this version number, other code
    newer_malleable(False)
    with pytest.raises(SchemaTooNew) as ei:
        schema.check_schema(engine)
    msg = str(ei.value)
    assert f"written by another build of malleable {__version__}" in msg
    assert msg.count(__version__) == 1 and "revisions up to" in msg


def test_foreign_tables_are_not_a_malleable_database(engine):
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE other_app (x)"))
    with pytest.raises(NotMalleableDatabase, match="no malleable schema version"):
        schema.check_schema(engine)


def test_upgrade_downgrade_errors(engine, newer_malleable):
    assert schema.downgrade(engine, "base") == (None, None)
    with pytest.raises(StoreError, match="unknown revision 'nope'"):
        schema.upgrade(engine, "nope")
    newer_malleable(True)
    schema.upgrade(engine, SHIPPED)
    with pytest.raises(StoreError, match="newer than the current"):
        schema.downgrade(engine, "9001")
    schema.upgrade(engine)
    with pytest.raises(StoreError, match="older than the current"):
        schema.upgrade(engine, SHIPPED)
    assert schema.downgrade(engine, SHIPPED) == ("9001", SHIPPED)
    assert schema.known_revisions() == [*SHIPPED_ALL, "9001"]


def test_migrations_ship_in_the_package_without_alembic_ini():
    import tomllib

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["*"]
    assert "*.mako" in patterns                      # script.py.mako; .py files are packages
    mig = Path(migrations_pkg.__file__).parent
    for f in ("__init__.py", "env.py", "script.py.mako", "versions/__init__.py"):
        assert (mig / f).is_file(), f
    assert not list(mig.rglob("alembic.ini"))
    assert schema.known_revisions()[0] == "0001"


def test_downgrade_is_refused_while_a_daemon_holds_the_lease(tmp_path, monkeypatch):
    """`db downgrade base` under a running daemon dropped its tables (it then logged
    tracebacks every cycle): refused while the lease has a fresh heartbeat, unless --force."""
    from datetime import UTC, datetime, timedelta

    from click.testing import CliRunner

    from malleable.cli import main
    from malleable.db.lease import acquire_lease, release_lease

    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    url = f"sqlite:///{tmp_path}/m.db"
    run = CliRunner().invoke
    assert run(main, ["db", "upgrade", "--database-url", url]).exit_code == 0
    eng = make_engine(url)
    acquire_lease(eng, "node1:4242", timeout_s=60, now=datetime.now(UTC))
    r = run(main, ["db", "downgrade", "base", "--database-url", url])
    assert r.exit_code == 2
    assert "a daemon is running on this database: node1:4242 (heartbeat" in r.output
    assert "stop it first" in r.output and schema.schema_status(eng).up_to_date
    # A stale lease (the daemon died) does not block; nor does --force.
    release_lease(eng, "node1:4242")
    acquire_lease(eng, "node1:4243", timeout_s=60, now=datetime.now(UTC) - timedelta(hours=1))
    r = run(main, ["db", "downgrade", "0003", "--database-url", url])
    assert r.exit_code == 0, r.output
    assert run(main, ["db", "upgrade", "--database-url", url]).exit_code == 0
    acquire_lease(eng, "node1:4244", timeout_s=60, now=datetime.now(UTC),
                  dead_holder="node1:4243")
    r = run(main, ["db", "downgrade", "base", "--force", "--database-url", url])
    assert r.exit_code == 0 and "to base" in r.output
    eng.dispose()


def test_upgrade_is_refused_while_a_daemon_holds_the_lease(tmp_path, monkeypatch):
    """`db upgrade` under a running daemon went ahead while `db downgrade` refused: a
    migration locks the tables it changes (0005 indexes the events and actions), so the
    daemon's cycles failed until it ended (a tester). Refused alike, unless --force."""
    from datetime import UTC, datetime

    from click.testing import CliRunner

    from malleable.cli import main
    from malleable.db.lease import acquire_lease

    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    url = f"sqlite:///{tmp_path}/m.db"
    run = CliRunner().invoke
    assert run(main, ["db", "upgrade", "--to", "0004", "--database-url", url]).exit_code == 0
    eng = make_engine(url)
    acquire_lease(eng, "node1:4242", timeout_s=60, now=datetime.now(UTC))
    r = run(main, ["db", "upgrade", "--database-url", url])
    assert r.exit_code == 2
    assert "a daemon is running on this database: node1:4242 (heartbeat" in r.output
    assert schema.schema_status(eng).current == "0004"
    r = run(main, ["db", "upgrade", "--force", "--database-url", url])
    assert r.exit_code == 0 and f"from 0004 to {SHIPPED}" in r.output, r.output
    eng.dispose()


def test_downgrade_help_lists_the_revisions_newest_first(newer_malleable):
    """`db downgrade --help` named no revision: it lists every one the migration scripts
    hold (id and the docstring's first line), newest first, then base; read when the
    help is shown, so a newer script appears without editing the command."""
    from click.testing import CliRunner

    from malleable.cli import main

    def listed(output: str) -> list[str]:
        section = output.split("Revisions (newest first):\n", 1)[1].split("\n\n", 1)[0]
        return [line.split()[0] for line in section.splitlines() if not line.startswith("    ")]

    r = CliRunner().invoke(main, ["db", "downgrade", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert listed(r.output) == [*reversed(SHIPPED_ALL), "base"]
    assert f"{SHIPPED} (head)" in r.output
    assert re.search(r"\n  0001 +The first schema: every table of the state store\.\n", r.output)
    newer_malleable(True)
    r = CliRunner().invoke(main, ["db", "downgrade", "--help"], terminal_width=200)
    assert listed(r.output) == ["9001", *reversed(SHIPPED_ALL), "base"]
    assert re.search(r"\n  9001 \(head\) +test-only revision on top of the shipped head\n",
                     r.output)


def test_upgrade_help_lists_the_revisions_without_base():
    from click.testing import CliRunner

    from malleable.cli import main

    r = CliRunner().invoke(main, ["db", "upgrade", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    section = r.output.split("Revisions (newest first):\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in section.splitlines() if not line.startswith("    ")]
    assert listed == list(reversed(SHIPPED_ALL))
    assert f"{SHIPPED} (head)" in r.output


def test_revision_notes_are_the_scripts_first_docstring_lines():
    notes = schema.revision_notes()
    assert [rev for rev, _ in notes] == list(reversed(SHIPPED_ALL))
    assert notes[-1] == ("0001", "The first schema: every table of the state store.")
    assert all(doc and "\n" not in doc for _, doc in notes)


@pytest.mark.parametrize("rev", ["", "heads", "0003@head", "-1", " 0003"])
def test_only_known_revision_ids_head_and_base_are_accepted(engine, rev):
    schema.upgrade(engine)
    for fn in (schema.upgrade, schema.downgrade):
        with pytest.raises(StoreError, match=f"unknown revision {rev!r} \\(known: "):
            fn(engine, rev)


def test_upgrade_to_base_is_older_and_points_to_downgrade(engine):
    schema.upgrade(engine)
    with pytest.raises(StoreError, match="revision base is older than the current .*; use "
                                         "`malleable db downgrade base`"):
        schema.upgrade(engine, "base")


@pytest.mark.parametrize("url, message", [
    ("notaurl", "expected an SQLAlchemy URL"),
    ("", "expected an SQLAlchemy URL"),
    ("sqlite:///rel.db", "expected the SQLite file as an absolute path"),
    # (two slashes: 'rel.db' parsed as a host, and the database was in memory, shown as
    # ':memory:' and lost at exit)
    ("sqlite://rel.db", "an SQLite URL has no host, user or port, and this one has host "
     "'rel.db' (so no file: a database in memory, lost at exit)"),
    ("sqlite://alice@/rel.db", "an SQLite URL has no host, user or port, and this one has "
     "user 'alice': expected sqlite:////ABS/PATH.db"),
    ("sqlite:////", "names a directory (/); expected the SQLite file"),
    ("sqlite:////tmp/x/", "names a directory (/tmp/x/); expected the SQLite file"),
    # (a tester: an existing directory without the slash gave 'unable to open database
    # file'; %00 and %0A are percent-decoded into the file name; file: URI names made a
    # file named 'file:...' in the working directory)
    ("sqlite:////tmp", "names a directory (/tmp); expected the SQLite file"),
    ("sqlite:////tmp/a%00b.db", "the database name holds the control character '\\x00' "
     "(percent-decoded)"),
    ("sqlite:////tmp/a%0Ab.db", "the database name holds the control character '\\n' "
     "(percent-decoded)"),
    ("postgresql+psycopg://u@h/d%07b", "the database name holds the control character "
     "'\\x07' (percent-decoded)"),
    ("sqlite:///file:/tmp/x.db", "SQLite URI file names (file:...) are not supported"),
    # (mode=ro without uri=true made a file named 'c.db?mode=ro', mode 0644; timeout=abc
    # was a traceback)
    ("sqlite:////tmp/x/c.db?mode=ro&uri=true", "query parameters (?mode=ro&uri=true) are "
     "not supported in an SQLite URL"),
    ("sqlite:////tmp/x/c.db?timeout=abc", "query parameters (?timeout=abc) are not "
     "supported in an SQLite URL")])
@pytest.mark.parametrize("command", [["upgrade"], ["current"], ["downgrade", "base"]])
def test_db_commands_check_database_url_like_the_config(tmp_path, monkeypatch, url, message,
                                                        command):
    """`db` took --database-url unchecked: a traceback, a relative file, or '' meaning
    the default (which created /var/lib/malleable/malleable.db)."""
    from click.testing import CliRunner

    from malleable.cli import main

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["db", *command, "--database-url", url])
    assert r.exit_code == 2, r.output
    assert f"--database-url = {url!r}: {message}" in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []
