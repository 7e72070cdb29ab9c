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
