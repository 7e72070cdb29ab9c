"""The admin commands against a database alone (no daemon, no Slurm): plain and --json
output, the JSON schemas, exit codes and messages.

The store is filled with known contents by `tests.unit.ops_store`. Commands run in
process through click's test runner on the real ``malleable`` group; the same
commands run against a live daemon and the real Slurm harness in
tests/integration/test_ops_daemon.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from sqlalchemy import update

import malleable.config as config_module
from malleable.cli import main
from malleable.daemon.cycle import spec_as_dict
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.lease import acquire_lease, release_lease
from malleable.db.models import Job
from malleable.estimators.params import EstimateFlags
from malleable.ops import docgen
from malleable.ops.access import effective_config, open_store
from malleable.ops.actions import build_actions
from malleable.ops.job import build_job, render_job
from malleable.ops.output import fmt_duration
from malleable.ops.policy import parse_assignments
from malleable.ops.schemas import SCHEMAS
from malleable.ops.status import build_status, render_status
from malleable.ops.views import goodput_curve, remaining_basis
from malleable.slurm.records import JobState
from tests.unit.ops_store import NOW, SPEC_101, T0, _job, build_store, write_config

ROOT = Path(__file__).resolve().parents[2]


def check_schema(doc: dict) -> dict:
    """Validate a --json document against its documented schema; return it."""
    schema_ = SCHEMAS[doc["schema"]]
    Draft202012Validator.check_schema(schema_)
    errors = sorted(Draft202012Validator(schema_).iter_errors(doc), key=lambda e: e.json_path)
    assert not errors, [f"{e.json_path}: {e.message}" for e in errors[:5]]
    return doc


@pytest.fixture
def built(tmp_path):
    return build_store(tmp_path / "m.db")


@pytest.fixture
def cfg(tmp_path, built):
    return write_config(tmp_path / "malleable.toml", built.url,
                        daemon={"lease_timeout_s": 60.0}, operator={"group": "staff"})


@pytest.fixture
def run(cfg, monkeypatch):
    """Run ``malleable ARGS --config CFG`` in process; returns click's Result."""
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")   # g comes from the store

    def _run(*args: str, config: bool = True):
        argv = [*args, "--config", str(cfg)] if config else list(args)
        return CliRunner().invoke(main, argv, prog_name="malleable")
    return _run


def js(result) -> dict:
    assert result.exit_code == 0, result.output
    return check_schema(json.loads(result.stdout))


def one_line_error(result, code: int, *needles: str) -> str:
    assert result.exit_code == code, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in err, err
    return err


# ---------------------------------------------------------------- status


def test_status_json_numbers(run, built):
    doc = js(run("status", "--json"))
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert list(jobs) == ["101", "102"]          # 103 finished, 104 rigid
    j = jobs["101"]
    assert (j["state"], j["gpus"], j["target_gpus"], j["target_reason"]) == \
        ("RUNNING", 4, 8, "equal share 8")
    assert j["throughput"] == pytest.approx(1800.0)   # run 1 only: 18,000 samples per 10 s
    assert j["remaining_work"] == pytest.approx(built.remaining_101, abs=0.1)
    # The goodput the policy saw (cross-node sync capped for a job never run across nodes).
    g8 = goodput_curve(_params(built, "101"), _spec(built, "101"), 4,
                       flags=_bits(built, "101")).at(8)
    assert g8 == pytest.approx(float(built.table.goodput[0, built.table.k == 8][0]), rel=1e-9)
    assert j["goodput_at_target"] == pytest.approx(g8, rel=1e-6)
    assert j["eta_s"] == pytest.approx(built.remaining_101 / g8, abs=0.1)
    assert j["remaining_basis"] == "target"           # its spec declares a target
    assert j["last_action"]["kind"] == "requeue" and j["last_action"]["state"] == "done"
    assert j["last_action"]["finished"] and j["reason"] is None
    p = jobs["102"]
    assert (p["state"], p["gpus"], p["requested_gpus"], p["target_gpus"]) == \
        ("PENDING", 0, 2, 0)
    assert p["throughput"] is None and p["eta_s"] is None and p["held"]
    assert p["last_action"]["kind"] == "hold" and not p["last_action"]["finished"]
    assert doc["gpus"] == {"held": 4, "target": 8}
    assert doc["policy"] == {"name": "default", "resolved": "pollux", "params": {},
                             "source": "config"}
    assert doc["last_decision"]["id"] == built.decision_id
    assert doc["last_decision"]["policy"] == "equi" and doc["paused"] is False
    assert (doc["gpus_per_node"], doc["gpus_per_node_source"]) == (4, "store")
    assert doc["last_poll"] == "2026-03-01T12:02:05Z"


def _latest_estimate(built, sid, column: str):
    """A column (``params``, ``flags``) of job ``sid``'s latest stored estimate."""
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s:
        j = store.get_job(s, sid)
        out = getattr(store.latest_estimates(s, [j.id])[j.id], column)
    eng.dispose()
    return out


def _params(built, sid):
    return _latest_estimate(built, sid, "params")


def _bits(built, sid):
    return _latest_estimate(built, sid, "flags")["bits"]


def _spec(built, sid):
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s:
        out = store.get_job(s, sid).spec
    eng.dispose()
    return out


def test_status_marks_an_eta_without_a_declared_target(run):
    doc = js(run("status", "--json", "--gpus-per-node", "4"))
    text = render_status(doc)
    assert "~" not in text and "no declared target" not in text
    j = next(x for x in doc["jobs"] if x["job_id"] == "101")
    j["remaining_basis"] = "history"
    text = render_status(doc)
    line = next(x for x in text.splitlines() if x.startswith("101 "))
    assert "~" + fmt_duration(j["eta_s"]) in line
    assert "~ no declared target: remaining work from finished jobs' sizes" in text
    bits = int(EstimateFlags.REMAINING_DEFAULT | EstimateFlags.SINGLE_BATCH)
    assert (remaining_basis(bits), remaining_basis(None)) == ("default", None)
    # A goodput from the cluster's default prior (no throughput measured, no finished job
    # of its model) is a guess too: its ETA is marked, with its own legend line.
    j["remaining_basis"] = "target"
    assert j["goodput_basis"] == "fit"
    assert "~" not in render_status(doc)
    j["goodput_basis"] = "default"
    text = render_status(doc)
    assert "~" + fmt_duration(j["eta_s"]) in text
    assert "~ no throughput measured yet and no finished job like it (same model, else same " \
        "name and user)" in text
    assert "no declared target" not in text


def test_status_text_and_all(run):
    r = run("status", "--gpus-per-node", "4")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "policy:        default (= pollux), set by config" in out
    assert "GPUs:          4 held by malleable jobs, 8 targeted" in out
    line = next(x for x in out.splitlines() if x.startswith("101 "))
    assert "RUNNING" in line and "4 -> 8" in line and "1,800" in line
    assert "requeue 2->4: done" in line
    line = next(x for x in out.splitlines() if x.startswith("102 "))
    assert "PENDING (held, Resources)" in line and "(2) -> 0" in line   # as squeue's reason
    assert "hold 2->0: hold" in line
    assert "103" not in out
    doc = js(run("status", "--all", "--json"))
    assert [j["job_id"] for j in doc["jobs"]] == ["101", "102", "103"]
    assert doc["jobs"][2]["state"] == "COMPLETED"
    # 103 ended while its row kept its pending reason: only a pending job shows one.
    assert doc["jobs"][2]["reason"] == "Resources"
    line = next(x for x in run("status", "--all").stdout.splitlines() if x.startswith("103 "))
    assert "COMPLETED " in line and "Resources" not in line
    text = run("job", "show", "103").stdout
    assert "COMPLETED, " in text and "reason Resources" not in text


def test_daemon_health_from_the_lease(built, cfg):
    config = effective_config(str(cfg), None)     # lease_timeout_s = 60

    def health(now):
        with open_store(config) as st, st.sessions() as s:
            return build_status(s, config, now, where=st.where)["daemon"]

    d = health(NOW)
    # The holder took the lease with its own 300 s: that, not the reader's 60 s, applies
    # (a daemon with this configuration could not take the lease over either).
    assert (d["health"], d["holder"], d["heartbeat_age_s"], d["lease_timeout_s"]) == \
        ("healthy", "testhost:4242", 5.0, 300.0)
    assert health(NOW + timedelta(seconds=56))["health"] == "healthy"
    assert health(NOW + timedelta(seconds=296))["health"] == "stale"
    eng = make_engine(built.url)
    release_lease(eng, "testhost:4242")
    eng.dispose()
    d = health(NOW)
    assert (d["health"], d["holder"], d["heartbeat_at"]) == ("absent", None, None)


def test_status_check_exit_code_follows_health(run, built):
    eng = make_engine(built.url)
    now = datetime.now(UTC)
    acquire_lease(eng, "testhost:4242", timeout_s=300, now=now)
    with session_factory(eng)() as s, s.begin():
        store.set_setting(s, store.LAST_POLL_KEY, now.isoformat(), now)
    r = run("status", "--check", "--json")
    assert r.exit_code == 0, r.output
    assert js(r)["daemon"]["health"] == "healthy" and js(r)["polls_stale"] is False
    # A live daemon whose polls fail (Slurm down): --check says so.
    old = now - timedelta(seconds=js(r)["polls_stale_after_s"] + 10)
    with session_factory(eng)() as s, s.begin():
        store.set_setting(s, store.LAST_POLL_KEY, old.isoformat(), now)
        s.execute(update(Job).values(last_seen=old))
    r = run("status", "--check")
    one_line_error(r, 1, "malleable status: error: daemon healthy but no successful poll")
    assert "POLLS FAILING" in r.stdout
    release_lease(eng, "testhost:4242")
    eng.dispose()
    r = run("status", "--check")
    one_line_error(r, 1, "malleable status: error: daemon absent")
    assert "daemon:        absent" in r.stdout     # the table is still printed
    assert run("status").exit_code == 0            # without --check: 0


# ---------------------------------------------------------------- job show


def test_job_show_json(run, built, tmp_path):
    png = tmp_path / "curve.png"
    doc = js(run("job", "show", "101", "--json", "--gpus-per-node", "4", "--plot", str(png)))
    assert doc["job"]["job_id"] == "101" and doc["job"]["restart_count"] == 1
    assert doc["spec"]["parsed"]["min_gpus"] == 2 and doc["spec"]["error"] is None
    assert [s["gpus"] for s in doc["sizes"]] == [2, 4]
    kinds = [e["kind"] for e in doc["events"]]
    assert {"new", "size", "restart", "checkpointed"} <= set(kinds)
    assert [a["id"] for a in doc["actions"]] == [built.requeue_id]
    assert doc["targets"][0] == {"decision_id": built.decision_id, "time": "2026-03-01T12:04:10Z",
                                 "policy": "equi", "dry_run": False, "gpus": 8,
                                 "batch_size": 512, "reason": "equal share 8"}
    pr = doc["progress"]
    assert (pr["lines_stored"], pr["lines_accepted"], pr["rejected"]) == (24, 24, {"not_json": 2})
    assert [(r["restart"], r["lines"], r["min_gpus"]) for r in pr["runs"]] == [(0, 11, 2),
                                                                                (1, 13, 4)]
    assert [r["throughput"] for r in pr["runs"]] == pytest.approx([1000.0, 1800.0])
    assert pr["throughput"]["samples_per_s"] == pytest.approx(1800.0)
    assert pr["first"]["samples"] == 0 and pr["last"]["samples"] == 100_000 + 12 * 18_000
    assert pr["file"] and pr["expected_file"] is None
    e = doc["estimate"]
    assert "remaining_exact" in e["flags"] and e["m0"] == 512 and e["eta_gpus"] == 8
    assert e["remaining_work"] == pytest.approx(2_000_000 - e["progress"], abs=1)
    c = doc["curve"]
    assert [p["gpus"] for p in c["points"]] == [2, 4, 8]
    assert [p["nodes"] for p in c["points"]] == [1, 1, 2]
    assert e["eta_s"] == pytest.approx(e["remaining_work"] / c["points"][2]["goodput"], rel=1e-3)
    assert doc["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_job_show_text_rigid_and_unknown(run, tmp_path):
    r = run("job", "show", "101", "--gpus-per-node", "4")
    assert r.exit_code == 0, r.output
    for needle in ("job 101 (resnet, user alice, partition gpu): RUNNING", "runs:",
                   "speedup curve (fitted goodput; g = 4 GPUs per node, from option",
                   "checkpointed", "size 2 -> 4 GPUs", "requeue  2->4  done",
                   "rejected: not_json 2", "1,800 samples/s"):
        assert needle in r.stdout, needle
    doc = js(run("job", "show", "104", "--json"))
    assert doc["estimate"] is None and doc["curve"] is None and not doc["job"]["malleable"]
    one_line_error(run("job", "show", "104", "--plot", str(tmp_path / "x.png")), 2,
                   "job 104 is rigid (no valid malleable spec)")
    one_line_error(run("job", "show", "999"), 2, "job '999': not in the state store")


def test_job_show_names_the_file_it_waits_for(run, built):
    """A malleable job whose lines were never read (here the pending 102) shows where
    the daemon reads them: a job writing elsewhere showed "0 lines stored" and no hint
    (a helper). A rigid job's lines are not read: nothing to show."""
    doc = js(run("job", "show", "102", "--json"))
    assert doc["progress"]["file"] is None
    expected = doc["progress"]["expected_file"]
    assert expected.endswith("/102.jsonl")
    assert f"no progress file read yet: the daemon reads {expected}" in \
        run("job", "show", "102").stdout
    assert js(run("job", "show", "104", "--json"))["progress"]["expected_file"] is None


def test_job_show_pending_start_is_slurms_expectation(run):
    doc = js(run("job", "show", "102", "--json"))
    assert doc["job"]["state"] == "PENDING"
    assert "not started" in render_job(doc) and "started -" not in render_job(doc)
    doc["job"]["start_time"] = "2026-03-01T13:00:00Z"     # backfill's estimate
    assert "expected to start 2026-03-01T13:00:00Z (Slurm's estimate)" in render_job(doc)
    doc["job"]["state"] = "RUNNING"
    assert "started 2026-03-01T13:00:00Z" in render_job(doc)
    # Slurm's end time of a pending or running job is its time limit's, not an end.
    doc["job"]["end_time"] = "2026-03-01T15:00:00Z"
    assert "started 2026-03-01T13:00:00Z, time limit ends 2026-03-01T15:00:00Z;" \
        in render_job(doc)
    doc["job"]["state"] = "PENDING"
    assert "ended" not in render_job(doc) and "time limit" not in render_job(doc)
    doc["job"]["state"] = "COMPLETED"
    assert "ended 2026-03-01T15:00:00Z;" in render_job(doc)


def _as_pending(built, start_time):
    """Job 101 (target 8 GPUs in the latest decision) made PENDING, with ``start_time``
    as Slurm's expected start (None: Slurm gives none)."""
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        s.execute(update(Job).where(Job.slurm_job_id == "101")
                  .values(state="PENDING", start_time=start_time, gpus=2))
    eng.dispose()


@pytest.mark.parametrize("wait", [600.0, None])
def test_pending_eta_counts_the_wait_to_slurms_expected_start(built, cfg, wait):
    config = effective_config(str(cfg), None)

    def docs():
        with open_store(config) as st, st.sessions() as s:
            return (check_schema(build_status(s, config, NOW, where=st.where, gpus_per_node=4)),
                    check_schema(build_job(s, "101", NOW, gpus_per_node=4)[0]))

    running, _ = docs()
    run_s = next(j for j in running["jobs"] if j["job_id"] == "101")["eta_s"]
    _as_pending(built, None if wait is None else NOW + timedelta(seconds=wait))
    doc, jd = docs()
    j = next(x for x in doc["jobs"] if x["job_id"] == "101")
    e = jd["estimate"]
    assert j["state"] == "PENDING" and j["target_gpus"] == 8
    assert j["wait_s"] == wait and e["wait_s"] == wait
    assert j["eta_s"] == pytest.approx(run_s + (wait or 0.0), abs=0.2)
    assert e["eta_s"] == pytest.approx(j["eta_s"], abs=0.2)
    line = next(x for x in render_status(doc).splitlines() if x.startswith("101 "))
    shown = render_job(jd)
    if wait is None:
        assert ">" + fmt_duration(j["eta_s"]) in line
        assert "> pending, and Slurm gives no expected start" in render_status(doc)
        assert "after it starts (Slurm gives no expected start)" in shown
    else:
        assert fmt_duration(j["eta_s"]) in line and ">" + fmt_duration(j["eta_s"]) not in line
        assert "no expected start" not in render_status(doc)
        assert "(of which 10 min waiting for Slurm's expected start)" in shown


def test_job_show_plot_format_follows_the_extension(run, built, tmp_path):
    svg, pdf, bare = tmp_path / "c.svg", tmp_path / "c.PDF", tmp_path / "curve"
    for path in (svg, pdf, bare):
        r = run("job", "show", "101", "--gpus-per-node", "4", "--plot", str(path))
        assert r.exit_code == 0, r.output
    assert b"<svg" in svg.read_bytes()[:500]
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"          # no extension: PNG, as named
    assert not (tmp_path / "curve.png").exists()
    one_line_error(run("job", "show", "101", "--plot", ""), 2, "--plot '': empty path")
    for ext in ("xyz", "pgf", "eps", "raw"):    # PGF needs LaTeX; PostScript warns
        r = run("job", "show", "101", "--plot", str(tmp_path / f"c.{ext}"))
        one_line_error(r, 2, f"cannot write .{ext} images (known: ")
        assert ".svg" in r.output and not (tmp_path / f"c.{ext}").exists()
    one_line_error(run("job", "show", "101", "--plot", "-"), 2,
                   "not written to standard output")


# ---------------------------------------------------------------- actions


def test_actions_filters(run, built):
    doc = js(run("actions", "--json"))
    assert [a["id"] for a in doc["actions"]] == [built.requeue_id, built.hold_id]
    assert doc["actions"][0]["job_id"] == "101" and doc["actions"][1]["job_id"] == "102"
    assert [a["kind"] for a in js(run("actions", "--job", "102", "--json"))["actions"]] == ["hold"]
    assert [a["id"] for a in js(run("actions", "--limit", "1", "--json"))["actions"]] == \
        [built.hold_id]
    doc = js(run("actions", "--since", "2026-03-01T12:03:00Z", "--json"))
    assert [a["id"] for a in doc["actions"]] == [built.hold_id]
    assert doc["filters"] == {"job": None, "since": "2026-03-01T12:03:00Z", "limit": 50}
    text = run("actions").stdout
    assert "requeue" in text and "hold (in flight)" in text and "running on 4 GPUs" in text
    one_line_error(run("actions", "--since", "soon"), 2, "--since 'soon'")
    one_line_error(run("actions", "--job", "7"), 2, "--job 7: not in the state store")
    assert run("actions", "--limit", "0").exit_code == 2


def test_actions_since_a_duration(built):
    eng = make_engine(built.url, create=False)
    with session_factory(eng, readonly=True)() as s:
        now = T0 + timedelta(seconds=260)
        from malleable.ops.output import parse_since
        doc = build_actions(s, now, since=parse_since("100s", now))
        assert [a["kind"] for a in doc["actions"]] == ["hold"]       # created at T0 + 200 s
        assert len(build_actions(s, now, since=parse_since("1h", now))["actions"]) == 2
    eng.dispose()


# ---------------------------------------------------------------- pause, resume


def test_pause_and_resume_as_root(run):
    assert os.geteuid() == 0, "the test suite runs as root"
    doc = js(run("pause", "--json"))
    assert doc["paused"] and doc["changed"] and doc["uid"] == 0
    assert not js(run("pause", "--json"))["changed"]
    assert js(run("status", "--json"))["paused"] is True
    assert "PAUSED" in run("status").stdout
    r = run("resume")
    assert r.exit_code == 0 and r.stdout.startswith("resumed:")
    assert js(run("status", "--json"))["paused"] is False
    # The store's lease is old (no daemon renews it): the command says when it applies.
    assert doc["daemon_health"] == "stale"
    assert "No healthy daemon holds the lease now (daemon stale, see `malleable status`): " \
        "it takes effect when one runs." in r.stdout


def test_who_paused_and_who_set_the_policy_are_recorded(run, monkeypatch):
    """pause and policy set record who ran them (under sudo, who ran sudo too); status
    and policy show name them. A command that changes nothing leaves the record."""
    host = socket.gethostname()
    monkeypatch.setenv("SUDO_USER", "bob")
    monkeypatch.setenv("SUDO_UID", "1001")
    assert js(run("pause", "--json"))["by"].startswith("root (uid 0, sudo by bob, groups: ")
    doc = js(run("status", "--json"))
    assert doc["paused_by"].startswith(f"root (uid 0, sudo by bob) on {host} at 20")
    assert f"PAUSED by root (uid 0, sudo by bob) on {host} at " in run("status").stdout
    monkeypatch.delenv("SUDO_USER")
    js(run("pause", "--json"))                    # already paused: the record stays
    assert "sudo by bob" in js(run("status", "--json"))["paused_by"]
    js(run("resume", "--json"))
    assert js(run("status", "--json"))["paused_by"] is None
    js(run("policy", "set", "las", "starve_s=60", "--json"))
    shown = js(run("policy", "show", "--json"))
    assert shown["set_by"] == f"root (uid 0) on {host}"
    assert f"source: set by root (uid 0) on {host} at " in run("policy", "show").stdout
    # The same choice again changes nothing: not who set it, not when.
    monkeypatch.setenv("SUDO_USER", "carol")
    again = js(run("policy", "set", "las", "starve_s=60", "--json"))
    assert not again["changed"] and (again["set_by"], again["set_at"]) == \
        (shown["set_by"], shown["set_at"])
    assert "(already in force: nothing to do)" in run("policy", "set", "las", "starve_s=60").stdout
    js(run("policy", "reset", "--json"))
    assert js(run("policy", "show", "--json"))["set_by"] is None


@pytest.mark.parametrize("uid, env, shown", [
    (0, {"SUDO_USER": "bob", "SUDO_UID": "1001"}, "root (uid 0, sudo by bob)"),
    (0, {"SUDO_USER": "bob"}, "root (uid 0)"),                    # not set by sudo
    (0, {"SUDO_USER": "eve)\n2026 WARNING fake", "SUDO_UID": "7"}, "root (uid 0)"),
    (0, {"SUDO_USER": "root", "SUDO_UID": "0"}, "root (uid 0)"),
])
def test_the_recorded_actor_trusts_sudo_user_only_from_sudo(monkeypatch, uid, env, shown):
    """Another user could set $SUDO_USER to any name, or a line break that forges log
    lines: it counts only for root with $SUDO_UID, and as a valid user name."""
    from malleable.ops.auth import actor
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.delenv("SUDO_UID", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    assert actor() == shown


def test_a_stored_actor_with_control_characters_is_shown_printable(built):
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.record_operator_change(s, store.PAUSED_BY_KEY, "pause", "x\nWARNING forged",
                                     "h\x1b[2J", NOW)
        got = store.operator_change(s, store.PAUSED_BY_KEY)
    eng.dispose()
    assert (got["by"], got["host"]) == ("x?WARNING forged", "h?[2J")


def test_non_root_sudo_user_is_ignored(run, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "carol")
    monkeypatch.setenv("SUDO_UID", "5")
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    monkeypatch.setattr(os, "getgroups", lambda: [4321, 50])      # staff: an operator
    js(run("pause", "--json"))
    assert js(run("status", "--json"))["paused_by"].startswith("4321 (uid 4321) on ")


def test_pause_refused_for_a_non_operator(run, monkeypatch):
    """The rule itself (the real non-root run is in the integration test, with setpriv)."""
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    monkeypatch.setattr(os, "getegid", lambda: 4321)
    monkeypatch.setattr(os, "getgroups", lambda: [4321])
    for args in (("pause",), ("resume",), ("policy", "set", "equi"), ("policy", "reset")):
        err = one_line_error(run(*args), 1, "permission denied: you are 4321",
                             "only root or members of the operator group 'staff'")
        assert "sudo" in err
    monkeypatch.setattr(os, "getgroups", lambda: [4321, 50])      # staff
    assert js(run("pause", "--json"))["paused"]


def test_pause_refused_without_an_operator_group(tmp_path, built, monkeypatch):
    cfg = write_config(tmp_path / "nogroup.toml", built.url)
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    r = CliRunner().invoke(main, ["pause", "--config", str(cfg)], prog_name="malleable")
    one_line_error(r, 1, "only root may pause the daemon: no operator group is configured",
                   f"[operator] group in {cfg} is empty")
    # No config file at all: the message names the file to write, not "<defaults>".
    monkeypatch.delenv("MALLEABLE_CONFIG", raising=False)
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    r = CliRunner().invoke(main, ["pause", "--database-url", built.url], prog_name="malleable")
    err = one_line_error(r, 1, "no operator group is configured ([operator] group is empty)",
                         "/etc/malleable/malleable.toml (or the file named by --config")
    assert "<defaults>" not in err


# ---------------------------------------------------------------- policy


def test_policy_show_set_and_validation(run):
    doc = js(run("policy", "show", "--json"))
    assert (doc["name"], doc["resolved"], doc["source"]) == ("default", "pollux", "config")
    assert doc["effective_params"]["p"] == -1.0 and doc["changed"] is None
    doc = js(run("policy", "set", "hesrpt", "p=0.7", "p_from=samples", "--json"))
    assert (doc["name"], doc["params"], doc["source"], doc["changed"]) == \
        ("hesrpt", {"p": 0.7, "p_from": "samples"}, "operator", True)
    assert doc["effective_params"] == {"p": 0.7, "p_from": "samples", "risk": 0.0}
    assert doc["set_at"] is not None
    assert js(run("status", "--json"))["policy"]["name"] == "hesrpt"
    assert "hesrpt p=0.7 p_from=\"samples\"" in run("policy", "show").stdout
    one_line_error(run("policy", "set", "nope"), 2, "unknown policy 'nope'", "hesrpt")
    one_line_error(run("policy", "set", "hesrpt", "p=2"), 2, "p must be in (0, 1), got 2")
    one_line_error(run("policy", "set", "hesrpt", "q=1"), 2, "unknown parameter 'q'")
    one_line_error(run("policy", "set", "las", "continuous=3"), 2, "continuous = 3: expected")
    one_line_error(run("policy", "set", "hesrpt", "p"), 2, "'p': expected key=value")
    # a refused set changed nothing
    assert js(run("policy", "show", "--json"))["params"] == {"p": 0.7, "p_from": "samples"}
    # Stored as the policy holds them: an integer given for a number is a float.
    got = js(run("policy", "set", "gittins", "level_ratio=3", "window=4", "--json"))["params"]
    assert got == {"level_ratio": 3.0, "window": 4} and type(got["level_ratio"]) is float


def test_policy_reset_returns_to_the_configuration(run):
    assert js(run("policy", "reset", "--json"))["changed"] is False   # nothing was set
    run("policy", "set", "hesrpt", "p=0.7")
    doc = check_schema(js(run("policy", "reset", "--json")))
    assert (doc["name"], doc["params"], doc["source"], doc["changed"]) == \
        ("default", {}, "config", True)
    assert js(run("status", "--json"))["policy"]["source"] == "config"
    run("policy", "set", "equi")
    text = run("policy", "reset").stdout
    assert text.startswith("policy reset to the configuration's: default (= pollux)"), text
    assert "source: from the configuration" in text
    assert run("policy", "reset").stdout.startswith("policy unchanged: default")


def test_policy_list(run):
    doc = js(run("policy", "list", "--json"))
    names = [p["name"] for p in doc["policies"]]
    assert {"default", "equi", "hesrpt", "pollux", "static"} <= set(names)
    hes = next(p for p in doc["policies"] if p["name"] == "hesrpt")
    p = next(x for x in hes["params"] if x["name"] == "p")
    assert p["default"] is None and "speedup exponent" in p["doc"]
    assert next(x for x in doc["policies"] if x["name"] == "default")["alias_of"] == "pollux"
    text = run("policy", "list").stdout
    assert "default (active): alias of pollux" in text and "thresholds" in text
    # Every default as shown is what `policy set` takes (it showed Python's True, None,
    # 'goodput', which `policy set` refused or read as other strings).
    assert 'p_from     "goodput" | "samples"  "goodput"' in text
    assert "float | null           null" in text and "True" not in text
    for pol in doc["policies"]:
        for x in pol["params"]:
            shown = next(ln for ln in text.splitlines() if ln.split()[:1] == [x["name"]]
                         and json.dumps(x["default"]) in ln)
            assert parse_assignments([f"{x['name']}={json.dumps(x['default'])}"]) == \
                {x["name"]: x["default"]}, shown


def test_parse_assignments():
    assert parse_assignments(["p=0.7", "n=3", "b=true", "s=samples", "l=[1, 2]", "x=null",
                              "q='quoted'"]) == \
        {"p": 0.7, "n": 3, "b": True, "s": "samples", "l": [1, 2], "x": None, "q": "quoted"}


# ---------------------------------------------------------------- config


def test_config_show_effective_and_defaults(run, cfg):
    doc = js(run("config", "show", "--json"))
    assert doc["sections"]["daemon"]["lease_timeout_s"] == 60.0
    assert doc["sections"]["operator"]["group"] == "staff" and doc["source"] == str(cfg)
    text = run("config", "show").stdout
    assert tomllib.loads(text) == doc["sections"]     # the text view is the same TOML
    assert "lease_timeout_s = 60.0  # default 300.0" in text
    doc = js(run("config", "show", "--database-url", "postgresql+psycopg://u:secret@h/db",
                 "--json"))
    assert doc["sections"]["database"]["url"] == "postgresql+psycopg://u:***@h/db"
    d = js(run("config", "show", "--defaults", "--json", config=False))
    assert d["sections"]["metrics"]["keys"]["address"] == {
        "type": "string", "default": "", "doc": "host:port to serve /metrics on; empty = off; "
        "port 1..65535; \"[::1]:9464\" for IPv6, \":9464\" every interface", "choices": None}
    assert d["sections"]["slurm"]["keys"]["backend"]["choices"] == ["auto", "cli", "pyslurm"]
    # the commented defaults file, uncommented, is valid TOML holding every default
    text = run("config", "show", "--defaults", config=False).stdout
    body = "\n".join(x[1:] if re.match(r"^#\w+ = ", x) else x for x in text.splitlines())
    parsed = tomllib.loads(body)
    assert parsed == {n: {k: m["default"] for k, m in s["keys"].items()}
                      for n, s in d["sections"].items()}
    one_line_error(run("config", "show", "--markdown", config=False), 2, "--markdown")


def test_generated_docs_are_current():
    assert docgen.main(["--check"]) == 0, "run: python -m malleable.ops.docgen"
    md = CliRunner().invoke(main, ["config", "show", "--defaults", "--markdown"]).stdout
    assert md == (ROOT / "docs" / "configuration.md").read_text()


# ---------------------------------------------------------------- bad input


def test_unusable_database_or_configuration_is_exit_2(tmp_path, run, built):
    missing = write_config(tmp_path / "missing.toml", f"sqlite:///{tmp_path}/nope.db")
    for args in (("status",), ("job", "show", "1"), ("actions",), ("policy", "show"),
                 ("pause",)):
        r = CliRunner().invoke(main, [*args, "--config", str(missing)], prog_name="malleable")
        one_line_error(r, 2, "nope.db: no such database file")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    r = run("status", "--database-url", f"sqlite:///{junk}")
    one_line_error(r, 2, "not an SQLite database")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\npoll_interval_s = 'often'\n")
    r = CliRunner().invoke(main, ["status", "--config", str(bad)], prog_name="malleable")
    one_line_error(r, 2, "daemon.poll_interval_s = 'often': expected number")
    eng = make_engine(built.url)
    schema.downgrade(eng, schema.known_revisions()[0])
    eng.dispose()
    one_line_error(run("status"), 2, "is older than this malleable's", "malleable db upgrade")


# ---------------------------------------------------------------- shell completion


@pytest.mark.parametrize("words,cword,expect", [
    ("malleable pol", 1, "plain,policy"),
    ("malleable st", 1, "plain,status"),
    ("malleable policy set hes", 3, "plain,hesrpt"),
    ("malleable actions --li", 2, "plain,--limit"),
])
def test_shell_completion(words, cword, expect):
    env = {"_MALLEABLE_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(cword)}
    r = CliRunner().invoke(main, [], env=env, prog_name="malleable")
    assert expect in r.stdout.splitlines(), r.stdout


# ---------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_commands_on_postgresql(postgres_url, tmp_path, monkeypatch):
    """The same store on a real PostgreSQL server, named with --database-url; and the
    plan's scratch copy there is a transaction that is rolled back."""
    from sqlalchemy import select

    from malleable.db.models import Setting
    from malleable.ops.plan import scratch_sessions

    built = build_store(postgres_url)
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    cfg = write_config(tmp_path / "pg.toml", "sqlite:////nonexistent/unused.db")

    def run(*args):
        return CliRunner().invoke(main, [*args, "--config", str(cfg), "--database-url",
                                         postgres_url], prog_name="malleable")

    doc = js(run("status", "--json"))
    assert [j["job_id"] for j in doc["jobs"]] == ["101", "102"]
    assert doc["jobs"][0]["throughput"] == pytest.approx(1800.0)
    assert doc["database"].startswith("postgresql+psycopg://")
    assert doc["last_decision"]["id"] == built.decision_id
    assert js(run("job", "show", "101", "--json"))["progress"]["lines_stored"] == 24
    assert len(js(run("actions", "--json"))["actions"]) == 2
    assert js(run("pause", "--json"))["paused"]
    assert js(run("policy", "set", "las", "continuous=true", "--json"))["name"] == "las"
    assert js(run("status", "--json"))["paused"] is True
    config = effective_config(str(cfg), postgres_url)
    with open_store(config) as st:
        with scratch_sessions(st) as sessions:
            with sessions() as s, s.begin():
                store.set_paused(s, False)
                store.set_setting(s, "scratch", 1)
            with sessions() as s:
                assert store.is_paused(s) is False
        with st.sessions() as s:
            assert store.is_paused(s) is True
            assert s.scalar(select(Setting).where(Setting.key == "scratch")) is None


def test_status_counts_targets_of_jobs_that_have_not_ended(built, run):
    """The latest decision targeted 8 GPUs for job 101; once 101 has completed, those
    8 are no longer "targeted" (the header once summed every target of the decision)."""
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.upsert_jobs(s, [_job("101", JobState.COMPLETED, 4, comment=SPEC_101,
                                   name="resnet", restarts=1)],
                          T0 + timedelta(seconds=300), parse_spec=spec_as_dict)
    eng.dispose()
    doc = js(run("status", "--json"))
    assert doc["gpus"] == {"held": 0, "target": 0}
    assert "0 held by malleable jobs, 0 targeted" in run("status").stdout


def test_status_last_poll_is_the_daemon_s_recorded_poll(built, run):
    eng = make_engine(built.url, create=False)
    later = NOW - timedelta(seconds=3)
    with session_factory(eng)() as s, s.begin():
        store.set_setting(s, store.LAST_POLL_KEY, later.isoformat(), later)
    eng.dispose()
    doc = js(run("status", "--json"))
    assert doc["last_poll"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_status_flags_an_unusable_policy_and_a_decision_by_another(tmp_path, built, monkeypatch):
    """`status` read the policy from the file and said nothing when it named no policy
    (the daemon runs `static` then) or when the daemon's latest decision ran another."""
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)

    def status(policy: str):
        cfg = write_config(tmp_path / f"{policy}.toml", built.url, policy={"name": policy})
        return CliRunner().invoke(main, ["status", "--config", str(cfg)], prog_name="malleable")

    r = status("nosuch")
    assert r.exit_code == 0
    line = next(x for x in r.stdout.splitlines() if x.startswith("policy:"))
    # From the configuration: the daemon refuses to start with it (no fallback there).
    assert "PROBLEM: unknown policy 'nosuch'" in line and "does not start" in line
    assert "falls back" not in line
    # Set by an operator: the daemon replaces it by `static` at its next decision.
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.set_policy(s, "nosuch", {})
    eng.dispose()
    r = status("las")
    line = next(x for x in r.stdout.splitlines() if x.startswith("policy:"))
    assert "PROBLEM: unknown policy 'nosuch'" in line and "falls back to `static`" in line
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.clear_policy(s)
    eng.dispose()
    r = status("las")      # the store's latest decision was made by equi
    line = next(x for x in r.stdout.splitlines() if x.startswith("policy:"))
    assert "las" in line and "(the latest decision ran equi)" in line
    r = status("equi")
    line = next(x for x in r.stdout.splitlines() if x.startswith("policy:"))
    assert "latest decision ran" not in line and "PROBLEM" not in line
    cfg = write_config(tmp_path / "j.toml", built.url, policy={"name": "nosuch"})
    doc = check_schema(js(CliRunner().invoke(main, ["status", "--json", "--config", str(cfg)])))
    assert doc["policy_problem"].startswith("unknown policy 'nosuch'")


def test_status_calls_a_lease_held_by_a_gone_local_process_stale(run, built):
    """After `kill -9` status said healthy until the heartbeat aged past the lease timeout,
    although the holder names this host and a pid that no longer exists."""
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    eng = make_engine(built.url)
    now = datetime.now(UTC)
    acquire_lease(eng, f"{socket.gethostname()}:{gone.pid}", timeout_s=300, now=now)
    with session_factory(eng)() as s, s.begin():
        store.set_setting(s, store.LAST_POLL_KEY, now.isoformat(), now)
    eng.dispose()
    doc = check_schema(js(run("status", "--json")))
    assert doc["daemon"]["health"] == "stale" and doc["daemon"]["holder_gone"] is True
    r = run("status", "--check")
    assert r.exit_code == 1 and "its process is gone" in r.stdout


def test_plan_text_folds_many_jobs_that_share_a_reason():
    from malleable.ops.plan import _reason_lines

    rows = [{"job_id": "7", "reason": "no valid spec"}] + [
        {"job_id": str(100 + i), "reason": "waiting beyond the queue depth"} for i in range(30)]
    lines = _reason_lines(rows)
    assert lines == ["  7: no valid spec",
                     "  30 jobs (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, ...): "
                     "waiting beyond the queue depth"]
    assert _reason_lines(rows[:12]) == [f"  {x['job_id']}: {x['reason']}" for x in rows[:12]]


def test_fail_puts_a_multi_line_message_on_one_line():
    """`plan` without a controller printed squeue's four stderr lines as four lines."""
    import click

    from malleable.ops.output import fail

    @click.command("probe")
    def probe() -> None:
        fail("Slurm did not answer (squeue: error: one\nsqueue: error: two\n\n  squeue: fatal: x)", 1)

    r = CliRunner().invoke(probe, [])
    one_line_error(r, 1, "probe: error: Slurm did not answer (squeue: error: one; "
                         "squeue: error: two; squeue: fatal: x)")


def test_a_store_missing_a_table_is_one_error_line_not_a_traceback(run, built, tmp_path):
    """A store at head revision whose actions table was dropped (by hand, or a store this
    malleable did not make): `actions` printed SQLAlchemy's traceback, exit 1."""
    import sqlite3

    path = built.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE actions")
    one_line_error(run("actions"), 2, "malleable actions: error: the state store could not be "
                   "read: no such table: actions (a damaged store, or one this malleable did "
                   "not make: `malleable db current` names its revision)")


def test_job_show_of_an_array_id_names_its_tasks(built, run):
    """`job show 25` for an array whose tasks are 25_0 and 25_1 said only "never seen"."""
    from malleable.slurm.records import SlurmJob
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.upsert_jobs(s, [SlurmJob(job_id=f"25_{i}", job_id_num=26 + i, state=JobState.RUNNING,
                                       uid=1000, user="alice") for i in range(2)], T0)
    eng.dispose()
    one_line_error(run("job", "show", "25"), 2,
                   "job '25': not in the state store (never seen by the daemon, or pruned after "
                   "[retention] finished_job_days); an array's tasks are shown one by one: "
                   "25_0, 25_1")
    r = run("job", "show", "2")        # 25_0 is not a task of 2
    assert "array" not in r.output
