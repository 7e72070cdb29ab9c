"""Bad configuration values are refused when the file is loaded, by every command, with one
line naming the key and the value (and the bounds): nan/inf, out-of-range intervals and
counts, relative paths, unsupported database URLs, malformed metrics addresses, partitions
that are not names. The same file goes through `parse_config`/`load_config`, ``malleable
config show`` (in process) and ``malleable daemon`` (a subprocess, as systemd runs it), and
through ``Service.reload`` (SIGHUP), which must keep the old settings and the daemon alive.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
import typing
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.config import ConfigError, load_config, parse_config, sections
from malleable.ops.config import toml_value

MALLEABLE = Path(sys.executable).parent / "malleable"

# (section, key, value, what the one line must contain): every finding of the new-user trial.
FINDINGS = [
    ("daemon", "lease_timeout_s", math.inf,
     "daemon.lease_timeout_s = inf: expected a finite number >= 3 and <= 86400"),
    ("daemon", "poll_interval_s", math.nan,
     "daemon.poll_interval_s = nan: expected a finite number >= 1 and <= 86400"),
    ("daemon", "poll_interval_s", -math.inf, "daemon.poll_interval_s = -inf: expected a finite"),
    ("daemon", "poll_interval_s", 1e300,
     "daemon.poll_interval_s = 1e+300: expected a number >= 1 and <= 86400"),
    ("daemon", "decide_interval_s", 1e20,
     "daemon.decide_interval_s = 1e+20: expected a number >= 1 and <= 86400"),
    ("daemon", "housekeeping_interval_s", 1e12,
     "daemon.housekeeping_interval_s = 1000000000000.0: expected a number > 0 and <= 604800"),
    ("daemon", "poll_interval_s", 0, "daemon.poll_interval_s = 0: expected a number >= 1"),
    ("slurm", "command_timeout_s", 0,
     "slurm.command_timeout_s = 0: expected a number > 0 and <= 3600"),
    ("metrics", "address", "localhost", "metrics.address = 'localhost': expected host:port"),
    ("metrics", "address", "127.0.0.1:99999",
     "metrics.address = '127.0.0.1:99999': expected host:port"),
    # (passed every check; only the daemon's bind failed, after it took the lease)
    ("metrics", "address", "bad host:9464",
     "metrics.address = 'bad host:9464': expected host:port"),
    ("database", "url", "mysql://x",
     "database.url = 'mysql://x': database backend 'mysql' is not supported"),
    ("database", "url", "sqlite:///relative.db",
     "database.url = 'sqlite:///relative.db': expected the SQLite file as an absolute path"),
    ("progress", "spool_dir", "relative/dir",
     "progress.spool_dir = 'relative/dir': expected an absolute path"),
    ("slurm", "partitions", [1, 2],
     "slurm.partitions = [1, 2]: expected a list of partition names (strings)"),
    ("retention", "progress_max_per_job", 0,
     "retention.progress_max_per_job = 0: expected an integer >= 1"),
]
IDS = [f"{s}.{k}={v!r}" for s, k, v, _ in FINDINGS]


def _toml(doc: dict) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in sec.items())
                   for name, sec in doc.items())


def write(tmp_path: Path, section: str | None = None, key: str = "", value: object = None,
          ) -> Path:
    """A configuration with a tmp database and spool, and ``[section] key = value``."""
    (tmp_path / "spool").mkdir(exist_ok=True)
    doc: dict[str, dict] = {"database": {"url": f"sqlite:///{tmp_path}/m.db"},
                            "progress": {"spool_dir": f"{tmp_path}/spool"}}
    if section is not None:
        doc.setdefault(section, {})[key] = value
    p = tmp_path / "m.toml"
    p.write_text(_toml(doc))
    return p


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("MALLEABLE_CONFIG", "MALLEABLE_DATABASE_URL", "MALLEABLE_TEST_CRASH_AT")}


# ---------------------------------------------------------------- the loader


@pytest.mark.parametrize("section, key, value, message", FINDINGS, ids=IDS)
def test_parse_config_refuses_each_finding_in_one_line(section, key, value, message):
    with pytest.raises(ConfigError) as exc:
        parse_config({section: {key: value}}, env={})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("section, key, value, message", FINDINGS, ids=IDS)
def test_load_config_refuses_each_finding_from_a_toml_file(tmp_path, section, key, value,
                                                           message):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, section, key, value), env={})
    assert message in str(exc.value)


def _numeric_fields() -> list[tuple[str, str, dataclasses.Field, type]]:
    out = []
    for name, cls in sections().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] in (int, float):
                out.append((name, f.name, f, hints[f.name]))
    return out


NUMERIC = _numeric_fields()
FLOATS = [(s, k) for s, k, _, tp in NUMERIC if tp is float]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("section, key", FLOATS, ids=[f"{s}.{k}" for s, k in FLOATS])
def test_no_float_setting_accepts_nan_or_inf(section, key, bad):
    """No setting documents inf as meaningful, so none accepts it."""
    with pytest.raises(ConfigError, match=f"^{section}.{key} = {bad!r}: expected a finite number"):
        parse_config({section: {key: bad}}, env={})


@pytest.mark.parametrize("section, key, f, tp", NUMERIC, ids=[f"{s}.{k}" for s, k, _, _ in NUMERIC])
def test_every_number_has_documented_bounds_and_its_upper_bound_is_inclusive(section, key, f, tp):
    md = f.metadata
    assert "le" in md and ("gt" in md or "ge" in md), f"{section}.{key} has no bounds"
    assert f"<= {int(md['le'])}" in md["doc"]        # the bound is in the help text (docs)
    top = tp(md["le"])
    assert getattr(getattr(parse_config({section: {key: top}}, env={}), section), key) == top
    with pytest.raises(ConfigError, match=f"^{section}.{key} = .*: expected an? .* <= "):
        parse_config({section: {key: tp(md["le"]) * 2}}, env={})
    low = md.get("gt", md.get("ge"))
    too_low = tp(low) if "gt" in md else tp(low) - 1
    with pytest.raises(ConfigError, match=f"^{section}.{key} = "):
        parse_config({section: {key: too_low}}, env={})


@pytest.mark.parametrize("section, key, value", [
    ("database", "url", "sqlite:////var/lib/malleable/x.db"),
    ("database", "url", "postgresql+psycopg://u:pw@db.example.org/malleable"),
    ("metrics", "address", ""),                             # off
    ("metrics", "address", ":9464"),
    ("metrics", "address", "[::1]:9464"),
    ("metrics", "address", "127.0.0.1:65535"),
    ("slurm", "partitions", []),
    ("slurm", "partitions", ["gpu", "a100"]),
    ("policy", "cooldown_s", 0),                            # 0: no cool-down (documented)
    ("policy", "min_gain", 0),
    ("slurm", "max_retries", 0),                            # 0: no retry (documented)
    ("daemon", "poll_interval_s", 1.5),
])
def test_good_values_are_still_accepted(section, key, value):
    cfg = parse_config({section: {key: value}}, env={})
    assert getattr(getattr(cfg, section), key) == value


def test_a_bad_database_url_from_the_environment_gets_the_same_check():
    with pytest.raises(ConfigError) as exc:
        parse_config({}, env={"MALLEABLE_DATABASE_URL": "sqlite:///relative.db"})
    assert str(exc.value).startswith("database.url ($MALLEABLE_DATABASE_URL) = "
                                     "'sqlite:///relative.db': expected the SQLite file as an "
                                     "absolute path")
    with pytest.raises(ConfigError, match="backend 'mysql' is not supported"):
        parse_config({}, env={"MALLEABLE_DATABASE_URL": "mysql://x"})


def test_a_refused_database_url_never_shows_its_password():
    for url in ("mysql://u:s3cret@h/db", "sqlite://u:s3cret@h/relative.db",
                "postgresql://u:s3cret@h:port/db"):
        with pytest.raises(ConfigError) as exc:
            parse_config({"database": {"url": url}}, env={})
        assert "s3cret" not in str(exc.value) and "database.url = " in str(exc.value)


# ---------------------------------------------------------------- the commands


@pytest.mark.parametrize("section, key, value, message", FINDINGS, ids=IDS)
def test_config_show_exits_2_with_one_line(tmp_path, monkeypatch, section, key, value, message):
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["config", "show", "--config",
                                    str(write(tmp_path, section, key, value))],
                             prog_name="malleable")
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("malleable config show: error: "), res.stderr
    assert message in lines[0]


@pytest.mark.parametrize("key, value, message", [
    ("name", "nosuch", "policy.name='nosuch', policy.params={}: unknown policy 'nosuch'"),
    ("params", {"risk": -1}, "policy.params={'risk': -1}: policy pollux: unknown parameter 'risk'"),
])
def test_config_show_refuses_a_policy_the_daemon_would_refuse(tmp_path, monkeypatch, key, value,
                                                             message):
    """`config show` is how an admin checks a file: a [policy] that cannot be built stops a
    daemon at start (exit 2), so it is refused here too, in one line."""
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    res = CliRunner().invoke(main, ["config", "show", "--config",
                                    str(write(tmp_path, "policy", key, value))],
                             prog_name="malleable")
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("malleable config show: error: "), res.stderr
    assert message in lines[0], lines[0]


def test_config_show_refuses_a_bad_database_url_option_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    cfg = str(write(tmp_path))
    res = CliRunner().invoke(main, ["config", "show", "--config", cfg, "--database-url",
                                    "mysql://x"], prog_name="malleable")
    assert res.exit_code == 2 and "--database-url = 'mysql://x': database backend" in res.stderr
    monkeypatch.setenv("MALLEABLE_DATABASE_URL", "sqlite:///rel.db")
    res = CliRunner().invoke(main, ["config", "show", "--config", cfg], prog_name="malleable")
    assert res.exit_code == 2 and "($MALLEABLE_DATABASE_URL) = 'sqlite:///rel.db'" in res.stderr


@pytest.mark.parametrize("section, key, value, message", FINDINGS, ids=IDS)
def test_daemon_start_exits_2_with_one_line_and_touches_nothing(tmp_path, section, key, value,
                                                                message):
    config = write(tmp_path, section, key, value)
    proc = subprocess.run([str(MALLEABLE), "daemon", "--config", str(config)],
                          env=_clean_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("malleable daemon: error: "), proc.stderr
    assert message in lines[0]
    # refused before anything was created (a relative path would land in the cwd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.toml", "spool"]


# ---------------------------------------------------------------- SIGHUP


@pytest.fixture
def service(tmp_path, monkeypatch):
    from malleable.daemon.service import Service, ServiceOptions

    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    path = write(tmp_path)
    svc = Service(load_config(str(path)), ServiceOptions(config_path=str(path)))
    svc._schedule()
    yield svc
    svc.engine.dispose()


def _interval(svc, job_id: str) -> timedelta:
    return next(j for j in svc.scheduler.get_jobs() if j.id == job_id).trigger.interval


@pytest.mark.parametrize("key, value", [("poll_interval_s", math.nan),
                                        ("lease_timeout_s", math.inf),
                                        ("decide_interval_s", 1e20)])
def test_sighup_with_a_bad_value_keeps_the_old_config_and_the_service(service, tmp_path, caplog,
                                                                      key, value):
    old = service.config
    write(tmp_path, "daemon", key, value)
    with caplog.at_level(logging.ERROR, logger="malleable.daemon.service"):
        service.reload()                     # must not raise: that killed the daemon
    assert service.config is old and service.daemon.config is old
    assert _interval(service, "poll") == timedelta(seconds=30)
    assert _interval(service, "decide") == timedelta(seconds=60)
    assert any("reload refused" in r.getMessage() and f"daemon.{key}" in r.getMessage()
               for r in caplog.records)
    write(tmp_path, "daemon", "poll_interval_s", 10)      # the service still reloads
    service.reload()
    assert service.config.daemon.poll_interval_s == 10.0
    assert _interval(service, "poll") == timedelta(seconds=10)


def test_sighup_that_fails_while_applying_keeps_the_old_config_and_timers(service, tmp_path,
                                                                          monkeypatch, caplog):
    """Anything failing after the file was accepted (here: the scheduler) is refused too,
    and timers already rescheduled go back to their old intervals."""
    old = service.config
    real = service.scheduler.reschedule_job
    calls = []

    def reschedule(job_id, **kw):
        calls.append((job_id, kw["seconds"]))
        if job_id == "decide":
            raise RuntimeError("scheduler says no")
        return real(job_id, **kw)

    monkeypatch.setattr(service.scheduler, "reschedule_job", reschedule)
    p = write(tmp_path)
    p.write_text(p.read_text() + "[daemon]\npoll_interval_s = 10\ndecide_interval_s = 20\n")
    with caplog.at_level(logging.ERROR, logger="malleable.daemon.service"):
        service.reload()
    assert service.config is old and service.daemon.config is old
    assert calls == [("poll", 10.0), ("decide", 20.0), ("poll", 30.0)]
    assert _interval(service, "poll") == timedelta(seconds=30)
    assert any("reload refused" in r.getMessage() and "scheduler says no" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("url, message", [
    # (a tester: `config show` took an in-memory store every other command refused)
    ("sqlite://", "an in-memory SQLite database: the state would vanish at exit"),
    ("sqlite:///:memory:", "an in-memory SQLite database: the state would vanish at exit"),
    # (a C1 character or a byte that is not UTF-8 reached the file name; a NUL in the
    # password dropped the port of the connection)
    ("sqlite:////tmp/x%C2%85y.db", "the database name holds the control character "
     "'\\x85' (percent-decoded)"),
    ("sqlite:////tmp/x%FFy.db", "the database name holds U+FFFD, what percent-encoded bytes "
     "that are not UTF-8 decode to"),
    ("postgresql://u:p%00x@localhost:1/db", "the password holds the control character "
     "'\\x00' (percent-decoded)"),
    ("postgresql://u%00z:p@127.0.0.2:1/db", "the user holds the control character '\\x00'"),
])
def test_database_urls_that_cannot_be_a_state_store_are_refused(url, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"database": {"url": url}}, env={})
    assert str(err.value).startswith("database.url = ") and message in str(err.value)
    assert "p%00x" not in str(err.value)     # (the password stays hidden)
