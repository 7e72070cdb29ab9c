"""``malleable conf check`` against the real harness: its slurm.conf, its controller, and
crafted broken copies of its slurm.conf, through the installed console script.

The crafted copies are checked with ``--no-controller``: with the controller
asked, the running slurmctld's values win over the file (that is tested in
`test_running_controller_overrides_a_changed_file`).

Unreadable files: the tests run as root, and root reads a ``chmod 000`` file
anyway (CAP_DAC_OVERRIDE). So the command runs as ``nobody`` through
``setpriv`` (no shell), on files in a directory ``nobody`` may enter; when the
suite itself runs as a non-root user, the command is run directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from malleable.slurm_conf import query_controller

EXE = str(Path(sys.executable).parent / "malleable")


def run_cli(*args: str, env: dict | None = None, user: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [EXE, "conf", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user_group(user)}", "--clear-groups",
                *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def user_group(user: str) -> str:
    import grp
    import pwd
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


@pytest.fixture
def clean_env(tmp_path):
    """The environment with malleable's defaults (an empty settings file)."""
    cfg = tmp_path / "malleable.toml"
    cfg.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "MALLEABLE_CONFIG")}
    env["MALLEABLE_CONFIG"] = str(cfg)
    return env


# --------------------------------------------------------------------------- the harness


@pytest.mark.slurm
def test_harness_conf_passes_plain(slurm, clean_env):
    proc = run_cli("check", "--slurm-conf", str(slurm.conf), env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    gpus = slurm.nodes * slurm.gpus_per_node
    assert f"GPU inventory: {gpus} GPUs on {slurm.nodes} of {slurm.nodes} nodes" in out
    assert "controller: slurmctld 22.05" in out and "HASH_VAL=Match" in out
    assert "ERROR" not in out and "WARNING" not in out
    assert out.rstrip().splitlines()[-1].startswith("PASS: no errors")


@pytest.mark.slurm
def test_harness_conf_passes_json_by_default_path(slurm, clean_env):
    # No --slurm-conf: $SLURM_CONF (what the fixture exports) is the default.
    proc = run_cli("check", "--json", env={**clean_env, "SLURM_CONF": str(slurm.conf)})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["slurm_conf"] == str(slurm.conf)
    assert doc["gres_conf"] == str(slurm.conf.parent / "gres.conf") and doc["gres_conf_found"]
    ctl = doc["controller"]
    assert ctl["answered"] and ctl["version"].startswith("22.05")
    assert ctl["hash"] == "Match" and ctl["differences"] == []
    assert any(s.endswith("is UP") for s in ctl["status"])
    inv = doc["inventory"]
    assert inv["total_gpus"] == slurm.nodes * slurm.gpus_per_node
    assert all(len(n["device_files"]) == slurm.gpus_per_node and n["partitions"] == ["gpu"]
               for n in inv["nodes"])
    status = {c["check"]: c["status"] for c in doc["checks"]}
    # The harness uses proctrack/linuxproc (no cgroups in a container): an info, nothing worse.
    assert status.pop("proctrack") == "info"
    assert set(status.values()) == {"ok"}, status
    assert doc["summary"]["errors"] == 0 and doc["summary"]["warnings"] == 0


@pytest.mark.slurm
def test_running_controller_overrides_a_changed_file(slurm, tmp_path, clean_env):
    """A copy of the harness's slurm.conf, edited after slurmctld started: scontrol reaches
    the same controller, whose values (JobRequeue=1, MinJobAge=300) win and are reported."""
    text = slurm.conf.read_text()
    assert "JobRequeue=1\n" in text and "MinJobAge=300\n" in text
    copy = tmp_path / "slurm.conf"
    copy.write_text(text.replace("JobRequeue=1\n", "JobRequeue=0\n")
                    .replace("MinJobAge=300\n", "MinJobAge=30\n"))
    shutil.copy(slurm.conf.parent / "gres.conf", tmp_path / "gres.conf")
    proc = run_cli("check", "--slurm-conf", str(copy), "--json", env=clean_env)
    # The file's JobRequeue=0 is an error that takes effect at the next restart.
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    diffs = {(f["line"], f["severity"]) for f in doc["controller"]["differences"]}
    lines = text.splitlines()
    assert (lines.index("JobRequeue=1") + 1, "warning") in diffs
    assert (lines.index("MinJobAge=300") + 1, "warning") in diffs
    assert (None, "warning") in diffs            # HASH_VAL: Different
    assert doc["controller"]["hash"].startswith("Different")
    mja = next(f for f in doc["controller"]["differences"] if "MinJobAge" in f["message"])
    assert "MinJobAge=300 in the file" in mja["fix"]
    status = {c["check"]: c["status"] for c in doc["checks"]}
    assert status["controller"] == "warning"
    # The running values pass; the file's values are reported as what runs after a reconfigure.
    summaries = {c["check"]: c["summary"] for c in doc["checks"]}
    assert "JobRequeue=1" in summaries["job-requeue"] and "running" in summaries["job-requeue"]
    for check, severity in (("job-requeue", "error"), ("min-job-age", "warning")):
        (f,) = [f for f in doc["findings"] if f["check"] == check]
        assert f["severity"] == severity and "the file's value" in f["message"]
    # Without the controller the file alone is judged.
    proc = run_cli("check", "--slurm-conf", str(copy), "--no-controller", "--json",
                   env=clean_env)
    checks = {c["check"]: c["status"] for c in json.loads(proc.stdout)["checks"]}
    assert checks["job-requeue"] == "error" and checks["min-job-age"] == "warning"


def _break(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


CRAFTED = {
    # name: (edit of slurm.conf, edit of gres.conf, check, severity, file, fix contains)
    "no-gres-files": (None, ("File=", "Count=4 #"), "gpu-devices", "error", "gres.conf",
                      "File="),
    "job-requeue-0": (("JobRequeue=1", "JobRequeue=0"), None, "job-requeue", "error",
                      "slurm.conf", "JobRequeue=1"),
    "select-linear": (("SelectType=select/cons_tres", "SelectType=select/linear"), None,
                      "select-type", "error", "slurm.conf", "SelectType=select/cons_tres"),
    "syntax-error": (("MinJobAge=300", "MinJobAge=300 JobRequeue=1"), None, "syntax", "error",
                     "slurm.conf", "JobRequeue=1"),
}


@pytest.mark.slurm
@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_broken_configs(slurm, tmp_path, clean_env, name):
    slurm_edit, gres_edit, check, severity, fname, fix = CRAFTED[name]
    text = slurm.conf.read_text()
    gres = (slurm.conf.parent / "gres.conf").read_text()
    if slurm_edit:
        text = _break(text, *slurm_edit)
    if gres_edit:
        gres = _break(gres, *gres_edit)
    (tmp_path / "slurm.conf").write_text(text)
    (tmp_path / "gres.conf").write_text(gres)
    args = ["check", "--slurm-conf", str(tmp_path / "slurm.conf"), "--no-controller"]
    # A warning fails the check only with --strict.
    strict = ["--strict"] if severity == "warning" else []
    plain = run_cli(*args, *strict, env=clean_env)
    assert plain.returncode == 1, plain.stdout
    doc = json.loads(run_cli(*args, *strict, "--json", env=clean_env).stdout)
    found = [f for f in doc["findings"] if f["check"] == check]
    assert found and all(f["severity"] == severity for f in found), doc["findings"]
    edited = (slurm_edit or gres_edit)[1]
    source = text if fname == "slurm.conf" else gres
    first_line = next(i for i, ln in enumerate(source.splitlines(), 1) if edited in ln)
    f = found[0]
    assert f["path"] == str(tmp_path / fname) and f["line"] == first_line
    assert fix in f["fix"]
    assert f"{severity.upper()} [{check}] {tmp_path / fname}:{first_line}" in plain.stdout
    assert "fix: " in plain.stdout
    if severity == "warning":
        assert run_cli(*args, env=clean_env).returncode == 0


# --------------------------------------------------------------------------- unreadable files


def _world_readable_copy(src_dir: Path) -> Path:
    """A directory ``nobody`` may enter (pytest's tmp dirs are 0700) with slurm.conf and
    gres.conf copied from ``src_dir``."""
    d = Path(tempfile.mkdtemp(prefix="malleable-conf-"))
    d.chmod(0o755)
    for name in ("slurm.conf", "gres.conf", "malleable.toml"):
        shutil.copy(src_dir / name, d / name)
        (d / name).chmod(0o644)
    return d


@pytest.mark.parametrize("victim", ["slurm.conf", "gres.conf"])
def test_unreadable_file_is_a_finding_naming_path_and_cause(tmp_path, clean_env, victim):
    from tests.unit.test_slurm_conf_checks import GOOD, GOOD_GRES
    (tmp_path / "slurm.conf").write_text(GOOD)
    (tmp_path / "gres.conf").write_text(GOOD_GRES)
    (tmp_path / "malleable.toml").write_text("")
    d = _world_readable_copy(tmp_path)
    try:
        (d / victim).chmod(0o000)
        env = {**clean_env, "MALLEABLE_CONFIG": str(d / "malleable.toml")}
        user = None
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("running as root without setpriv: cannot make a file unreadable "
                            "to the check (root bypasses file permissions)")
            user = "nobody"
        args = ["check", "--slurm-conf", str(d / "slurm.conf"), "--no-controller"]
        plain = run_cli(*args, env=env, user=user)
        assert plain.returncode == 1, plain.stdout + plain.stderr
        assert f"ERROR [unreadable] {d / victim}" in plain.stdout
        proc = run_cli(*args, "--json", env=env, user=user)
        assert proc.returncode == 1
        doc = json.loads(proc.stdout)
        (f,) = [f for f in doc["findings"] if f["check"] == "unreadable"]
        assert f["path"] == str(d / victim) and f["line"] is None
        assert "Permission denied" in f["message"] and f"chmod a+r {d / victim}" in f["fix"]
        status = {c["check"]: c["status"] for c in doc["checks"]}
        if victim == "slurm.conf":
            assert [x["check"] for x in doc["findings"]] == ["unreadable"]
            assert status["select-type"] == "skipped"
        else:
            assert "unreadable" in next(c["summary"] for c in doc["checks"]
                                        if c["check"] == "gpu-devices")
            assert status["select-type"] == "ok"
    finally:
        shutil.rmtree(d)


# --------------------------------------------------------------------------- the query itself


def test_query_controller_times_out_without_hanging(tmp_path):
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (slurm-client); the harness tests install it")
    from tests.conftest import free_port_block
    port = free_port_block(1)
    (tmp_path / "slurm.conf").write_text(
        f"ClusterName=dead\nSlurmctldHost=localhost\nSlurmctldPort={port}\n"
        "AuthType=auth/munge\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    q = query_controller(tmp_path / "slurm.conf", timeout_s=1.0)
    assert q.queried and not q.answered
    assert q.error == "scontrol show config gave no answer within 1 s"
    assert q.argv == ("scontrol", "show", "config")


def test_query_controller_reports_scontrol_errors_and_absence(tmp_path):
    (tmp_path / "slurm.conf").write_text("JobRequeue=1 MinJobAge=3\n")
    if shutil.which("scontrol") is not None:
        q = query_controller(tmp_path / "slurm.conf", timeout_s=10)
        assert not q.answered and "Parse error" in q.error
    q = query_controller(tmp_path / "slurm.conf", timeout_s=1, scontrol=str(tmp_path / "none"))
    assert not q.answered and "not found" in q.error
