"""The prerequisite checks, the controller's answer overriding the files, and the snippet.

Each crafted config starts from a good one (like the harness's) and breaks one
thing; the test asserts the finding's check, severity, file:line and fix.
The controller is not asked here (``ask_controller=False``); the parsing of
its answer is tested on text in the format scontrol 22.05 prints, and the real
controller in tests/integration/test_conf_check.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malleable.config import parse_config
from malleable.slurm_conf import (
    ControllerQuery,
    Severity,
    ShowConfigError,
    check_configuration,
    parse_show_config,
    parse_slurm_conf,
    snippet,
)
from malleable.slurm_conf.checks import CHECKS
from malleable.slurm_conf.settings import Settings, compare, normalize_value

GOOD = """\
ClusterName=test
SlurmctldHost=localhost
ProctrackType=proctrack/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobRequeue=1
MinJobAge=300
NodeName=node[1-4] CPUs=16 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP
"""
GOOD_GRES = "NodeName=node[1-4] Name=gpu File=/dev/nvidia[0-3]\n"

DEFAULTS = parse_config({}, env={})


def run(tmp_path: Path, slurm: str = GOOD, gres: str | None = GOOD_GRES, config=DEFAULTS):
    (tmp_path / "slurm.conf").write_text(slurm)
    if gres is not None:
        (tmp_path / "gres.conf").write_text(gres)
    return check_configuration(tmp_path / "slurm.conf", config=config, ask_controller=False)


def line_of(text: str, line: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln == line)


def only(report, check: str):
    found = [f for f in report.findings if f.check == check]
    assert len(found) == 1, report.findings
    return found[0]


def test_good_config_passes_every_check(tmp_path):
    report = run(tmp_path)
    assert report.findings == []
    assert report.ok
    statuses = {c.check: c.status for c in report.checks}
    assert [c.check for c in report.checks] == [cid for cid, _ in CHECKS]
    assert statuses.pop("controller") == "skipped"
    assert set(statuses.values()) == {"ok"}
    assert report.inventory.total_gpus == 16


def test_defaults_are_fine_except_select_type(tmp_path):
    # JobRequeue (1), MinJobAge (300) and ProctrackType (cgroup) default to what malleable needs.
    text = "\n".join(ln for ln in GOOD.splitlines()
                     if not ln.startswith(("JobRequeue", "MinJobAge", "ProctrackType")))
    report = run(tmp_path, text + "\n")
    assert report.ok and report.findings == []
    status = {c.check: c.summary for c in report.checks}
    assert "default" in status["job-requeue"] and "default" in status["min-job-age"]


@pytest.mark.parametrize("old,new,check,severity,fix", [
    ("SelectType=select/cons_tres", "SelectType=select/linear", "select-type", "error",
     "SelectType=select/cons_tres"),
    ("SelectType=select/cons_tres", "SelectType=select/cons_res", "select-type", "error",
     "SelectType=select/cons_tres"),
    ("JobRequeue=1", "JobRequeue=0", "job-requeue", "error", "JobRequeue=1"),
    ("JobRequeue=1", "JobRequeue=yes", "job-requeue", "error", "JobRequeue=1"),
    ("GresTypes=gpu", "GresTypes=mps", "gres-types", "error", "GresTypes=mps,gpu"),
    ("MinJobAge=300", "MinJobAge=30", "min-job-age", "warning", "MinJobAge=300"),
    ("MinJobAge=300", "MinJobAge=0", "min-job-age", "info", None),
    ("MinJobAge=300", "MinJobAge=soon", "min-job-age", "error", "MinJobAge=300"),
    ("MinJobAge=300", "SchedulerParameters=bf_continue,disable_job_shrink", "job-shrink",
     "warning", "SchedulerParameters=bf_continue"),
    ("MinJobAge=300", "SchedulerParameters=disable_job_shrink", "job-shrink", "warning",
     "remove the SchedulerParameters line"),
    ("ProctrackType=proctrack/cgroup", "ProctrackType=proctrack/pgid", "proctrack", "warning",
     "ProctrackType=proctrack/cgroup"),
    ("ProctrackType=proctrack/cgroup", "ProctrackType=proctrack/linuxproc", "proctrack", "info",
     "ProctrackType=proctrack/cgroup"),
    ("ProctrackType=proctrack/cgroup", "PrologFlags=Alloc,Contain", "proctrack", "info", None),
    ("MinJobAge=300", "JobRequeu=1", "keys", "warning", "JobRequeu"),
    ("MinJobAge=300", "JobRequeue=1 MinJobAge=300", "syntax", "error", "MinJobAge=300"),
    ("MinJobAge=300", "MinJobAge 300", "syntax", "error", "Key=Value"),
])
def test_each_broken_setting_is_one_finding_at_its_line_with_its_fix(
        tmp_path, old, new, check, severity, fix):
    text = GOOD.replace(old, new)
    report = run(tmp_path, text)
    f = only(report, check)
    assert f.severity == severity
    assert f.location.path == str(tmp_path / "slurm.conf")
    assert f.location.line == line_of(text, new)
    if fix is None:
        assert f.fix is None
    else:
        assert fix in f.fix
    assert report.ok == (severity != "error")
    check_id = "files" if check == "syntax" else check
    assert next(c for c in report.checks if c.check == check_id).status == severity


def test_unset_select_type_is_an_error_pointing_at_the_file(tmp_path):
    text = GOOD.replace("SelectType=select/cons_tres\n", "")
    f = only(run(tmp_path, text), "select-type")
    assert f.severity == Severity.ERROR and f.location.line is None
    assert "select/linear" in f.message and f.fix.startswith("SelectType=select/cons_tres")


def test_cray_aries_over_cons_tres_is_accepted(tmp_path):
    text = GOOD.replace("SelectType=select/cons_tres", "SelectType=select/cray_aries").replace(
        "SelectTypeParameters=CR_Core", "SelectTypeParameters=CR_Core,OTHER_CONS_TRES")
    assert not [f for f in run(tmp_path, text).findings if f.check == "select-type"]


def test_min_job_age_follows_the_daemon_poll_interval(tmp_path):
    slow = parse_config({"daemon": {"poll_interval_s": 200}}, env={})
    f = only(run(tmp_path, config=slow), "min-job-age")
    assert f.severity == Severity.WARNING and "400 s" in f.message
    assert f.fix.startswith("MinJobAge=400")


def test_no_gres_files_is_an_error(tmp_path):
    report = run(tmp_path, gres="NodeName=node[1-4] Name=gpu Count=4\n")
    f = only(report, "gpu-devices")
    assert f.severity == Severity.ERROR and f.location.line == 1
    assert f.location.path == str(tmp_path / "gres.conf")
    assert "File=/dev/nvidia[0-3]" in f.fix and not report.ok


def test_missing_gres_conf_is_an_error_naming_where_it_belongs(tmp_path):
    report = run(tmp_path, gres=None)
    f = only(report, "gpu-devices")
    assert str(tmp_path / "gres.conf") in f.fix
    assert not report.gres_conf_found and not report.ok


def test_no_gpu_nodes_and_no_partition(tmp_path):
    text = GOOD.replace(" Gres=gpu:4", "")
    report = run(tmp_path, text, gres="")
    f = only(report, "gpu-nodes")
    assert f.severity == Severity.ERROR and "Gres=gpu:4" in f.fix
    text = GOOD.replace("PartitionName=gpu Nodes=node[1-4]", "PartitionName=cpu")
    f = only(run(tmp_path, text), "partitions")
    assert f.severity == Severity.ERROR and "PartitionName=gpu Nodes=node[1-4]" in f.fix


def test_gpu_partitions_down_and_lonely_gpu_nodes(tmp_path):
    text = GOOD.replace("State=UP", "State=DOWN")
    assert only(run(tmp_path, text), "partitions").severity == Severity.WARNING
    text = GOOD.replace("Nodes=node[1-4] Default", "Nodes=node[1-3] Default")
    f = only(run(tmp_path, text), "partitions")
    assert f.severity == Severity.WARNING and "node4" in f.message


def test_managed_partitions_from_malleable_config(tmp_path):
    cfg = parse_config({"slurm": {"partitions": ["gpu", "nope"]}}, source="m.toml", env={})
    f = only(run(tmp_path, config=cfg), "partitions")
    assert f.severity == Severity.ERROR and "'nope'" in f.message and f.location.path == "m.toml"


def test_unreadable_slurm_conf_skips_the_other_checks(tmp_path):
    (tmp_path / "slurm.conf").mkdir()
    report = check_configuration(tmp_path / "slurm.conf", config=DEFAULTS)
    assert [f.check for f in report.findings] == ["unreadable"]
    assert {c.status for c in report.checks if c.check != "files"} == {"skipped"}
    assert not report.ok and not report.controller.queried


# --------------------------------------------------------------------------- controller

SHOW_CONFIG = """\
Configuration data as of 2026-01-01T00:00:00
AccountingStorageType   = accounting_storage/none
AuthInfo                = socket=/run/munge/munge.socket.2
GresTypes               = gpu
HASH_VAL                = Different Ours=0x1234 Slurmctld=0xabcd
JobRequeue              = 1
MinJobAge               = 300 sec
PowerPlugin             =
ProctrackType           = proctrack/cgroup
SchedulerParameters     = (null)
SelectType              = select/cons_tres
SelectTypeParameters    = CR_CORE
SlurmUser               = slurm(64030)
SlurmctldHost[0]        = ctl1(10.0.0.1)
SLURM_CONF              = /etc/slurm/slurm.conf
SLURM_VERSION           = 22.05.8
BrandNewKey             = 7

Cgroup Support Configuration:
ConstrainDevices        = yes
MinJobAge               = 99

Slurmctld(primary) at ctl1 is UP
Slurmctld(backup) at ctl2 is DOWN
"""


def test_parse_show_config():
    cfg = parse_show_config(SHOW_CONFIG)
    assert cfg.version == "22.05.8" and cfg.slurm_conf == "/etc/slurm/slurm.conf"
    assert cfg.get("minjobage") == "300 sec"            # the top level, not the cgroup section
    assert cfg.get("AuthInfo") == "socket=/run/munge/munge.socket.2"
    assert cfg.get("PowerPlugin") == ""
    assert cfg.sections["Cgroup Support Configuration"]["ConstrainDevices"] == "yes"
    assert cfg.status == ("Slurmctld(primary) at ctl1 is UP", "Slurmctld(backup) at ctl2 is DOWN")
    assert cfg.hash_val.startswith("Different")


def test_parse_show_config_refuses_other_text():
    with pytest.raises(ShowConfigError):
        parse_show_config("slurm_load_ctl_conf error: Unable to contact slurm controller\n")


@pytest.mark.parametrize("a,b,same", [
    ("300 sec", "300", True), ("(null)", None, True), ("slurm(64030)", "slurm", True),
    ("CR_CORE", "CR_Core", True), ("No", "0", True), ("b,a", "a, b", True),
    ("select/cons_tres", "select/linear", False), ("30 sec", "300", False),
])
def test_normalize_value(a, b, same):
    assert (normalize_value(a) == normalize_value(b)) == same


def test_controller_values_override_the_files_and_differences_are_reported(tmp_path):
    text = GOOD.replace("JobRequeue=1", "JobRequeue=0").replace("MinJobAge=300", "MinJobAge=30")
    (tmp_path / "slurm.conf").write_text(text)
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    query = ControllerQuery(True, config=parse_show_config(SHOW_CONFIG))
    settings = Settings(conf, query.config)
    s = settings.get("JobRequeue")
    assert (s.value, s.source, s.location.line) == ("1", "controller", 7)
    assert settings.get("SchedulerParameters").value is None
    assert settings.get("NotPrinted").source == "default"
    diffs = compare(conf, query, "/etc/slurm/slurm.conf")
    keys = sorted((f.severity.value, f.location.line or 0) for f in diffs)
    # JobRequeue (line 7) and MinJobAge (line 8) differ; HASH_VAL says Different.
    assert keys == [("warning", 0), ("warning", 7), ("warning", 8)]
    mja = next(f for f in diffs if f.location.line == 8)
    assert "'30'" in mja.message and "'300 sec'" in mja.message and "reconfigure" in mja.fix


def test_controller_not_answering_is_an_info(tmp_path):
    (tmp_path / "slurm.conf").write_text(GOOD)
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    (f,) = compare(conf, ControllerQuery(True, error="Unable to contact"), str(tmp_path))
    assert f.severity == Severity.INFO and "Unable to contact" in f.message
    assert compare(conf, ControllerQuery(False), str(tmp_path)) == []


# --------------------------------------------------------------------------- snippet


def test_snippet_lines_pass_the_checks(tmp_path):
    text = snippet(DEFAULTS)
    assert text.endswith("\n")
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert {ln.split("=")[0] for ln in body} == {"SelectType", "GresTypes", "JobRequeue",
                                                 "MinJobAge", "ProctrackType"}
    uncomment = [ln[1:] for ln in text.splitlines()
                 if ln.startswith(("#NodeName", "#PartitionName"))]
    gres = [ln[1:] for ln in text.splitlines() if ln.startswith("#NodeName") and "File=" in ln]
    slurm = "ClusterName=x\n" + "\n".join(body + [u for u in uncomment if u not in gres]) + "\n"
    report = run(tmp_path, slurm, gres="\n".join(gres) + "\n")
    assert report.findings == [], report.findings
    slow = parse_config({"daemon": {"poll_interval_s": 600}}, env={})
    assert "MinJobAge=1200" in snippet(slow)


def test_with_a_controller_both_running_and_file_values_are_judged(tmp_path):
    from malleable.slurm_conf import build_inventory, parse_gres_conf
    from malleable.slurm_conf.checks import run_checks
    text = GOOD.replace("SelectType=select/cons_tres", "SelectType=select/linear").replace(
        "proctrack/cgroup", "proctrack/linuxproc")
    (tmp_path / "slurm.conf").write_text(text)
    (tmp_path / "gres.conf").write_text(GOOD_GRES)
    conf, gres = parse_slurm_conf(tmp_path / "slurm.conf"), parse_gres_conf(tmp_path / "gres.conf")
    shown = SHOW_CONFIG.replace("proctrack/cgroup", "proctrack/linuxproc")
    query = ControllerQuery(True, config=parse_show_config(shown))
    inv, inv_findings = build_inventory(conf, gres)
    checks, findings = run_checks(
        slurm=conf, gres=gres, gres_path=str(tmp_path / "gres.conf"),
        settings=Settings(conf, query.config), inventory=inv, inventory_findings=inv_findings,
        controller=query, controller_findings=compare(conf, query, str(tmp_path)),
        config=DEFAULTS)
    summary = next(c.summary for c in checks if c.check == "select-type")
    assert summary.startswith("SelectType=select/cons_tres") and "running" in summary
    (f,) = [f for f in findings if f.check == "select-type"]
    assert f.severity == Severity.ERROR and f.location.line == 4
    assert "select/linear" in f.message and "the file's value" in f.message
    # A value the file and the controller share is reported once, not twice.
    (p,) = [f for f in findings if f.check == "proctrack"]
    assert p.severity == Severity.INFO and "the file's value" not in p.message


@pytest.mark.parametrize("version,severity", [
    ("22.05.8", Severity.ERROR), ("21.08.1", Severity.ERROR), (None, Severity.WARNING),
    ("24.11.1", Severity.INFO),
])
def test_glob_includes_depend_on_the_running_release(tmp_path, version, severity):
    from malleable.slurm_conf.checks import check_glob_includes
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.conf").write_text("")
    (tmp_path / "slurm.conf").write_text("Include d/*.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    text = SHOW_CONFIG.replace("22.05.8", version or "x")
    query = ControllerQuery(True, config=parse_show_config(text)) if version else \
        ControllerQuery(False)
    (f,) = check_glob_includes([conf], query)
    assert f.severity == severity and f.check == "include" and f.location.line == 1
    if severity != Severity.INFO:
        assert f.fix == f"write one Include line per file: Include {tmp_path / 'd' / 'a.conf'}"


def test_default_spool_dir_fits_the_socket_path_limit(tmp_path):
    report = run(tmp_path)
    assert not [f for f in report.findings if f.check == "spool-dir"]
    check = next(c for c in report.checks if c.check == "spool-dir")
    # /var/spool/slurmd/node1_<8 digits of MaxJobId>.<10 digits of the step id>
    assert check.status == "ok" and "43 bytes" in check.summary


@pytest.mark.parametrize("spool, node_in_path", [
    ("/srv/" + "d" * 80 + "/slurmd", False),   # 92 + 26 bytes
    ("/srv/" + "d" * 75 + "/%n", True),      # %n expands to the node name: 86 + 26
])
def test_deep_spool_dir_is_an_error(tmp_path, spool, node_in_path):
    """A spool as deep as pytest's tmp_path made every harness job fail to launch:
    slurmstepd's socket <spool>/<node>_<job>.<step> did not fit in 107 bytes."""
    text = GOOD + f"SlurmdSpoolDir={spool}\n"
    report = run(tmp_path, slurm=text)
    f = only(report, "spool-dir")
    assert f.severity == Severity.ERROR and not report.ok
    assert f.location.path == str(tmp_path / "slurm.conf")
    assert f.location.line == line_of(text, f"SlurmdSpoolDir={spool}")
    assert "launch failed requeued held" in f.message and "node1" in f.message
    assert f.fix.startswith("SlurmdSpoolDir=/var/spool/slurmd")
    assert ("/node1/node1_" in f.message) == node_in_path


def test_spool_dir_check_takes_job_ids_at_the_width_of_max_job_id(tmp_path):
    base = "/srv/" + "d" * 68 + "/slurmd"    # 80 bytes: + 26 fits, + 28 (10-digit ids) does not
    fits = run(tmp_path, slurm=GOOD + f"SlurmdSpoolDir={base}\n")
    assert not [f for f in fits.findings if f.check == "spool-dir"]
    wide = run(tmp_path, slurm=GOOD + f"SlurmdSpoolDir={base}\nMaxJobId=4000000000\n")
    assert only(wide, "spool-dir").severity == Severity.ERROR
