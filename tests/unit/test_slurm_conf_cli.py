"""``malleable conf check`` / ``conf snippet`` at the command line: output, JSON, exit codes.

Files only (``--no-controller``); the command against the real harness and its
controller is in tests/integration/test_conf_check.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.slurm_conf import SCHEMA
from tests.unit.test_slurm_conf_checks import GOOD, GOOD_GRES


def write(tmp_path, slurm=GOOD, gres=GOOD_GRES):
    (tmp_path / "slurm.conf").write_text(slurm)
    if gres is not None:
        (tmp_path / "gres.conf").write_text(gres)
    return str(tmp_path / "slurm.conf")


@pytest.fixture(autouse=True)
def empty_malleable_config(tmp_path_factory, monkeypatch):
    """All defaults, whatever /etc/malleable holds; no inherited SLURM_CONF."""
    path = tmp_path_factory.mktemp("cfg") / "malleable.toml"
    path.write_text("")
    monkeypatch.setenv("MALLEABLE_CONFIG", str(path))
    monkeypatch.delenv("SLURM_CONF", raising=False)


def invoke(*args, env=None):
    return CliRunner().invoke(main, ["conf", *args], env=env, prog_name="malleable")


def test_conf_is_registered():
    result = CliRunner().invoke(main, ["--help"])
    assert "conf" in result.output
    result = CliRunner().invoke(main, ["conf", "--help"])
    assert result.exit_code == 0 and "check" in result.output and "snippet" in result.output


def test_good_config_passes_with_inventory(tmp_path):
    result = invoke("check", "--slurm-conf", write(tmp_path), "--no-controller")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "GPU inventory: 16 GPUs on 4 of 4 nodes" in out
    assert "node[1-4]  4" in out and "4 files" in out
    assert "gpu (default)  UP" in out
    assert "controller: not asked (--no-controller)" in out
    assert out.rstrip().endswith("PASS: no errors (0 warning(s), 0 info(s))")


def test_error_findings_print_location_and_fix_and_exit_1(tmp_path):
    path = write(tmp_path, GOOD.replace("SelectType=select/cons_tres", "SelectType=select/linear"))
    result = invoke("check", "--slurm-conf", path, "--no-controller")
    assert result.exit_code == 1
    assert f"ERROR [select-type] {path}:4" in result.output
    assert "fix: SelectType=select/cons_tres" in result.output
    assert "FAIL: 1 error(s)" in result.output


def test_warnings_exit_0_unless_strict(tmp_path):
    path = write(tmp_path, GOOD.replace("MinJobAge=300", "MinJobAge=30"))
    result = invoke("check", "--slurm-conf", path, "--no-controller")
    assert result.exit_code == 0
    assert f"WARNING [min-job-age] {path}:8" in result.output
    assert "fix: MinJobAge=300" in result.output
    assert invoke("check", "--slurm-conf", path, "--no-controller", "--strict").exit_code == 1


def test_job_requeue_0_is_an_error(tmp_path):
    path = write(tmp_path, GOOD.replace("JobRequeue=1", "JobRequeue=0"))
    result = invoke("check", "--slurm-conf", path, "--no-controller")
    assert result.exit_code == 1
    assert f"ERROR [job-requeue] {path}:7" in result.output
    assert "`malleable submit` adds --requeue" in " ".join(result.output.split())
    assert "fix: JobRequeue=1" in result.output


def test_default_path_comes_from_slurm_conf_env(tmp_path):
    path = write(tmp_path)
    result = invoke("check", "--no-controller", env={"SLURM_CONF": path})
    assert result.exit_code == 0 and f"slurm.conf: {path}" in result.output
    result = invoke("check", "--no-controller", env={"SLURM_CONF": str(tmp_path / "nope")})
    assert result.exit_code == 2
    assert result.output == \
        f"malleable conf check: error: $SLURM_CONF {tmp_path / 'nope'}: no such file\n"


def test_config_errors_name_the_subcommand_and_the_option_once(tmp_path):
    result = invoke("check", "--no-controller", "--config", "")
    assert result.exit_code == 2
    assert result.output.startswith("malleable conf check: error: --config '': empty path")
    result = invoke("check", "--no-controller", "--config", str(tmp_path / "none.toml"))
    assert result.exit_code == 2 and result.output == \
        f"malleable conf check: error: --config: {tmp_path / 'none.toml'}: configuration " \
        f"file not found\n"


@pytest.mark.parametrize("args,words", [
    (["--slurm-conf", "{tmp}/missing.conf"], ["--slurm-conf", "missing.conf", "no such file"]),
    (["--slurm-conf", "{tmp}"], ["is a directory"]),
    (["--slurm-conf", "{tmp}/slurm.conf", "--gres-conf", "{tmp}/nope"], ["--gres-conf", "nope"]),
])
def test_bad_input_is_exit_2_with_one_line(tmp_path, args, words):
    write(tmp_path)
    result = invoke("check", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    for w in words:
        assert w in result.output


def test_bad_malleable_config_is_exit_2(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text("[daemon]\npoll_interval_s = 'fast'\n")
    result = CliRunner().invoke(main, ["conf", "--config", str(bad), "check", "--slurm-conf",
                                       write(tmp_path), "--no-controller"])
    assert result.exit_code == 2 and "daemon.poll_interval_s" in result.output
    assert result.output.count("\n") == 1


def test_malleable_config_sets_the_poll_interval(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text("[daemon]\npoll_interval_s = 600\n")
    result = CliRunner().invoke(main, ["conf", "--config", str(cfg), "check", "--slurm-conf",
                                       write(tmp_path), "--no-controller"])
    assert result.exit_code == 0
    assert "WARNING [min-job-age]" in result.output and "MinJobAge=1200" in result.output
    # The same after the subcommand, as every other command takes --config.
    result = CliRunner().invoke(main, ["conf", "check", "--config", str(cfg), "--slurm-conf",
                                       write(tmp_path), "--no-controller"])
    assert result.exit_code == 0 and "MinJobAge=1200" in result.output
    result = CliRunner().invoke(main, ["conf", "snippet", "--config", str(cfg)])
    assert result.exit_code == 0 and "MinJobAge=1200" in result.output


# The documented JSON schema (docs/conf-check.md), as key -> type(s).
TOP = {"schema": str, "ok": bool, "slurm_conf": str, "gres_conf": str, "gres_conf_found": bool,
       "files": list, "controller": dict, "inventory": dict, "checks": list, "findings": list,
       "summary": dict}
CONTROLLER = {"queried": bool, "answered": bool, "error": (str, type(None)),
              "version": (str, type(None)), "status": list, "slurm_conf": (str, type(None)),
              "hash": (str, type(None)), "differences": list}
INVENTORY = {"total_gpus": int, "gpu_nodes": int, "nodes": list, "partitions": list}
NODE = {"name": str, "gpus": int, "gpu_types": list, "gres": list, "partitions": list,
        "gres_conf_gpus": (int, type(None)), "device_files": list,
        "autodetect": (str, type(None)), "state": (str, type(None)), "path": str,
        "line": (int, type(None))}
PARTITION = {"name": str, "nodes": list, "default": bool, "state": str, "gpu_nodes": int,
             "gpus": int, "path": str, "line": (int, type(None))}
CHECK = {"check": str, "title": str, "status": str, "summary": str}
FINDING = {"severity": str, "check": str, "path": str, "line": (int, type(None)),
           "message": str, "fix": (str, type(None))}
SUMMARY = {"errors": int, "warnings": int, "infos": int}


def conforms(obj: dict, spec: dict) -> None:
    assert set(obj) == set(spec), set(obj) ^ set(spec)
    for key, tp in spec.items():
        assert isinstance(obj[key], tp), (key, obj[key])


def assert_schema(doc: dict) -> None:
    conforms(doc, TOP)
    assert doc["schema"] == SCHEMA
    conforms(doc["controller"], CONTROLLER)
    conforms(doc["inventory"], INVENTORY)
    for n in doc["inventory"]["nodes"]:
        conforms(n, NODE)
        for t in n["gpu_types"]:
            conforms(t, {"type": (str, type(None)), "count": int})
    for p in doc["inventory"]["partitions"]:
        conforms(p, PARTITION)
    for c in doc["checks"]:
        conforms(c, CHECK)
        assert c["status"] in {"ok", "info", "warning", "error", "skipped"}
    for f in doc["findings"] + doc["controller"]["differences"]:
        conforms(f, FINDING)
        assert f["severity"] in {"error", "warning", "info"}
    conforms(doc["summary"], SUMMARY)


def test_json_good(tmp_path):
    result = invoke("check", "--slurm-conf", write(tmp_path), "--no-controller", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert_schema(doc)
    assert doc["ok"] is True and doc["findings"] == []
    assert doc["inventory"]["total_gpus"] == 16
    assert doc["inventory"]["nodes"][0]["device_files"][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert doc["controller"]["queried"] is False
    assert doc["summary"] == {"errors": 0, "warnings": 0, "infos": 0}


def test_json_broken_config_lists_each_finding_with_line_and_fix(tmp_path):
    text = (GOOD.replace("SelectType=select/cons_tres", "SelectType=select/linear")
            .replace("JobRequeue=1", "JobRequeue=0")
            .replace("MinJobAge=300", "MinJobAge 300"))
    path = write(tmp_path, text, gres="NodeName=node[1-4] Name=gpu Count=4\n")
    result = invoke("check", "--slurm-conf", path, "--no-controller", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert_schema(doc)
    got = {(f["check"], f["severity"], f["path"].rsplit("/", 1)[-1], f["line"])
           for f in doc["findings"]}
    assert got == {("select-type", "error", "slurm.conf", 4),
                   ("job-requeue", "error", "slurm.conf", 7),
                   ("syntax", "error", "slurm.conf", 8),
                   ("gpu-devices", "error", "gres.conf", 1)}
    assert all(f["fix"] for f in doc["findings"])
    assert doc["ok"] is False and doc["summary"]["errors"] == 4


def test_snippet_command(tmp_path):
    result = invoke("snippet")
    assert result.exit_code == 0
    assert "SelectType=select/cons_tres\n" in result.output
    assert "MinJobAge=300\n" in result.output and result.output.endswith("\n")
