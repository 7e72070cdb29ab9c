"""The malleable spec: grammar, defaults, errors naming field and value, round trip."""

from __future__ import annotations

import dataclasses
import json
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleable.progress.reporter import MAX_BATCH
from malleable.spec import (
    KNOWN_KEYS,
    SIGNAL_TARGETS,
    SIGNALS,
    MalleableSpec,
    SpecError,
    find_spec,
    format_spec,
    parse_spec,
    replace_spec,
)

ISSUE_EXAMPLE = "malleable:gpus=2-16,step=4,signal=USR1,grace=120,shrink=inplace,target_steps=50000,batch=256"


def test_issue_example_parses_to_every_field():
    s = parse_spec(ISSUE_EXAMPLE)
    assert s == MalleableSpec(min_gpus=2, max_gpus=16, step=4, signal="USR1", grace_s=120.0,
                              shrink_inplace=True, target_steps=50000, batch_size=256)


def test_defaults_are_documented_values():
    s = parse_spec("malleable:gpus=1-8")
    assert (s.step, s.signal, s.signal_target, s.grace_s, s.shrink_inplace, s.metric_goal) == \
        (1, "USR1", "batch", 120.0, False, "max")
    assert s.target_steps is s.target_samples is s.target_epochs is s.batch_size is None
    assert s.model is s.restart_cost_s is s.target_metric is None


def test_all_fields_and_aliases():
    text = ("malleable:gpus=4,step=2,signal=SIGusr2,signal_target=FULL,grace=1.5m,shrink=requeue,"
            "target_samples=1000000,target_epochs=90,samples_per_epoch=50000,"
            "target_metric=0.94,metric_goal=MIN,batch_size=128,max_batch_size=4096,"
            "max_local_batch_size=256,model=cifar10,restart_cost_s=45s")
    s = parse_spec(text)
    assert s.min_gpus == s.max_gpus == 4
    assert s.signal == "USR2" and s.signal_target == "full" and s.grace_s == 90.0 and s.shrink_inplace is False
    assert (s.target_samples, s.target_epochs, s.samples_per_epoch) == (1000000, 90, 50000)
    assert s.target_metric == 0.94 and s.metric_goal == "min"
    assert (s.batch_size, s.max_batch_size, s.max_local_batch_size) == (128, 4096, 256)
    assert s.model == "cifar10" and s.restart_cost_s == 45.0
    assert parse_spec(format_spec(s)) == s


@pytest.mark.parametrize("comment", [
    "train resnet " + ISSUE_EXAMPLE + " owner=alice",
    ISSUE_EXAMPLE + ", note",
    f'"{ISSUE_EXAMPLE}"',
    "x|" + ISSUE_EXAMPLE,
    ISSUE_EXAMPLE.replace(",", ";"),
    ISSUE_EXAMPLE.replace(",", ", "),
    ISSUE_EXAMPLE.upper().replace("MALLEABLE:", "Malleable:").replace("INPLACE", "inplace"),
])
def test_spec_coexists_with_other_text_and_separators(comment):
    assert parse_spec(comment) == parse_spec(ISSUE_EXAMPLE)


@pytest.mark.parametrize("comment", [None, "", "just a comment", "notmalleable:gpus=2",
                                     "see https://x/malleable:gpus"])
def test_no_spec_is_none(comment):
    assert parse_spec(comment) is None


@pytest.mark.parametrize("text, field, value", [
    ("malleable:gpus=16-2", "gpus", "16-2"),
    ("malleable:gpus=two", "gpus", "two"),
    ("malleable:gpus=0-4", "gpus", "0"),
    ("malleable:gpus=2-4,step=0", "step", "0"),
    ("malleable:gpus=2-4,step=1.5", "step", "1.5"),
    ("malleable:gpus=2-4,signal=KILL", "signal", "KILL"),
    ("malleable:gpus=2-4,signal=FOO", "signal", "FOO"),
    ("malleable:gpus=2-4,grace=-5", "grace", "-5"),
    ("malleable:gpus=2-4,signal_target=all", "signal_target", "all"),
    ("malleable:gpus=2-4,grace=5d", "grace", "5d"),
    ("malleable:gpus=2-4,shrink=maybe", "shrink", "maybe"),
    ("malleable:gpus=2-4,target_metric=nan", "target_metric", "nan"),
    ("malleable:gpus=2-4,target_metric=inf", "target_metric", "inf"),
    ("malleable:gpus=2-4,metric_goal=up", "metric_goal", "up"),
    ("malleable:gpus=2-4,batch=512,max_batch=256", "max_batch", 256),
    # Above 2**31 - 1 samples: batch=2**63-1 came out of the estimators as -2**63.
    ("malleable:gpus=1-4,batch=9223372036854775807", "batch", 9223372036854775807),
    ("malleable:gpus=1-4,batch=64,max_batch=2147483648", "max_batch", 2147483648),
    ("malleable:gpus=1-4,max_local_batch=2147483648", "max_local_batch", 2147483648),
    # Batch limits that no size of the range can run with: the job would be held for ever.
    ("malleable:gpus=2-2,max_batch=1", "max_batch", 1),
    ("malleable:gpus=2-4,batch=1", "batch", 1),
    ("malleable:gpus=1-4,batch=64,max_local_batch=8", "max_local_batch", 8),
    ("malleable:gpus=2-8,step=3,batch=4,max_local_batch=1,max_batch=4", "max_batch", 4),
    ("malleable:gpus=2-4,model=a/b", "model", "a/b"),
    ("malleable:gpus=2-4,colour=red", "colour", "red"),
    ("malleable:gpus=2-4,step=2,step=4", "step", "4"),
    ("malleable:gpus=2-4,target_steps=99999999999999999999", "target_steps",
     "99999999999999999999"),
    ("malleable:step=4", "gpus", None),
])
def test_errors_name_field_and_value(text, field, value):
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert info.value.field == field
    assert info.value.value == value
    assert f"{field}" in str(info.value)
    if value is not None:
        assert str(value) in str(info.value)


def test_two_specs_and_empty_spec_are_errors():
    with pytest.raises(SpecError, match="more than one"):
        parse_spec("malleable:gpus=2 malleable:gpus=4")
    with pytest.raises(SpecError, match="no key=value"):
        parse_spec("malleable: rigid")


def test_constructor_validates_with_the_same_messages():
    with pytest.raises(SpecError) as info:
        MalleableSpec(min_gpus=4, max_gpus=2)
    assert info.value.field == "gpus"
    with pytest.raises(SpecError) as info:
        MalleableSpec(min_gpus=1, max_gpus=2, grace_s=float("nan"))
    assert info.value.field == "grace"
    with pytest.raises(SpecError):
        MalleableSpec(min_gpus=1, max_gpus=2, step=True)


def test_batch_limits_are_refused_only_when_no_size_of_the_range_fits():
    """A size k needs k <= the largest global batch and k * max_local_batch >= batch."""
    # The sizes are min_gpus and the multiples of step above it (2-8 step=3: 2, 3, 6).
    ok = ["malleable:gpus=1-8,batch=64,max_local_batch=8",           # k = 8
          "malleable:gpus=2-8,step=3,batch=4,max_local_batch=1,max_batch=6",   # k = 6
          "malleable:gpus=1-8,step=4,batch=16,max_local_batch=2",    # k = 8
          "malleable:gpus=2-16,step=4,batch=256,max_local_batch=16",  # k = 16
          "malleable:gpus=1-8,step=4,batch=4,max_local_batch=1",     # k = 4
          "malleable:gpus=1-4,batch=1", "malleable:gpus=4-8,max_batch=4",
          "malleable:gpus=2-2,max_local_batch=1"]                    # batch from progress
    for text in ok:
        assert parse_spec(text) is not None, text
    with pytest.raises(SpecError, match=r"malleable spec: max_batch=5: a global batch of at "
                                        r"most 5 cannot give each of 6 GPUs a sample, and 6 is "
                                        r"the smallest usable size of gpus=2-8 step=3"):
        parse_spec("malleable:gpus=2-8,step=3,batch=4,max_local_batch=1,max_batch=5")
    # 3-7 step=4 allows 3 and 4 GPUs, 6 and 8 samples at 2 per GPU: fewer than 10.
    with pytest.raises(SpecError, match=r"max_local_batch=2: batch=10 needs at least 5 GPUs"):
        parse_spec("malleable:gpus=3-7,step=4,batch=10,max_local_batch=2")
    with pytest.raises(SpecError, match=r"max_local_batch=8: batch=64 needs at least 8 GPUs "
                                        r"at this per-GPU limit, more than gpus=1-4 allows"):
        MalleableSpec(min_gpus=1, max_gpus=4, batch_size=64, max_local_batch_size=8)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(0, 40), st.integers(1, 12), st.integers(1, 400),
       st.integers(1, 64))
def test_smallest_usable_size_is_the_first_allowed_size_that_holds_the_batch(
        lo, extra, step, batch, local):
    """Against a brute force over `allowed_gpus`: a size k holds the batch (k * local
    >= batch) and gives each GPU a sample (k <= batch); a spec none fits is refused."""
    sizes = MalleableSpec(min_gpus=lo, max_gpus=lo + extra, step=step).allowed_gpus()
    holds = [k for k in sizes if k * local >= batch]
    if holds and holds[0] <= batch:
        spec = MalleableSpec(min_gpus=lo, max_gpus=lo + extra, step=step, batch_size=batch,
                             max_local_batch_size=local)
        assert spec.smallest_usable_gpus() == holds[0]
    else:
        with pytest.raises(SpecError):
            MalleableSpec(min_gpus=lo, max_gpus=lo + extra, step=step, batch_size=batch,
                          max_local_batch_size=local)


def test_allowed_gpus_match_feasibility_rule():
    assert parse_spec("malleable:gpus=2-16,step=4").allowed_gpus() == [2, 4, 8, 12, 16]
    assert parse_spec("malleable:gpus=3-9,step=3").allowed_gpus() == [3, 6, 9]
    assert parse_spec("malleable:gpus=1-4").allowed_gpus() == [1, 2, 3, 4]


def test_replace_spec_keeps_other_text():
    s = parse_spec("malleable:gpus=2-8")
    assert replace_spec("owner=alice", s) == "owner=alice malleable:gpus=2-8"
    assert replace_spec("a malleable:gpus=1,step=1 b", s) == "a malleable:gpus=2-8 b"
    assert replace_spec("a malleable:gpus=1 b", None) == "a  b"
    assert replace_spec("", s) == "malleable:gpus=2-8"


def test_format_has_no_blanks_and_short_keys():
    s = MalleableSpec(min_gpus=2, max_gpus=16, step=4, grace_s=30, batch_size=256,
                      max_local_batch_size=64, restart_cost_s=12.5, target_metric=1e-5)
    text = format_spec(s)
    assert text == ("malleable:gpus=2-16,step=4,grace=30,target_metric=1e-05,batch=256,"
                    "max_local_batch=64,restart_cost=12.5")
    assert parse_spec(text) == s


# --- property tests ---------------------------------------------------------------------------

ints = st.integers(min_value=1, max_value=2**63 - 1)
opt_ints = st.none() | ints
seconds = st.floats(min_value=0, max_value=7 * 86400, allow_nan=False, allow_infinity=False)


@st.composite
def specs(draw) -> MalleableSpec:
    lo = draw(st.integers(1, 4096))
    hi = draw(st.integers(lo, 8192))
    # Batch limits with which some size fits (`_check_some_size_fits`): batch >= lo, and a
    # per-GPU limit that holds the batch on lo GPUs.
    batch = draw(st.none() | st.integers(lo, MAX_BATCH))
    max_batch = draw(st.none() | st.integers(batch or lo, MAX_BATCH))
    max_local = draw(st.none() | st.integers(-(-(batch or 1) // lo), MAX_BATCH))
    return MalleableSpec(
        min_gpus=lo, max_gpus=hi, step=draw(st.integers(1, 64)),
        signal=draw(st.sampled_from(SIGNALS)),
        signal_target=draw(st.sampled_from(SIGNAL_TARGETS)), grace_s=draw(seconds),
        shrink_inplace=draw(st.booleans()), target_steps=draw(opt_ints),
        target_samples=draw(opt_ints), target_epochs=draw(opt_ints),
        samples_per_epoch=draw(opt_ints),
        target_metric=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False)),
        metric_goal=draw(st.sampled_from(["max", "min"])), batch_size=batch,
        max_batch_size=max_batch, max_local_batch_size=max_local,
        model=draw(st.none() | st.text(string.ascii_letters + string.digits + "_.-",
                                      min_size=1, max_size=64)),
        restart_cost_s=draw(st.none() | seconds))


@settings(max_examples=300, deadline=None)
@given(specs())
def test_format_parse_round_trip(spec):
    assert parse_spec(format_spec(spec)) == spec
    assert MalleableSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec


comment_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(specs(), comment_text, comment_text)
def test_spec_found_among_other_text(spec, before, after):
    comment = f"{before} {format_spec(spec)} {after}"
    if comment.lower().count("malleable:") != 1:
        return  # the surrounding text holds a prefix of its own: covered by the next test
    assert parse_spec(comment) == spec


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200) | st.builds(lambda a, b: f"{a}malleable:{b}", st.text(max_size=20),
                                          st.text(max_size=80)))
def test_parser_never_raises_anything_but_spec_error(text):
    try:
        result = parse_spec(text)
    except SpecError as exc:
        assert str(exc).startswith("malleable spec:")
        assert exc.field == "" or exc.field in KNOWN_KEYS or exc.field.isidentifier()
        return
    assert result is None or isinstance(result, MalleableSpec)
    if result is not None:
        span = find_spec(text)
        assert span is not None and parse_spec(text[span[0]:span[1]]) == result


@settings(max_examples=200, deadline=None)
@given(specs(), st.sampled_from([f.name for f in dataclasses.fields(MalleableSpec)]))
def test_spec_is_frozen(spec, name):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(spec, name, 1)


def test_signal_targets_are_the_slurm_ports_values():
    from malleable.slurm.records import SignalTarget
    assert set(SIGNAL_TARGETS) == {t.value for t in SignalTarget}


def test_spec_fields_gives_raw_pairs_with_short_keys():
    from malleable.spec import spec_fields
    assert spec_fields("x malleable:GPUS=2-4,batch_size=64;grace=2m y") == [
        ("gpus", "2-4"), ("batch", "64"), ("grace", "2m")]
    assert spec_fields("no spec") == []


def test_from_dict_validates_and_ignores_unknown_keys():
    assert MalleableSpec.from_dict({"min_gpus": 1, "max_gpus": 2, "future": 1}) == \
        MalleableSpec(min_gpus=1, max_gpus=2)
    with pytest.raises(SpecError, match="gpus"):
        MalleableSpec.from_dict({"max_gpus": 2})
    with pytest.raises(SpecError) as info:
        MalleableSpec.from_dict({"min_gpus": 1, "max_gpus": 2, "step": "4"})
    assert info.value.field == "step"


@pytest.mark.parametrize("text, field", [
    ("malleable:gpus=2-4,target_steps=-5", "target_steps"),
    ("malleable:gpus=2-4,batch=-256", "batch"),
])
def test_negative_integer_is_refused_as_out_of_range(text, field):
    """-5 is an integer: the error says what range is allowed, not "expected an integer"."""
    with pytest.raises(SpecError, match=r"=-\d+: expected an integer >= 1") as info:
        parse_spec(text)
    assert info.value.field == field


@pytest.mark.parametrize("text, field, value", [
    ("malleable:gpus=1-99999999999999999999", "gpus", "99999999999999999999"),
    ("malleable:gpus=99999999999999999999", "gpus", "99999999999999999999"),
    ("malleable:gpus=2-4,batch=99999999999999999999", "batch", "99999999999999999999"),
    ("malleable:gpus=2-4,target_steps=9223372036854775808", "target_steps",
     "9223372036854775808"),
])
def test_too_large_integer_is_refused_as_too_large_with_the_bound(text, field, value):
    """2**63 and above: the error says too large and gives the bound, not ">= 1"."""
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert str(info.value) == (f"malleable spec: {field}={value}: too large; "
                               f"expected an integer <= 9223372036854775807 (2**63 - 1)")
    assert (info.value.field, info.value.value) == (field, value)


def test_largest_integer_is_accepted():
    assert parse_spec("malleable:gpus=2-4,target_steps=9223372036854775807").target_steps == \
        2**63 - 1


def test_from_dict_refuses_a_too_large_integer_as_too_large():
    with pytest.raises(SpecError, match=r"batch=9223372036854775808: too large; "
                                        r"expected an integer <= 9223372036854775807") as info:
        MalleableSpec.from_dict({"min_gpus": 1, "max_gpus": 2, "batch_size": 2**63})
    assert info.value.field == "batch"


@pytest.mark.parametrize("text, field", [("grace=1e20", "grace"), ("restart_cost=604801", "restart_cost"),
                                         ("grace=169h", "grace")])
def test_seconds_above_a_week_are_refused_as_too_large(text, field):
    with pytest.raises(SpecError) as info:
        parse_spec(f"malleable:gpus=1-4,{text}")
    assert info.value.field == field
    assert "too large; expected seconds <= 604800 (7 days)" in str(info.value)
    assert parse_spec("malleable:gpus=1-4,grace=168h,restart_cost=604800").grace_s == 604800.0


@given(lo=st.integers(1, 40), span=st.integers(0, 60), step=st.integers(1, 9))
@settings(max_examples=200, deadline=None)
def test_allows_agrees_with_the_list_of_allowed_sizes(lo, span, step):
    s = MalleableSpec(min_gpus=lo, max_gpus=lo + span, step=step)
    allowed = s.allowed_gpus()
    assert [k for k in range(0, lo + span + 3) if s.allows(k)] == allowed
    assert s.allowed_gpus(limit=3) == allowed[:3]


def test_a_spec_up_to_the_largest_integer_is_checked_without_listing_it():
    s = parse_spec("malleable:gpus=1-9223372036854775807,step=2")
    assert s.allows(2**62) and not s.allows(2**62 + 1)
    assert s.allowed_gpus(limit=4) == [1, 2, 4, 6]


@pytest.mark.parametrize("text, field", [
    ("malleable:gpus=1-8 step=4 batch=32", "step"),
    ('notes malleable:gpus=1-8,grace=60  target_steps=500', "target_steps"),
    ("malleable:gpus=1-8 max_batch_size=512", "max_batch_size"),    # an alias of ours
    ("malleable:gpus=1-8 nightly step=4", "step"),                  # further on
    ("malleable:gpus=1-8 owner=ann step=4", "step"),
])
def test_a_field_of_ours_after_a_blank_is_refused_not_dropped(text, field):
    """The spec ends at a blank: a field of ours after one would be silently dropped."""
    with pytest.raises(SpecError, match="after a blank, outside the spec") as info:
        parse_spec(text)
    assert info.value.field == field


@pytest.mark.parametrize("text, cut", [
    ("malleable:gpus=1-8,,step=4,batch=64", "an empty field (two separators in a row)"),
    ("malleable:gpus=1-8;;step=4", "an empty field (two separators in a row)"),
    ("malleable:gpus=1-8, ,batch=64", "an empty field (two separators in a row)"),
    ("malleable:gpus=1-8,(x),step=4", "the spec's end"),
    # A key spelled with '-', or a blank around '=': the spec ended before it (a tester).
    ("malleable:gpus=1-8,step=4,max-local-batch=4", "the spec's end"),
    ("malleable:gpus=1-8,step =4", "the spec's end"),
    ("malleable:gpus=1-8,step= 4", "the spec's end"),
    ("malleable:gpus=1-8 max-batch=4", "a blank"),
    ("malleable:gpus=1-8 nightly,step=4", "a blank"),
])
def test_a_field_of_ours_after_an_empty_field_is_refused_not_dropped(text, cut):
    """gpus=1-8,,step=4,batch=64 parsed as gpus=1-8 alone: the spec ended at the empty
    field and step and batch were lost without a word (a new-user tester)."""
    with pytest.raises(SpecError, match=re.escape(f"after {cut}, outside the spec")):
        parse_spec(text)


def test_a_second_equals_sign_in_a_value_is_refused():
    """gpus=1-8,batch=64=128 parsed as batch=64 (the spec ended at the second '=')."""
    with pytest.raises(SpecError, match=r"^malleable spec: batch=64=128: a second '=' after "
                                        r"the value of batch \(one value per key\)$") as info:
        parse_spec("malleable:gpus=1-8,batch=64=128")
    assert info.value.field == "batch"
    assert parse_spec("malleable:gpus=1-8 owner = alice").max_gpus == 8   # not ours


@pytest.mark.parametrize("text", ["malleable:gpus=1-8 owner=alice", "malleable:gpus=1-8 (step=4)",
                                  "malleable:gpus=1-8, step=4"])
def test_other_text_after_the_spec_is_still_allowed(text):
    assert parse_spec(text).max_gpus == 8


@pytest.mark.parametrize("field", ["gpus=1-", "batch=", "step=", "target_steps=", "grace="])
def test_a_value_of_thousands_of_digits_is_a_short_error_not_a_traceback(field):
    """int() of more than 4,300 digits raised ValueError through parse_spec (a tester),
    and a long value filled the message."""
    big = "9" * 5000
    with pytest.raises(SpecError) as info:
        parse_spec(f"malleable:gpus=1-8,{field}{big}" if not field.startswith("gpus")
                   else f"malleable:{field}{big}")
    assert "... (5000 characters)" in str(info.value) and len(str(info.value)) < 200
