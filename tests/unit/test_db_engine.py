"""Engine setup on real SQLite files: pragmas, file modes, read-only sessions, typed errors."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import column, select, table, text, type_coerce
from sqlalchemy.exc import OperationalError

from malleable.cli import main
from malleable.config import Config, DatabaseConfig
from malleable.db.engine import (
    describe_url,
    engine_from_config,
    make_engine,
    session_factory,
    sqlite_path,
)
from malleable.db.errors import DatabaseUnavailable
from malleable.db.types import SharedJSON, from_micros, to_micros


def test_pragmas_on_every_connection(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/a.db", busy_timeout_ms=1234)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        conn.rollback()
    engine.dispose()


def test_another_applications_database_is_not_switched_to_wal(tmp_path):
    """WAL mode is written into the file: opening another application's database (tables,
    no alembic_version) to refuse it switched it to WAL. An empty database and
    malleable's own are switched as before."""
    import sqlite3

    from malleable.db.engine import foreign_sqlite

    theirs = tmp_path / "theirs.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("CREATE TABLE jobs (x TEXT)")
        assert foreign_sqlite(conn)
    conn.close()
    before = theirs.read_bytes()
    engine = make_engine(f"sqlite:///{theirs}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
        conn.rollback()
    engine.dispose()
    assert theirs.read_bytes() == before
    ours = tmp_path / "ours.db"
    with sqlite3.connect(ours) as conn:
        assert not foreign_sqlite(conn)          # empty
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("CREATE TABLE jobs (x TEXT)")
        assert not foreign_sqlite(conn)          # malleable's
    conn.close()
    engine = make_engine(f"sqlite:///{ours}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        conn.rollback()
    engine.dispose()


def test_file_created_0600_in_new_0700_directory(tmp_path):
    db = tmp_path / "deep" / "er" / "m.db"
    old = os.umask(0)  # even with a permissive umask
    try:
        engine = make_engine(f"sqlite:///{db}")
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            for f in (db, db.with_name("m.db-wal"), db.with_name("m.db-shm")):
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        engine.dispose()
    finally:
        os.umask(old)


def test_existing_file_mode_is_left_alone(tmp_path):
    db = tmp_path / "m.db"
    db.touch(mode=0o640)
    os.chmod(db, 0o640)
    make_engine(f"sqlite:///{db}").dispose()
    assert stat.S_IMODE(db.stat().st_mode) == 0o640


def test_missing_file_without_create(tmp_path):
    with pytest.raises(DatabaseUnavailable) as ei:
        make_engine(f"sqlite:///{tmp_path}/none.db", create=False)
    assert str(ei.value).startswith(f"{tmp_path}/none.db: no such database file")
    assert not (tmp_path / "none.db").exists()


def test_an_empty_file_is_refused_without_create_and_left_as_it_was(tmp_path):
    """A read-only command (create=False) on a 0-byte file: refused, and the file stays
    0 bytes (SQLite took it for an empty database and the connect hook wrote a header
    into it: from the new-user helper). With create (db upgrade), it becomes a store."""
    db = tmp_path / "empty.db"
    db.touch()
    with pytest.raises(DatabaseUnavailable) as ei:
        make_engine(f"sqlite:///{db}", create=False)
    assert str(ei.value) == (f"{db}: an empty file, not a state store (run `malleable db "
                             f"upgrade` to create one)")
    assert db.stat().st_size == 0
    make_engine(f"sqlite:///{db}").dispose()
    assert db.stat().st_size > 0
    make_engine(f"sqlite:///{db}", create=False).dispose()


def test_not_a_database(tmp_path):
    db = tmp_path / "junk.db"
    db.write_bytes(b"this is a text file, not SQLite\n" * 200)
    with pytest.raises(DatabaseUnavailable) as ei:
        make_engine(f"sqlite:///{db}")
    assert str(ei.value) == f"{db}: not an SQLite database (file is not a database)"
    assert ei.value.where == str(db)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DatabaseUnavailable, match="is a directory"):
        make_engine(f"sqlite:///{tmp_path}")


def test_bad_urls():
    with pytest.raises(DatabaseUnavailable, match="not a valid SQLAlchemy URL"):
        make_engine("no url at all")
    with pytest.raises(DatabaseUnavailable, match="no driver for nosuchdb"):
        make_engine("nosuchdb://x/y")


def test_unreachable_postgresql_hides_password():
    with pytest.raises(DatabaseUnavailable) as ei:
        make_engine("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    msg = str(ei.value)
    assert "secret" not in msg and "u:***@127.0.0.1:1/db" in msg
    assert "\n" not in msg


def test_describe_and_path():
    assert describe_url("sqlite:////var/lib/m.db") == "/var/lib/m.db"
    assert str(sqlite_path("sqlite:////var/lib/m.db")) == "/var/lib/m.db"
    assert sqlite_path("sqlite://") is None
    assert sqlite_path("postgresql+psycopg://h/db") is None
    assert describe_url("postgresql+psycopg://a:b@h/db") == "postgresql+psycopg://a:***@h/db"


def test_engine_from_config_uses_url_and_timeout(tmp_path):
    cfg = Config(database=DatabaseConfig(url=f"sqlite:///{tmp_path}/c.db", busy_timeout_ms=777))
    engine = engine_from_config(cfg)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 777
        conn.rollback()
    engine.dispose()
    other = engine_from_config(cfg.database, url=f"sqlite:///{tmp_path}/d.db")
    assert other.url.database == f"{tmp_path}/d.db"
    other.dispose()


def test_readonly_session_cannot_write_and_takes_no_write_lock(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/r.db")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x)")
    writer = session_factory(engine)()
    writer.begin()
    writer.execute(text("INSERT INTO t VALUES (1)"))  # holds the write lock (BEGIN IMMEDIATE)
    reader = session_factory(engine, readonly=True)()
    # A read-only transaction starts and reads while the writer holds the lock.
    assert reader.execute(text("SELECT count(*) FROM t")).scalar() == 0
    with pytest.raises(OperationalError, match="readonly"):
        reader.execute(text("INSERT INTO t VALUES (2)"))
    reader.close()
    writer.commit()
    writer.close()
    engine.dispose()


def test_utc_datetime_round_trip_and_naive_refused():
    t = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert from_micros(to_micros(t)) == t
    assert from_micros(to_micros(t)).tzinfo == UTC
    assert to_micros(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    with pytest.raises(ValueError, match="naive datetime"):
        to_micros(datetime(2026, 1, 1))


def test_shared_json_decodes_each_text_once_and_passes_decoded_values_through():
    """Read-side type of a JSON column (the managed jobs' specs, every decide cycle)."""
    engine = make_engine("sqlite://")
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE t (id INTEGER, doc TEXT)"))
        conn.execute(text("INSERT INTO t VALUES (1, '{\"a\": [1, 2.5]}'), "
                          "(2, '{\"a\": [1, 2.5]}'), (3, NULL), (4, '7')"))
        col = type_coerce(column("doc"), SharedJSON())
        got = conn.execute(select(col.label("doc")).select_from(table("t"))
                           .order_by(column("id"))).scalars().all()
    assert got == [{"a": [1, 2.5]}, {"a": [1, 2.5]}, None, 7]
    assert got[0] is got[1]        # one decode, one shared (read-only) dict
    reader = SharedJSON()
    assert reader.process_result_value({"b": 1}, None) == {"b": 1}   # decoded by the driver
    assert reader.process_result_value(b'{"c": 2}', None) == {"c": 2}
    engine.dispose()


def test_engine_from_config_refuses_an_in_memory_state_store(tmp_path):
    # `db upgrade --database-url sqlite://` said "schema upgraded" of nothing; a daemon on
    # it would lose its state at exit. The simulator uses make_engine("sqlite://") itself.
    for url in ("sqlite://", "sqlite:///:memory:"):
        with pytest.raises(DatabaseUnavailable, match="an in-memory SQLite database"):
            engine_from_config(Config(database=DatabaseConfig(url=url)))
        with pytest.raises(DatabaseUnavailable, match=f"^database.url = '{url}': an in-memory"):
            engine_from_config(Config(database=DatabaseConfig(url=url)))
    r = CliRunner().invoke(main, ["db", "upgrade", "--database-url", "sqlite://"])
    assert r.exit_code == 2 and "an in-memory SQLite database" in r.output
    # (a tester: the message began ":memory:: an in-memory ...", naming no setting)
    assert "--database-url = 'sqlite://': an in-memory SQLite database" in r.output, r.output
    make_engine("sqlite://").dispose()


def test_another_applications_alembic_database_is_foreign_and_left_as_it_was(tmp_path):
    """A file versioned by another application's Alembic (a hex revision) was refused as
    "written by a newer malleable" and switched to WAL on the way (a new-user tester).
    Its revision is not of malleable's four-digit form: it is foreign, not touched, and
    the schema layer says it is not a malleable database."""
    import sqlite3

    from malleable.db import schema
    from malleable.db.engine import foreign_sqlite, is_malleable_revision
    from malleable.db.errors import NotMalleableDatabase

    assert is_malleable_revision("0004") and is_malleable_revision("0123")
    assert not any(is_malleable_revision(r) for r in ("deadbeef1234", "4", "00041", None))
    theirs = tmp_path / "theirs.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("CREATE TABLE stuff (x TEXT)")
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('deadbeef1234')")
        assert foreign_sqlite(conn)
    conn.close()
    before = theirs.read_bytes()
    engine = make_engine(f"sqlite:///{theirs}")
    for call in (schema.check_schema, schema.upgrade, lambda e: schema.downgrade(e, "base")):
        with pytest.raises(NotMalleableDatabase, match=r"not a malleable database: it holds "
                           r"tables \(stuff\) but its alembic_version holds revision "
                           r"'deadbeef1234', not one of malleable's \(four digits"):
            call(engine)
    engine.dispose()
    assert theirs.read_bytes() == before
