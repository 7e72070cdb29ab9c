"""Configuration: defaults, TOML parsing, validation messages, environment overrides."""

from __future__ import annotations

import pytest

from malleable.config import ConfigError, load_config, parse_config


def test_defaults_without_file(tmp_path):
    cfg = parse_config({}, env={})
    assert cfg.daemon.poll_interval_s == 30.0
    assert cfg.daemon.decide_interval_s == 60.0
    assert cfg.policy.name == "default"
    assert cfg.database.url.startswith("sqlite:///")


def test_file_values_and_int_to_float(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[daemon]\ndecide_interval_s = 120\n[policy]\nname = "las"\nparams = {p = 0.5}\n')
    cfg = load_config(p, env={})
    assert cfg.daemon.decide_interval_s == 120.0 and isinstance(cfg.daemon.decide_interval_s, float)
    assert cfg.policy.name == "las" and cfg.policy.params == {"p": 0.5}
    assert cfg.source == str(p)


def test_env_overrides_database_url(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[database]\nurl = "sqlite:////tmp/a.db"\n')
    cfg = load_config(p, env={"MALLEABLE_DATABASE_URL": "sqlite:////tmp/b.db"})
    assert cfg.database.url == "sqlite:////tmp/b.db"


@pytest.mark.parametrize("section, key, written, read", [
    *[("daemon", "log_level", w, w.upper()) for w in ("info", "Info", "INFO", "warning", "Debug")],
    *[("slurm", "backend", w, w.lower()) for w in ("cli", "CLI", "Cli", "PySlurm", "AUTO")]])
def test_choices_in_any_case_are_read_in_the_field_s_case(tmp_path, section, key, written, read):
    p = tmp_path / "m.toml"
    p.write_text(f'[{section}]\n{key} = "{written}"\n')
    assert getattr(getattr(load_config(p, env={}), section), key) == read


@pytest.mark.parametrize("section, key, written, choices", [
    ("daemon", "log_level", "loud", "DEBUG, INFO, WARNING, ERROR"),
    ("slurm", "backend", "REST", "auto, cli, pyslurm")])
def test_an_unknown_choice_names_the_key_and_the_value_as_written(tmp_path, section, key,
                                                                  written, choices):
    p = tmp_path / "m.toml"
    p.write_text(f'[{section}]\n{key} = "{written}"\n')
    with pytest.raises(ConfigError, match=rf"^{section}\.{key} = '{written}': expected one of "
                                          rf"{choices}$"):
        load_config(p, env={})


@pytest.mark.parametrize("text,words", [
    ('[daemon]\npoll_interval_s = "fast"\n', ["daemon.poll_interval_s", "'fast'", "expected number"]),
    ('[daemon]\ndry_run = 1\n', ["daemon.dry_run", "expected boolean"]),
    ('[daemon]\nmax_concurrent_requeues = true\n', ["daemon.max_concurrent_requeues", "expected integer"]),
    ('[daemon]\npoll_interval_s = -5\n', ["daemon.poll_interval_s", "-5: expected a number >= 1"]),
    ('[daemon]\nlog_level = "LOUD"\n', ["daemon.log_level", "LOUD", "one of"]),
    ('[daemon]\npoll_every = 3\n', ["daemon.poll_every", "unknown key"]),
    ('[deamon]\n', ["[deamon]", "unknown section"]),
    ('daemon = 3\n', ["[daemon]", "expected a table"]),
    ('[daemon\n', ["not valid TOML"]),
])
def test_bad_values_name_key_and_value(tmp_path, text, words):
    p = tmp_path / "m.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(p, env={})
    for w in words:
        assert w in str(exc.value)


def test_missing_explicit_file_is_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", env={})
    # named by $MALLEABLE_CONFIG: the message says so
    with pytest.raises(ConfigError, match=r"^\$MALLEABLE_CONFIG=.*nope.toml: configuration file"):
        load_config(env={"MALLEABLE_CONFIG": str(tmp_path / "nope.toml")})


@pytest.mark.parametrize("path", ["", "  "])
def test_empty_explicit_path_names_the_option(path):
    # Path("") is ".", the working directory: "Is a directory" named neither option nor value.
    with pytest.raises(ConfigError, match=r"--config '\s*': empty path; give a TOML file"):
        load_config(path, env={})


def test_missing_default_file_gives_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr("malleable.config.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    assert load_config(env={}).source == "<defaults>"


def test_empty_config_env_counts_as_unset(tmp_path, monkeypatch):
    monkeypatch.setattr("malleable.config.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    assert load_config(env={"MALLEABLE_CONFIG": ""}).source == "<defaults>"


@pytest.mark.parametrize("key", ["poll_interval_s", "ingest_interval_s", "decide_interval_s"])
def test_cycle_intervals_have_a_one_second_floor(tmp_path, key):
    p = tmp_path / "m.toml"
    p.write_text(f"[daemon]\n{key} = 0.2\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert f"daemon.{key} = 0.2: expected a number >= 1 and <= 86400" in str(exc.value)
    p.write_text(f"[daemon]\n{key} = 1\n")
    assert getattr(load_config(p).daemon, key) == 1.0


def test_a_config_nested_too_deeply_is_a_config_error_not_a_recursion_error(tmp_path):
    """tomllib recurses once per level: 20,000 nested arrays raised RecursionError out of
    the daemon's start and every command's configuration load (a traceback, exit 1)."""
    p = tmp_path / "deep.toml"
    p.write_text("a = " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value) == f"{p}: TOML nested too deeply to read"


def test_a_nul_byte_in_the_database_url_is_a_config_error_naming_the_key(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[database]\nurl = "sqlite:////tmp/a\\u0000b.db"\n')
    with pytest.raises(ConfigError, match=r"^database\.url = 'sqlite:////tmp/a\\x00b\.db': "
                       r"contains a NUL byte"):
        load_config(p)
