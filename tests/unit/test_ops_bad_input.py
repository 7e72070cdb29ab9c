"""Bad input a new user found gives one error line naming the field and the value (exit 2),
never a traceback: huge integers for --limit and --gpus-per-node, a huge Gres count in
slurm.conf, a NUL byte in the database URL, a settings row that is not JSON (and
`policy reset` clearing it), `report`'s empty --spool and non-numeric job id, `plan`
reading the database before it asks Slurm, and `db current` only reading.

The commands run in process through click's test runner on the real ``malleable``
group, over a real SQLite store filled by `tests.unit.ops_store`.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.db import store
from malleable.db.engine import make_engine, session_factory
from malleable.slurm_conf.gres import MAX_COUNT, GresSpecError, parse_count, parse_gres
from tests.unit.ops_store import build_store, write_config

ROOT = Path(__file__).resolve().parents[2]
HUGE = "9223372036854775808"          # 2**63: past SQLite's and NumPy's int64


@pytest.fixture
def built(tmp_path):
    """The store of `tests.unit.ops_store`, in an SQLite file."""
    return build_store(tmp_path / "m.db")


@pytest.fixture
def cfg(tmp_path, built):
    """A configuration file naming that store."""
    return write_config(tmp_path / "malleable.toml", built.url)


@pytest.fixture
def run(cfg, monkeypatch):
    """Run ``malleable ARGS --config CFG`` in process; returns click's Result."""
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")

    def _run(*args: str, config: bool = True):
        argv = [*args, "--config", str(cfg)] if config else list(args)
        return CliRunner().invoke(main, argv, prog_name="malleable")
    return _run


def one_line_error(result, code: int, *needles: str) -> str:
    """Exit ``code`` with one line on stderr holding every needle, and no traceback."""
    assert result.exit_code == code, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in err, err
    return err


def set_raw_setting(built, key: str, raw) -> None:
    """Write ``raw`` into the settings row ``key`` as sqlite3 would by hand (no JSON)."""
    conn = sqlite3.connect(str(built.path))
    try:
        conn.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) "
                     "VALUES (?, ?, 0)", (key, raw))
        conn.commit()
    finally:
        conn.close()


# ---------------------------------------------------------------- 1. huge integers


@pytest.mark.parametrize("args,option", [
    (("actions", "--limit", HUGE), "--limit"),
    (("status", "--gpus-per-node", HUGE), "--gpus-per-node"),
    (("status", "--gpus-per-node", "99999999999999999999999"), "--gpus-per-node"),
    (("job", "show", "101", "--gpus-per-node", HUGE), "--gpus-per-node"),
])
def test_a_huge_limit_or_gpus_per_node_is_exit_2_naming_the_option(run, args, option):
    # --limit 2**63 was SQLite's OverflowError, --gpus-per-node 2**63 NumPy's: tracebacks.
    one_line_error(run(*args), 2, f"'{option}'", args[-1])


def test_limit_and_gpus_per_node_have_sane_bounds(run):
    one_line_error(run("actions", "--limit", "1000001"), 2, "'--limit'", "1000001",
                   "1<=x<=1000000")
    one_line_error(run("status", "--gpus-per-node", "1025"), 2, "'--gpus-per-node'", "1025",
                   "1<=x<=1024")
    one_line_error(run("job", "show", "101", "--gpus-per-node", "1025"), 2,
                   "'--gpus-per-node'", "1<=x<=1024")
    assert run("actions", "--limit", "1000000").exit_code == 0
    assert run("status", "--gpus-per-node", "1024").exit_code == 0
    assert run("job", "show", "101", "--gpus-per-node", "1024").exit_code == 0


# ---------------------------------------------------------------- 2. Gres in slurm.conf


def test_a_huge_gres_count_in_slurm_conf_is_exit_2_naming_the_file_and_line(tmp_path, run,
                                                                           monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nNodeName=n1 Gres=gpu:99999999999999999999 CPUs=4\n"
                    "PartitionName=p Nodes=ALL Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    for args in (("status",), ("job", "show", "101")):
        one_line_error(run(*args), 2, f"{conf}:2: node n1: Gres=gpu:99999999999999999999",
                       "too large a count", "--gpus-per-node")
        # --gpus-per-node skips slurm.conf
        assert run(*args, "--gpus-per-node", "4").exit_code == 0


def test_gres_counts_past_2_63_are_refused_by_the_parser():
    assert parse_count(str(MAX_COUNT)) == MAX_COUNT == 2 ** 63 - 1
    assert parse_count("0" * 30 + "4") == 4 and parse_count("8P") == 8 * 1024 ** 5
    for value in (str(MAX_COUNT + 1), "8192P", "9" * 5000):   # 5000 digits: past int()'s limit
        with pytest.raises(GresSpecError, match="too large a count"):
            parse_count(value)
    with pytest.raises(GresSpecError, match=r"^Gres=gpu:a:99999999999999999999: in "):
        parse_gres("gpu:a:99999999999999999999")


# ---------------------------------------------------------------- 3. NUL in the URL


def test_a_nul_byte_in_the_database_url_is_exit_2_naming_where_it_came_from(tmp_path, run,
                                                                             built):
    url = built.url + "\x00x"
    for args in (("status",), ("actions",), ("plan",), ("db", "current"), ("db", "upgrade")):
        one_line_error(run(*args, "--database-url", url), 2,
                       f"--database-url = '{built.url}\\x00x': contains a NUL byte")
    nul = write_config(tmp_path / "nul.toml", url)
    for args in (("status",), ("db", "current")):
        one_line_error(run(*args, "--config", str(nul), config=False), 2,
                       "database.url = ", "\\x00x': contains a NUL byte")
    assert not list(tmp_path.glob("m.db?*"))    # nothing created beside it


# ---------------------------------------------------------------- 4. settings not JSON


def test_a_policy_row_that_is_not_json_is_named_and_policy_reset_clears_it(run, built):
    assert run("policy", "set", "equi").exit_code == 0
    set_raw_setting(built, store.POLICY_PARAMS_KEY, "{bad")
    for args in (("status",), ("status", "--json"), ("policy", "show")):
        one_line_error(run(*args), 2, "settings row 'policy.params' holds '{bad', which is "
                       "not valid JSON", "`malleable policy reset`")
    r = run("policy", "reset")
    assert r.exit_code == 0, r.output
    assert "policy reset to the configuration's" in r.stdout
    assert run("status").exit_code == 0 and run("policy", "show").exit_code == 0
    # `policy set` overwrites one too; and a value of the wrong kind is named as well
    set_raw_setting(built, store.POLICY_NAME_KEY, "not json")
    assert run("policy", "set", "hesrpt").exit_code == 0
    set_raw_setting(built, store.POLICY_PARAMS_KEY, "[1, 2]")
    one_line_error(run("status"), 2, "'policy.params' holds '[1, 2]', which is not a JSON "
                   "object")
    assert run("policy", "reset").exit_code == 0 and run("status").exit_code == 0


def test_a_pause_or_poll_row_that_is_not_json_is_named(run, built):
    set_raw_setting(built, store.PAUSED_KEY, "tru")
    one_line_error(run("status"), 2, "settings row 'paused' holds 'tru'", "`malleable resume`")
    one_line_error(run("plan"), 2, "settings row 'paused' holds 'tru'")
    r = run("resume")
    assert r.exit_code == 0 and r.stdout.startswith("resumed"), r.output
    set_raw_setting(built, store.LAST_POLL_KEY, 12)          # an INTEGER, not JSON text
    one_line_error(run("status"), 2, "settings row 'daemon.last_poll' holds '12'")
    set_raw_setting(built, store.LAST_POLL_KEY, '"noon"')   # JSON, but not a time
    one_line_error(run("status"), 2, "'daemon.last_poll' holds '\"noon\"', which is not an "
                   "ISO 8601 time", "the daemon rewrites it")


def test_corrupt_setting_and_clear_policy_read_no_json(built):
    engine = make_engine(built.url, create=False)
    try:
        with session_factory(engine)() as s, s.begin():
            store.set_policy(s, "equi", {})
            assert store.corrupt_setting(s, [store.POLICY_NAME_KEY, "absent"]) is None
        set_raw_setting(built, store.POLICY_NAME_KEY, "{")
        with session_factory(engine)() as s, s.begin():
            assert store.corrupt_setting(s, [store.POLICY_NAME_KEY]) == (store.POLICY_NAME_KEY,
                                                                         "{")
            assert store.clear_policy(s) is True
        with session_factory(engine)() as s:
            assert store.get_setting(s, store.POLICY_NAME_KEY) is None
            assert store.clear_policy(s) is False
    finally:
        engine.dispose()


# ---------------------------------------------------------------- 5. report


def report(args, env):
    """Run ``malleable report ARGS`` in process with the environment ``env``."""
    return CliRunner().invoke(main, ["report", *args], env=env, prog_name="malleable")


def refused(res, *needles: str) -> None:
    """Exit 2 with one line ``malleable report: error: ...`` holding every needle."""
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.exception
    (line,) = res.stderr.splitlines()
    assert line.startswith("malleable report: error: "), line
    for n in needles:
        assert n in line, line


def test_report_refuses_an_empty_spool_and_a_job_id_slurm_would_not_give(tmp_path):
    env = {"SLURM_JOB_ID": "8", "SLURM_JOBID": "", "SLURM_ARRAY_JOB_ID": "",
           "SLURM_ARRAY_TASK_ID": "", "MALLEABLE_SPOOL": str(tmp_path),
           "MALLEABLE_BATCH_SIZE": ""}
    refused(report(["started", "--batch", "4", "--spool", ""], env), "--spool=''", "empty")
    for job in ("abc", "8; rm -rf /", "12_3", " 8"):
        refused(report(["started", "--batch", "4"], {**env, "SLURM_JOB_ID": job}),
                f"SLURM_JOB_ID={job!r}: expected a Slurm job id")
    refused(report(["started", "--batch", "4"], {**env, "SLURM_ARRAY_JOB_ID": "x",
                                                 "SLURM_ARRAY_TASK_ID": "3"}),
            "SLURM_ARRAY_JOB_ID='x', SLURM_ARRAY_TASK_ID='3'")
    refused(report(["started", "--batch", "4", "--job", ""], env), "--job='': expected")
    assert list(tmp_path.iterdir()) == []           # nothing written
    # --job wins over a bad environment; a good one still works
    assert report(["started", "--batch", "4", "--job", "9"],
                  {**env, "SLURM_JOB_ID": "abc"}).exit_code == 0
    assert report(["started", "--batch", "4"], env).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["8.jsonl", "9.jsonl"]


# ---------------------------------------------------------------- 6. plan


def test_plan_reads_the_database_before_it_asks_slurm(run, built, tmp_path, monkeypatch):
    asked: list[object] = []

    def connect_once(config):
        """Stands for `malleable.slurm.connect_once`: records the call, asks nothing."""
        asked.append(config)
        raise AssertionError("plan asked Slurm")

    monkeypatch.setattr("malleable.ops.plan.connect_once", connect_once)
    one_line_error(run("plan", "--database-url", f"sqlite:///{tmp_path}/nope.db"), 2,
                   "nope.db: no such database file")
    assert run("policy", "set", "equi").exit_code == 0
    set_raw_setting(built, store.POLICY_PARAMS_KEY, "{bad")
    one_line_error(run("plan"), 2, "settings row 'policy.params'")
    assert asked == []


# ---------------------------------------------------------------- 7. db current


def test_db_current_only_reads(tmp_path, built):
    # A store in rollback-journal mode: opening it for writing switched it to WAL (a
    # write, which also creates the -wal and -shm files).
    conn = sqlite3.connect(str(built.path))
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    conn.close()
    before = built.path.read_bytes()
    r = CliRunner().invoke(main, ["db", "current", "--database-url", built.url],
                           prog_name="malleable")
    assert r.exit_code == 0 and r.stdout.endswith("(head)\n"), r.output
    assert built.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"]


def test_db_current_reads_a_store_without_write_permission(tmp_path, built):
    # (root ignores the modes; the run as another user below tests them for real)
    d = Path(tempfile.mkdtemp(prefix="malleable-ro-"))
    try:
        db = d / "m.db"
        shutil.copy(built.path, db)
        db.chmod(0o444)
        d.chmod(0o555)
        r = CliRunner().invoke(main, ["db", "current", "--database-url", f"sqlite:///{db}"],
                               prog_name="malleable")
        assert r.exit_code == 0 and r.stdout.startswith(f"{db}: ") and \
            r.stdout.endswith(" (head)\n"), r.output
        if os.geteuid() == 0 and shutil.which("setpriv"):
            d.chmod(0o755)       # nobody may enter, read the 0444 file, write nothing
            proc = subprocess.run(
                ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                 sys.executable, "-m", "malleable", "db", "current", "--database-url",
                 f"sqlite:///{db}"], capture_output=True, text=True, timeout=60, cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
                     "PYTHONPATH": str(ROOT)})
            assert proc.returncode == 0 and proc.stdout.endswith("(head)\n"), proc.stderr
        assert sorted(p.name for p in d.iterdir()) == ["m.db"]
        assert stat.S_IMODE(db.stat().st_mode) == 0o444
    finally:
        d.chmod(0o755)
        shutil.rmtree(d, ignore_errors=True)
