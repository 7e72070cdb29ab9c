"""Job names, comments, users and other text anyone can set reach an admin's terminal
only escaped (`malleable.ops.output.safe_text`), and the ``--json`` documents keep them
exactly.

Any Slurm user chooses their job's name and comment (``sbatch -J``, ``--comment``):
an escape sequence there (ESC [ ..., or the C1 CSI U+009B) would act on the terminal
of the admin who runs ``malleable status``, a carriage return or a line break would
overwrite a row or fake one, and a bidirectional override (U+202E) would reorder
what is shown. The commands run here in process through click's test runner on the
real ``malleable`` group, over a real SQLite store (`tests.unit.ops_store`) into which
jobs with such text were written by the store's own functions, as the daemon does.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.daemon.cycle import spec_as_dict
from malleable.db import store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job
from malleable.ops.output import dumps, safe_text, table
from malleable.slurm.records import JobState, SlurmNode
from tests.unit.ops_store import T0, _job, build_store, write_config

# Clear the screen, set the window title, red text; a carriage return and a line that
# fakes a row of `status`; a right-to-left override; a C1 CSI (bold).
NAME = "evil\x1b[2J\x1b]0;owned\x07\x1b[31m\rFAKE\u202egpj.exe\x9b1m\nFAKE 999 root RUNNING"
USER = "mallory\x1b[8m"
PARTITION = "gpu\u202e"
REASON = "Resources\r\x1b[2K\nFAKE reason"
# A valid spec after hostile text of the comment's own (the daemon keeps the comment).
COMMENT = "\x1b]0;pwned\x07\u202e nightly\n malleable:gpus=2-4,batch=256"
# An invalid spec whose error quotes the comment's text (an ESC) back.
BAD_COMMENT = "malleable:gpus=2-4 step=\x1b[2J\u202e\x9b"
NOTE = "note\x1b[2J\nFAKE 1  2026  x"
ERROR = "Slurm said \x9b31m\u202e\r"
DETAIL = "detail\x1b[5m\u2066\nFAKE event"
TARGET_REASON = "share\x1b[7m\u202e\n"

UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def raw_unsafe(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (all but the line breaks)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in UNSAFE]


def assert_terminal_safe(text: str, *visible: str) -> None:
    """No raw control, format or bidi character but line breaks, no faked line, and the
    ``visible`` escapes shown."""
    assert raw_unsafe(text) == [], (raw_unsafe(text), text)
    assert not [line for line in text.splitlines() if line.lstrip().startswith("FAKE")], text
    for v in visible:
        assert v in text, (v, text)


@pytest.fixture
def built(tmp_path):
    """The store of `tests.unit.ops_store` plus job 105 (malleable, running, hostile
    name, user, partition and comment, with an action, an event and a target whose
    texts are hostile) and job 106 (pending, an invalid spec that quotes an ESC, a
    hostile pending reason)."""
    b = build_store(tmp_path / "m.db")
    eng = make_engine(b.url, create=False)
    S = session_factory(eng)
    t = T0 + timedelta(seconds=260)
    with S() as s, s.begin():
        up = store.upsert_jobs(s, [
            _job("105", JobState.RUNNING, 2, comment=COMMENT, name=NAME),
            _job("106", JobState.PENDING, 2, comment=BAD_COMMENT, name=NAME),
        ], t, parse_spec=spec_as_dict)
        assert "\x1b" in up.spec_errors["106"]        # the error quotes the comment's ESC
    with S() as s, s.begin():
        # (`_job` fixes user, partition and reason; the rows take any text, as from Slurm.)
        for sid, reason in (("105", "None"), ("106", REASON)):
            row = store.get_job(s, sid)
            row.user, row.partition, row.reason = USER, PARTITION, reason
        ids = store.job_ids(s, ["105"])
        a = store.create_action(s, job_id=ids["105"], kind="resize", state="pending",
                                from_gpus=2, to_gpus=4, from_nodes=1, to_nodes=1, now=t)
        store.update_action(s, a.id, now=t, note=NOTE, last_error=ERROR)
        store.add_job_event(s, ids["105"], t, "checkpointed", DETAIL)
        store.record_decision(s, time=t, policy="equi", params={}, inputs_digest="y",
                              objective=1.0, duration_s=0.01, dry_run=False,
                              targets=[store.TargetIn(ids["105"], 4, 256, TARGET_REASON)])
        assert s.get(Job, ids["105"]).malleable
    eng.dispose()
    return b


@pytest.fixture
def run(tmp_path, built, monkeypatch):
    """Run ``malleable ARGS --config CFG`` in process; returns click's Result. As at a
    terminal: click strips ANSI sequences from what it prints elsewhere (``color=True``
    keeps them, so that a raw one would show here)."""
    cfg = write_config(tmp_path / "malleable.toml", built.url)
    monkeypatch.delenv("MALLEABLE_DATABASE_URL", raising=False)
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")

    def _run(*args: str):
        return CliRunner().invoke(main, [*args, "--config", str(cfg)], prog_name="malleable",
                                  color=True)
    return _run


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


# ---------------------------------------------------------------- the function


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[31mred", "\\x1b[31mred"),
    ("a\rb\nc\td", "a\\rb\\nc\\td"),
    ("\x00\x07\x7f\x9b\x9d", "\\x00\\x07\\x7f\\x9b\\x9d"),
    ("abc\u202edef\u202a\u202b\u202c\u202d", "abc\\u202edef\\u202a\\u202b\\u202c\\u202d"),
    ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f"
     "\\u061c"),
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
    ("line\u2028para\u2029next\x85", "line\\u2028para\\u2029next\\x85"),
    ("lone \udc9b surrogate", "lone \\udc9b surrogate"),
    ("tag \U000e0041", "tag \\U000e0041"),
    ("résumé 日本語 Ωmega", "résumé 日本語 Ωmega"),         # letters of any script are kept
    ("path\\x1b", "path\\x1b"),                          # a backslash is kept as it is
    ("", ""),
])
def test_safe_text_escapes_what_a_terminal_would_act_on(raw, shown):
    assert safe_text(raw) == shown
    assert safe_text(shown) == shown                    # escaping again changes nothing
    assert raw_unsafe(safe_text(raw)) == [] and "\n" not in safe_text(raw)


def test_safe_text_takes_any_value():
    assert (safe_text(None), safe_text(42), safe_text(1.5)) == ("None", "42", "1.5")


def test_table_cells_are_one_line_and_aligned():
    out = table(["NAME", "N"], [("a\nFAKE", 1), ("\x1b[2J", 22)], right=(1,)).splitlines()
    assert out == ["NAME      N", "a\\nFAKE   1", "\\x1b[2J  22"]


def test_json_text_escapes_c1_and_parses_to_the_same_document():
    """C1 controls, and (a new-user tester: `actions --json` on a terminal showed them raw)
    bidi overrides, zero-width characters and line separators are written as escapes;
    the document parses to exactly the same values."""
    doc = {"name": NAME, "n": [USER, ERROR], "é": "日本", "z": "a\u200bb\u2028c\U000e0041"}
    text = dumps(doc)
    assert json.loads(text) == doc
    assert raw_unsafe(text) == []
    assert "\\u009b" in text and "\\u001b" in text and "日本" in text
    assert "\\u202e" in text and "\\u200b" in text and "\\u2028" in text
    assert "\\udb40\\udc41" in text                    # a tag character, as a surrogate pair


def test_emit_escapes_what_a_text_view_left_raw_but_its_line_breaks():
    import click

    from malleable.ops.output import emit

    @click.command("probe")
    def probe() -> None:
        emit({"schema": "x", "name": NAME}, False, lambda d: f"name: {d['name']}\nend\n")

    out = CliRunner().invoke(probe, [], color=True).stdout
    assert raw_unsafe(out) == [] and out.endswith("\nend\n")
    assert out.startswith("name: evil\\x1b[2J") and "\\u202e" in out


# ---------------------------------------------------------------- the commands


def test_status_shows_hostile_names_and_users_escaped(run):
    out = ok(run("status"))
    # (the name's escaped text cut to the table's cell width, `output.CELL_WIDTH`)
    assert_terminal_safe(out, "evil\\x1b[2J\\x1b]0;owned\\x07\\x1b[31m\\rFAKE\\u202e…",
                         "mallory\\x1b[8m")
    row = next(line for line in out.splitlines() if line.startswith("105 "))
    assert "RUNNING" in row and "resize 2->4: pending" in row
    # The table's columns still line up: the header's next column starts where the row's does.
    header = next(line for line in out.splitlines() if line.startswith("JOBID"))
    assert row.index("mallory") == header.index("USER")


def test_status_json_keeps_the_texts_exactly(run):
    out = ok(run("status", "--json"))
    assert "\x1b" not in out and "\x9b" not in out and "\r" not in out
    job = {j["job_id"]: j for j in json.loads(out)["jobs"]}["105"]
    assert (job["name"], job["user"]) == (NAME, USER)
    assert job["last_action"]["note"] == NOTE and job["last_action"]["last_error"] == ERROR
    assert job["target_reason"] == TARGET_REASON


def test_job_show_escapes_name_user_partition_comment_and_its_tables(run):
    out = ok(run("job", "show", "105", "--gpus-per-node", "4"))
    assert_terminal_safe(out, "job 105 (evil\\x1b[2J", "user mallory\\x1b[8m",
                         "partition gpu\\u202e",
                         "spec:      \\x1b]0;pwned\\x07\\u202e nightly\\n malleable:gpus=2-4",
                         "Slurm said \\x9b31m\\u202e\\r", "share\\x1b[7m\\u202e\\n",
                         "detail\\x1b[5m\\u2066\\nFAKE event")
    assert len([x for x in out.splitlines() if x.startswith("job 105 ")]) == 1
    doc = json.loads(ok(run("job", "show", "105", "--json")))
    assert (doc["job"]["name"], doc["job"]["user"], doc["job"]["partition"]) == \
        (NAME, USER, PARTITION)
    assert doc["spec"]["text"] == COMMENT and doc["actions"][-1]["note"] == NOTE
    assert doc["events"][-1]["detail"] == DETAIL and doc["targets"][0]["reason"] == TARGET_REASON


def test_job_show_escapes_an_invalid_spec_its_error_and_the_pending_reason(run):
    out = ok(run("job", "show", "106"))
    assert_terminal_safe(out, "spec:      malleable:gpus=2-4 step=\\x1b[2J\\u202e\\x9b",
                         "[INVALID: malleable spec: step=\\x1b", "reason Resources\\r\\x1b[2K"
                         "\\nFAKE reason")
    doc = json.loads(ok(run("job", "show", "106", "--json")))
    assert doc["spec"]["text"] == BAD_COMMENT and "\x1b" in doc["spec"]["error"]
    assert doc["job"]["reason"] == REASON


def test_job_show_plots_a_name_that_is_not_mathtext(run, built, tmp_path):
    """A job named ``$\\foo$`` failed ``--plot`` (matplotlib parsed it as mathtext)."""
    eng = make_engine(built.url, create=False)
    with session_factory(eng)() as s, s.begin():
        store.get_job(s, "101").name = "$\\foo$ \x1b[2J"
    eng.dispose()
    png = tmp_path / "c.png"
    out = ok(run("job", "show", "101", "--gpus-per-node", "4", "--plot", str(png)))
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert_terminal_safe(out, "($\\foo$ \\x1b[2J,")


def test_actions_escapes_notes_and_errors(run):
    out = ok(run("actions"))
    assert_terminal_safe(out, "Slurm said \\x9b31m\\u202e\\r; note\\x1b[2J\\nFAKE 1")
    doc = json.loads(ok(run("actions", "--json")))
    assert (doc["actions"][-1]["last_error"], doc["actions"][-1]["note"]) == (ERROR, NOTE)


def test_an_error_message_is_escaped(run):
    r = run("job", "show", "9\x1b[2J\u202e")
    assert r.exit_code == 2
    assert_terminal_safe(r.stderr, "job '9\\x1b[2J\\u202e': not in the state store")
    r = run("actions", "--job", "9\x9b1m\nFAKE")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert_terminal_safe(r.stderr, "--job 9\\x9b1m")


class HostileSlurm:
    """A Slurm port that lists job 105 again and a new job 107 whose invalid spec quotes
    an ESC (the daemon code logs it: a warning of ``plan``), on one node of 4 GPUs."""

    def __init__(self) -> None:
        self.rpc_count = 0
        self.parse_errors: list = []

    def jobs(self):
        self.rpc_count += 1
        return [_job("105", JobState.RUNNING, 2, comment=COMMENT, name=NAME),
                _job("107", JobState.PENDING, 2, comment=BAD_COMMENT, name=NAME)]

    def nodes(self):
        self.rpc_count += 1
        return [SlurmNode(name="n1", state="mixed", partitions=("gpu",), gpus=4,
                          gpus_allocated=2)]

    def job(self, job_id):
        self.rpc_count += 1
        return None


def test_plan_escapes_names_and_the_daemon_codes_warnings(run, monkeypatch):
    import malleable.ops.plan as plan_module

    monkeypatch.setattr(plan_module, "connect_once", lambda _config: HostileSlurm())
    out = ok(run("plan"))
    assert "warnings:" in out and "105 " in out
    assert_terminal_safe(out, "evil\\x1b[2J", "malleable spec: step=\\x1b")
    doc = json.loads(ok(run("plan", "--json")))
    assert {j["job_id"]: j["name"] for j in doc["jobs"]}["105"] == NAME
    assert any("\x1b" in w for w in doc["warnings"])


def test_a_long_cell_is_cut_so_one_name_cannot_widen_every_row():
    """One job named with 200,000 characters padded every row of `status` to 200,090
    columns (a new-user tester): cells but the last column's are cut at CELL_WIDTH."""
    from malleable.ops.output import CELL_WIDTH

    out = table(["JOBID", "NAME", "REASON"], [("1", "L" * 200_000, "R" * 300),
                                              ("2", "bert", "ok")])
    lines = out.splitlines()
    assert lines[1] == "1      " + "L" * (CELL_WIDTH - 1) + "…  " + "R" * 300
    assert lines[2] == "2      bert" + " " * (CELL_WIDTH - 4) + "  ok"
