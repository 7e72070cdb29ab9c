"""Safe reads of the spool directory and the byte-level rules of ingestion (no database)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from malleable.progress.lines import LineValidator
from malleable.progress.reporter import MAX_LINE_BYTES
from malleable.progress.spool import (
    SPOOL_MODE,
    FileProblem,
    SpoolDir,
    ensure_spool_dir,
    process_read,
    progress_file_name,
)

NOW = 1_700_000_000.0
UID = os.geteuid()


def line(step: int, **kw) -> bytes:
    doc = {"v": 1, "t": NOW - 1, "job": "7", "event": "progress", "step": step,
           "samples": step * 8, "gpus": 1, "nodes": 1, "batch": 8, "restart": 0, **kw}
    return json.dumps(doc).encode() + b"\n"


def read(spool: SpoolDir, job="7", uid=UID, offset=0, device=None, inode=None, max_bytes=1 << 20):
    return spool.read(job, uid, offset=offset, device=device, inode=inode, max_bytes=max_bytes)


def test_ensure_spool_dir_creates_sticky_1733(tmp_path):
    path = tmp_path / "var" / "spool" / "progress"
    assert ensure_spool_dir(path) == []
    assert stat.S_IMODE(os.stat(path).st_mode) == SPOOL_MODE
    os.chmod(path, 0o777)
    warnings = ensure_spool_dir(path)
    assert any("sticky" in w for w in warnings) and any("world-readable" in w for w in warnings)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        ensure_spool_dir(tmp_path / "file")


@pytest.mark.parametrize("job_id", ["", "../x", ".hidden", "a/b", "x" * 65, "a\x00b"])
def test_job_ids_that_cannot_name_a_file(job_id, tmp_path):
    with pytest.raises(ValueError):
        progress_file_name(job_id)
    assert read(SpoolDir(tmp_path), job=job_id).problem == FileProblem.BAD_NAME


def test_reads_new_bytes_and_notices_replacement_and_truncation(tmp_path):
    spool = SpoolDir(tmp_path)
    assert read(spool).exists is False
    f = tmp_path / "7.jsonl"
    f.write_bytes(line(1) + line(2))
    r1 = read(spool)
    assert r1.data == line(1) + line(2) and r1.start == 0 and not r1.reset
    end = len(r1.data)
    with open(f, "ab") as fh:
        fh.write(line(3))
    r2 = read(spool, offset=end, device=r1.device, inode=r1.inode)
    assert r2.data == line(3) and r2.start == end and not r2.mid_line
    # Truncated below the offset: start again at 0.
    f.write_bytes(line(9))
    r3 = read(spool, offset=end, device=r1.device, inode=r1.inode)
    assert r3.reset and r3.start == 0 and r3.data == line(9)
    # Replaced by another file (other inode), even a longer one: start again at 0.
    f2 = tmp_path / "new"
    f2.write_bytes(line(1) * 10)
    os.replace(f2, f)
    r4 = read(spool, offset=len(line(9)), device=r3.device, inode=r3.inode)
    assert r4.reset and r4.start == 0 and r4.inode != r3.inode
    # Nothing new.
    r5 = read(spool, offset=r4.size, device=r4.device, inode=r4.inode)
    assert r5.exists and r5.data == b"" and not r5.reset


def test_refuses_symlinks_fifos_directories_and_foreign_files(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(line(1))
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    spool = SpoolDir(spool_dir)
    (spool_dir / "7.jsonl").symlink_to(secret)
    r = read(spool)
    assert r.problem == FileProblem.SYMLINK and r.data == b""
    os.mkfifo(spool_dir / "8.jsonl")
    assert read(spool, job="8").problem == FileProblem.NOT_REGULAR  # and did not block
    (spool_dir / "9.jsonl").mkdir()
    assert read(spool, job="9").problem == FileProblem.NOT_REGULAR
    (spool_dir / "10.jsonl").write_bytes(line(1))
    r = read(spool, job="10", uid=UID + 1)
    assert r.problem == FileProblem.WRONG_OWNER and "uid" in r.detail and r.data == b""
    assert read(spool, job="10", uid=None).problem == FileProblem.WRONG_OWNER


def test_read_is_capped_and_reports_a_mid_line_start(tmp_path):
    f = tmp_path / "7.jsonl"
    f.write_bytes(b"x" * 10_000 + b"\n" + line(1))
    spool = SpoolDir(tmp_path)
    r = read(spool, max_bytes=4097)
    assert len(r.data) == 4097
    r2 = read(spool, offset=4097, device=r.device, inode=r.inode, max_bytes=100_000)
    assert r2.mid_line and r2.data.endswith(line(1))


def test_process_read_partial_last_line_waits_for_its_newline(tmp_path):
    f = tmp_path / "7.jsonl"
    whole = line(1) + line(2)
    f.write_bytes(whole + line(3)[:20])
    spool = SpoolDir(tmp_path)
    r = read(spool)
    res = process_read(r, LineValidator("7"), NOW)
    assert [x.step for x in res.records] == [1, 2] and res.offset == len(whole)
    with open(f, "ab") as fh:
        fh.write(line(3)[20:])
    r = read(spool, offset=res.offset, device=r.device, inode=r.inode)
    res = process_read(r, LineValidator("7"), NOW)
    assert [x.step for x in res.records] == [3] and res.offset == len(whole) + len(line(3))


def test_process_read_skips_an_over_long_line_once(tmp_path):
    f = tmp_path / "7.jsonl"
    f.write_bytes(line(1) + b"y" * 50_000 + b"\n" + line(2) + b"z" * 9000)
    spool = SpoolDir(tmp_path)
    v = LineValidator("7")
    offset, device, inode, steps, rejected = 0, None, None, [], {}
    for _ in range(30):
        r = read(spool, offset=offset, device=device, inode=inode, max_bytes=5000)
        res = process_read(r, v, NOW)
        steps += [x.step for x in res.records]
        for k, n in res.rejected.items():
            rejected[k] = rejected.get(k, 0) + n
        offset, device, inode = res.offset, r.device, r.inode
    assert steps == [1, 2]
    assert rejected == {"too_long": 2}   # the 50,000-byte line and the unterminated tail
    assert offset == f.stat().st_size


def test_process_read_counts_each_bad_line(tmp_path):
    f = tmp_path / "7.jsonl"
    f.write_bytes(line(1) + b"garbage\n" + line(2, metric=float("nan")) + line(0) + line(3)
                  + line(4, job="8"))
    r = read(SpoolDir(tmp_path))
    res = process_read(r, LineValidator("7"), NOW)
    assert [x.step for x in res.records] == [1, 3]
    assert dict(res.rejected) == {"not_json": 1, "nan_or_inf": 1, "decreasing_step": 1,
                                  "wrong_job": 1}
    assert res.offset == f.stat().st_size
    assert MAX_LINE_BYTES == 4096


def test_opened_spool_reads_like_read_with_one_directory_open(tmp_path, monkeypatch):
    spool = SpoolDir(tmp_path)
    for job in ("7", "8", "9"):
        with open(spool.file_path(job), "wb") as f:
            f.write(line(1, job=job) + line(2, job=job))
    one_by_one = [read(spool, job=job) for job in ("7", "8", "9", "10")]
    opens = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **kw: opens.append(a[0]) or real_open(*a, **kw))
    with spool.opened() as opened:
        many = [opened.read(job, UID, offset=0, device=None, inode=None, max_bytes=1 << 20)
                for job in ("7", "8", "9", "10")]
    assert many == one_by_one and many[3].exists is False
    # The directory once, then each file by name relative to it.
    assert opens == [spool.path, "7.jsonl", "8.jsonl", "9.jsonl", "10.jsonl"]


def test_opened_spool_that_cannot_be_opened_reports_every_read(tmp_path):
    with SpoolDir(tmp_path / "missing").opened() as opened:
        got = opened.read("7", UID, offset=0, device=None, inode=None, max_bytes=100)
        assert not got.exists and "missing" in got.detail
        bad = opened.read("../x", UID, offset=0, device=None, inode=None, max_bytes=100)
        assert bad.problem == FileProblem.BAD_NAME


def test_read_of_a_large_file_returns_every_new_byte_up_to_max_bytes(tmp_path):
    spool = SpoolDir(tmp_path)
    body = b"".join(line(i) for i in range(2000))   # > 64 KiB
    assert len(body) > 1 << 17
    with open(spool.file_path("7"), "wb") as f:
        f.write(body)
    got = read(spool)
    assert got.data == body and got.size == len(body)
    st = os.stat(spool.file_path("7"))
    later = read(spool, offset=1000, device=st.st_dev, inode=st.st_ino)
    assert later.data == body[1000:] and later.start == 1000
    assert read(spool, max_bytes=500).data == body[:500]
