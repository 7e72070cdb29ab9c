"""`DatabaseFile`: the daemon's check that its SQLite file is still the one it opened."""

from __future__ import annotations

import os

from malleable.daemon.service import DatabaseFile
from malleable.db.engine import make_engine


def test_the_file_removed_or_replaced_is_told_apart_from_the_same_file(tmp_path, monkeypatch):
    db = tmp_path / "m.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        f = DatabaseFile.of(engine)
        assert f is not None and f.path == str(db) and f.changed() is None
        with engine.begin() as c:             # writing to it keeps its identity
            c.exec_driver_sql("CREATE TABLE t (x)")
        assert f.changed() is None
        os.replace(db, tmp_path / "old.db")
        assert f.changed() == "was removed (or moved away)"
        (tmp_path / "new.db").write_bytes(b"")
        os.replace(tmp_path / "new.db", db)
        assert f.changed() == "was replaced by another file"
    finally:
        engine.dispose()
    # A relative URL is resolved at start (the daemon's working directory does not move).
    monkeypatch.chdir(tmp_path)
    rel = make_engine("sqlite:///rel.db")
    try:
        assert DatabaseFile.of(rel).path == str(tmp_path / "rel.db")
    finally:
        rel.dispose()
    memory = make_engine("sqlite://")
    try:
        assert DatabaseFile.of(memory) is None
    finally:
        memory.dispose()


def test_a_replaced_file_is_saved_with_its_log_and_its_stale_log_removed(tmp_path):
    """A file put in place of a running daemon's database replayed the old file's
    write-ahead log, left at the path, when next opened: "database disk image is
    malformed"; and a moved file lacked the writes still in that log (a tester). What the
    daemon holds open is saved as <path>.gone-<stamp> (+ -wal) and the stale log removed."""
    import sqlite3

    db = tmp_path / "m.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as c:
            c.exec_driver_sql("CREATE TABLE t (x)")
        with engine.begin() as c:
            c.exec_driver_sql("INSERT INTO t VALUES (1), (2), (3)")
        assert (tmp_path / "m.db-wal").stat().st_size > 0   # the rows are in the log
        f = DatabaseFile.of(engine)
        db.rename(tmp_path / "moved.db")                     # the log stays at the path
        fresh = sqlite3.connect(tmp_path / "new.db")
        fresh.execute("CREATE TABLE other (y)")
        fresh.close()
        os.replace(tmp_path / "new.db", db)
        assert f.changed() == "was replaced by another file"
        said = f.save_gone("20261205T080000Z")
    finally:
        engine.dispose()
    gone = tmp_path / "m.db.gone-20261205T080000Z"
    assert said == (f"the database as this daemon last had it is saved as {gone} with its "
                    f"write-ahead log {gone}-wal (open it as a database); the old file's "
                    f"{db}-wal and {db}-shm removed, so that a file put in its place does "
                    "not replay them")
    assert oct(gone.stat().st_mode & 0o777) == "0o600"
    saved = sqlite3.connect(gone)
    assert saved.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,), (3,)]
    saved.close()
    new = sqlite3.connect(db)   # the replacement is healthy: no stale log replayed into it
    assert new.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert [r[0] for r in new.execute("SELECT name FROM sqlite_master")] == ["other"]
    new.close()
