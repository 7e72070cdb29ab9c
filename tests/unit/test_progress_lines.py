"""The daemon-side line parser: every rejection reason, ordering, and property tests."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.progress.lines import (
    Cursor,
    LineValidator,
    ProgressRecord,
    Reason,
    Rejection,
    check_order,
    parse_line,
    split_lines,
)
from malleable.progress.reporter import MAX_BATCH, MAX_LINE_BYTES, Reporter

NOW = 1_700_000_000.0
GOOD = {"v": 1, "t": NOW - 5, "job": "12", "event": "progress", "step": 10, "samples": 640,
        "gpus": 2, "nodes": 1, "batch": 64, "restart": 0, "metric": 1.5}


def enc(doc) -> bytes:
    return json.dumps(doc).encode()


def with_(**kw) -> bytes:
    return enc({**GOOD, **kw})


def without(key) -> bytes:
    return enc({k: v for k, v in GOOD.items() if k != key})


def test_good_line_becomes_a_typed_record():
    rec = parse_line(enc(GOOD) + b"\n", now=NOW, job_id="12")
    assert rec == ProgressRecord(t=NOW - 5, job="12", event="progress", step=10, samples=640,
                                 gpus=2, nodes=1, batch=64, restart=0, metric=1.5)


def test_reporter_output_is_accepted(tmp_path):
    rep = Reporter("5_1", tmp_path, gpus=4, nodes=1, batch_size=32, install_handler=False,
                   clock=lambda: NOW)
    rep.started()
    rep.log(3, 96, metric=0.25, grad_sqr=1.0, grad_var=2.0)
    rep.checkpointed("/scratch/ck")
    rep.finished()
    v = LineValidator("5_1")
    recs = [v.feed(line, NOW) for line in (tmp_path / "5_1.jsonl").read_bytes().splitlines()]
    assert [r.event for r in recs] == ["started", "progress", "checkpointed", "finished"]
    assert recs[1].grad_var == 2.0 and recs[2].path == "/scratch/ck"


@pytest.mark.parametrize("line, reason", [
    (b"x" * (MAX_LINE_BYTES + 1), Reason.TOO_LONG),
    (b"{not json", Reason.NOT_JSON),
    (b"\xff\xfe{}", Reason.NOT_JSON),
    (b"[1, 2]", Reason.NOT_OBJECT),
    (b"42", Reason.NOT_OBJECT),
    (without("v"), Reason.UNKNOWN_SCHEMA),
    (with_(v=2), Reason.UNKNOWN_SCHEMA),
    (with_(v="1"), Reason.UNKNOWN_SCHEMA),
    (with_(v=True), Reason.UNKNOWN_SCHEMA),
    (without("step"), Reason.MISSING_FIELD),
    (without("restart"), Reason.MISSING_FIELD),
    (with_(event="checkpointed"), Reason.MISSING_FIELD),
    (with_(step="10"), Reason.BAD_TYPE),
    (with_(step=10.0), Reason.BAD_TYPE),
    (with_(gpus=True), Reason.BAD_TYPE),
    (with_(t="now"), Reason.BAD_TYPE),
    (with_(metric="high"), Reason.BAD_TYPE),
    (with_(job=12), Reason.BAD_TYPE),
    (with_(path=["a"]), Reason.BAD_TYPE),
    (with_(metric=float("nan")), Reason.NAN_OR_INF),
    (with_(grad_var=float("inf")), Reason.NAN_OR_INF),
    (enc(GOOD).replace(b'"metric": 1.5', b'"metric": -Infinity'), Reason.NAN_OR_INF),
    (enc(GOOD).replace(b'"metric": 1.5', b'"metric": 1e999'), Reason.NAN_OR_INF),
    (enc(GOOD).replace(b'"metric": 1.5', b'"metric": ' + b"9" * 400), Reason.NAN_OR_INF),
    (with_(step=-1), Reason.NEGATIVE_STEP),
    (with_(samples=-5), Reason.NEGATIVE_STEP),
    (with_(gpus=-1), Reason.BAD_VALUE),
    (with_(nodes=0), Reason.BAD_VALUE),
    (with_(batch=0), Reason.BAD_VALUE),
    (with_(step=2**63), Reason.BAD_VALUE),
    (with_(event="paused"), Reason.BAD_VALUE),
    (with_(job=""), Reason.BAD_VALUE),
    (with_(t=-1), Reason.BAD_VALUE),
    (with_(event="checkpointed", path=""), Reason.BAD_VALUE),
    (with_(t=NOW + 3600), Reason.FUTURE_TIME),
    (with_(job="13"), Reason.WRONG_JOB),
])
def test_each_rejection_reason(line, reason):
    got = parse_line(line, now=NOW, max_future_s=300, job_id="12")
    assert isinstance(got, Rejection), got
    assert got.reason == reason, got
    assert len(got.detail) <= 200


def test_slightly_future_time_is_tolerated_for_clock_skew():
    assert isinstance(parse_line(with_(t=NOW + 100), now=NOW, max_future_s=300), ProgressRecord)


def rec(**kw) -> ProgressRecord:
    base = dict(t=NOW, job="1", event="progress", step=10, samples=100, gpus=1, nodes=1,
                batch=10, restart=0)
    return ProgressRecord(**{**base, **kw})


def test_order_rules():
    last = Cursor(restart=1, step=10, samples=100)
    assert check_order(rec(restart=1, step=10), last) is None
    assert check_order(rec(restart=1, step=9), last).reason == Reason.DECREASING_STEP
    assert check_order(rec(restart=1, samples=99), last).reason == Reason.DECREASING_SAMPLES
    assert check_order(rec(restart=0, step=20), last).reason == Reason.STALE_RESTART
    # A requeue resumes from the checkpoint, which may be behind the last progress line.
    assert check_order(rec(restart=2, step=5, samples=50), last) is None
    # A restart without Slurm (same count) announces itself with `started`.
    assert check_order(rec(restart=1, step=5, samples=50, event="started"), last) is None
    assert check_order(rec(step=0, samples=0), None) is None


def test_a_restart_count_above_slurms_is_refused_and_keeps_the_run_open():
    """A job that writes its own attempt counter as ``restart`` (999) used to open a run
    no real line could follow: every later line of the true run was stale_restart."""
    last = Cursor(restart=1, step=10, samples=100)
    got = check_order(rec(restart=999, step=11), last, max_restart=2)
    assert got.reason == Reason.FUTURE_RESTART and "restart=999 > 2" in got.detail
    assert check_order(rec(restart=2, step=5, samples=50), last, max_restart=2) is None
    assert check_order(rec(restart=999, step=11), None, max_restart=0).reason == \
        Reason.FUTURE_RESTART
    assert check_order(rec(restart=999, step=11), last) is None   # no bound given
    v = LineValidator("12", max_restart=1)
    assert v.feed(with_(step=10, restart=7), NOW).reason == Reason.FUTURE_RESTART
    assert v.last is None
    assert isinstance(v.feed(with_(step=11), NOW), ProgressRecord)
    assert v.last.restart == 0 and v.last.step == 11


def test_a_batch_above_the_bound_is_a_bad_value():
    """The spec's bound (2**31 - 1 samples) holds for a line's batch too: with no batch
    in the spec, the first line's batch is m0."""
    assert isinstance(parse_line(with_(batch=MAX_BATCH), now=NOW), ProgressRecord)
    got = parse_line(with_(batch=MAX_BATCH + 1), now=NOW)
    assert got.reason == Reason.BAD_VALUE and got.detail == f"batch={MAX_BATCH + 1}"
    with pytest.raises(ValueError, match=r"batch_size=2147483648: expected an integer in "
                                         r"\[1, 2147483647\]"):
        Reporter("1", "/tmp", batch_size=MAX_BATCH + 1)


def test_a_cursor_above_the_bound_does_not_hold_the_job_back():
    """A bogus restart (999) stored before future_restart existed comes back as the
    cursor after a daemon restart; the job's real lines then start a new run instead
    of being stale_restart for ever, and lines beyond the bound are still refused."""
    bogus = Cursor(restart=999, step=11, samples=110, t=NOW)
    assert check_order(rec(restart=1, step=3, samples=30, t=NOW - 60), bogus,
                       max_restart=2) is None
    assert check_order(rec(restart=1, step=3), bogus).reason == Reason.STALE_RESTART
    assert check_order(rec(restart=3, step=3), bogus, max_restart=2).reason == \
        Reason.FUTURE_RESTART
    v = LineValidator("12", last=bogus, max_restart=1)
    assert isinstance(v.feed(with_(step=2, samples=20), NOW), ProgressRecord)
    assert v.last.restart == 0 and v.last.step == 2
    assert v.feed(with_(step=1, samples=10), NOW).reason == Reason.DECREASING_STEP


def test_validator_keeps_the_cursor_of_accepted_lines_only():
    v = LineValidator("12")
    assert isinstance(v.feed(with_(step=10), NOW), ProgressRecord)
    assert v.feed(with_(step=9), NOW).reason == Reason.DECREASING_STEP
    assert v.feed(with_(step=11, metric=float("nan")), NOW).reason == Reason.NAN_OR_INF
    assert v.last == Cursor(0, 10, 640, NOW - 5)
    assert isinstance(v.feed(with_(step=12, samples=700), NOW), ProgressRecord)
    assert v.last == Cursor(0, 12, 700, NOW - 5)


def test_time_must_not_go_back_within_a_run():
    """A line stamped before the run's last (t=1.0 in a running job's file) is refused:
    accepted, it started the run in 1970 and cut the fitted goodput 40-fold (a helper
    on the harness). A new run, or a cursor restored without a time, checks nothing."""
    last = Cursor(restart=1, step=10, samples=100, t=NOW)
    assert check_order(rec(restart=1, step=11, samples=110, t=NOW), last) is None
    got = check_order(rec(restart=1, step=11, samples=110, t=1.0), last)
    assert got.reason == Reason.DECREASING_TIME and "t=1.000 < " in got.detail
    assert check_order(rec(restart=1, step=5, event="started", t=NOW - 1), last).reason == \
        Reason.DECREASING_TIME
    assert check_order(rec(restart=2, step=0, samples=0, t=NOW - 60), last) is None
    assert check_order(rec(restart=1, step=11, samples=110, t=1.0),
                       Cursor(restart=1, step=10, samples=100)) is None
    assert check_order(rec(restart=1, step=11, samples=110, t=1.0), last,
                       check_time=False) is None
    v = LineValidator("12")
    assert isinstance(v.feed(with_(step=10, t=NOW), NOW), ProgressRecord)
    assert v.feed(with_(step=11, t=NOW - 5), NOW).reason == Reason.DECREASING_TIME
    assert isinstance(v.feed(with_(step=11, t=NOW + 5), NOW), ProgressRecord)


def test_split_lines_keeps_the_partial_tail():
    assert split_lines(b'a\n\nb\r\n  \nc') == ([b"a", b"b\r"], b"c")
    assert split_lines(b"a\n") == ([b"a"], b"")
    assert split_lines(b"") == ([], b"")


# --- property tests ---------------------------------------------------------------------------

@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_give_a_record_or_a_known_reason(data):
    got = parse_line(data, now=NOW, job_id="12")
    assert isinstance(got, (ProgressRecord, Rejection))
    if isinstance(got, Rejection):
        assert got.reason in Reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                      children, max_size=3),
    max_leaves=8)


@settings(max_examples=1000, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["path", "grad_sqr", "x"]), json_values,
                       max_size=4))
def test_any_field_value_gives_a_record_or_a_known_reason(changes):
    doc = {**GOOD, **changes}
    got = parse_line(json.dumps(doc).encode(), now=NOW, job_id="12")
    if isinstance(got, ProgressRecord):
        assert type(got.step) is int and got.step >= 0 and got.batch >= 1
        assert got.t <= NOW + 300 and got.job == "12"
    else:
        assert got.reason in Reason


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(step=st.integers(0, 2**63 - 1), samples=st.integers(0, 2**63 - 1),
       gpus=st.integers(0, 4096), nodes=st.integers(1, 1024), batch=st.integers(1, MAX_BATCH),
       restart=st.integers(0, 10**6), metric=st.none() | finite,
       event=st.sampled_from(["started", "progress", "finished"]),
       t=st.floats(0, NOW + 299, allow_nan=False))
def test_valid_lines_round_trip(step, samples, gpus, nodes, batch, restart, metric, event, t):
    doc = {"v": 1, "t": t, "job": "9_3", "event": event, "step": step, "samples": samples,
           "gpus": gpus, "nodes": nodes, "batch": batch, "restart": restart}
    if metric is not None:
        doc["metric"] = metric
    got = parse_line(json.dumps(doc).encode(), now=NOW, job_id="9_3")
    assert got == ProgressRecord(t=t, job="9_3", event=event, step=step, samples=samples,
                                 gpus=gpus, nodes=nodes, batch=batch, restart=restart,
                                 metric=metric)
