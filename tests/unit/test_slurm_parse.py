"""Parsing Slurm JSON: every value shape, and bad input (never a crash, always a typed
error naming the field and the value). Includes the hypothesis tests that feed
random JSON values into the parsers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malleable.slurm import JobState, SlurmJob, SlurmNode, SlurmParseError
from malleable.slurm.parse import (
    document_errors,
    load_json,
    parse_job,
    parse_jobs,
    parse_meta,
    parse_node,
    parse_nodes,
)
from malleable.slurm.text import parse_jobs_text
from tests.fixtures.slurm.shapes import RELEASES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
DOCS = {r: json.loads((FIXTURES / f"squeue-{r}.json").read_text()) for r in RELEASES}


def job_of(release: str, job_id: int) -> dict:
    return copy.deepcopy(next(j for j in DOCS[release]["jobs"] if j["job_id"] == job_id))


# ----------------------------------------------------------------- value shapes

@pytest.mark.parametrize("state, base, flags", [
    ("RUNNING", JobState.RUNNING, set()),
    (["PENDING", "REQUEUED"], JobState.PENDING, {"REQUEUED"}),
    (["RUNNING", "CONFIGURING"], JobState.RUNNING, {"CONFIGURING"}),
    (["COMPLETING", "CANCELLED"], JobState.CANCELLED, {"COMPLETING"}),
    ("COMPLETING", JobState.COMPLETING, {"COMPLETING"}),  # 22.05 prints the flag alone
    ("REQUEUE_HOLD", JobState.PENDING, {"REQUEUE_HOLD"}),
    (["PENDING", "SOMETHING_NEW"], JobState.PENDING, {"SOMETHING_NEW"}),
])
def test_job_state_string_or_list(state, base, flags):
    job = parse_job({"job_id": 5, "job_state": state})
    assert job.state == base and job.state_flags == flags


@pytest.mark.parametrize("state", ["BANANA", [], ["x", 1], 7, None, {"RUNNING": 1}])
def test_unknown_job_state_names_field_and_value(state):
    with pytest.raises(SlurmParseError) as exc:
        parse_job({"job_id": 5, "job_state": state}, "jobs[3]")
    assert exc.value.field == "jobs[3].job_state" and repr(state) in str(exc.value)


def test_number_objects_unset_infinite_and_plain():
    job = parse_job({"job_id": 5, "job_state": ["PENDING"],
                     "time_limit": {"set": False, "infinite": True, "number": 0},
                     "node_count": {"set": True, "infinite": False, "number": 3},
                     "restart_cnt": 2.0,
                     "array_job_id": {"set": True, "infinite": False, "number": 0},
                     "submit_time": {"set": True, "infinite": False, "number": 1700000000},
                     "start_time": {"set": False, "infinite": False, "number": 0},
                     "priority": {"set": True, "infinite": False, "number": 0}})
    assert job.time_limit is None and job.node_count == 3 and job.restart_count == 2
    assert job.array_job_id is None and job.held and job.start_time is None
    assert job.submit_time.timestamp() == 1700000000


@pytest.mark.parametrize("key, value", [
    ("node_count", "3"), ("node_count", True), ("node_count", 2.5), ("node_count", [3]),
    ("node_count", {"set": True}), ("time_limit", -5), ("time_limit", 2**63),
    ("submit_time", -1),
    ("submit_time", 10**14), ("restart_cnt", "many"), ("requeue", "yes"), ("name", 7),
    ("gres_detail", "gpu:4"), ("gres_detail", ["gpu:x:y:z"]), ("tres_per_node", "gres/gpu:a:b"),
    ("tres_alloc_str", "cpu=2,gres/gpu=lots"), ("tres_req_str", "node"),
    ("job_resources", "node1"), ("job_resources", {"nodes": 5}), ("nodes", "node[1-"),
])
def test_wrong_shapes_name_the_field_and_the_value(key, value):
    job = {"job_id": 5, "job_state": "RUNNING", "nodes": "node1", key: value}
    with pytest.raises(SlurmParseError) as exc:
        parse_job(job, "jobs[0]")
    assert exc.value.field.startswith(f"jobs[0].{key}")
    assert exc.value.field in str(exc.value)


@pytest.mark.parametrize("job_id", [None, "abc", "12", -3, 0, True, {"number": "x"}])
def test_missing_or_non_numeric_job_id(job_id):
    job = {"job_state": "RUNNING"} if job_id is None else {"job_id": job_id, "job_state": "RUNNING"}
    with pytest.raises(SlurmParseError, match=r"jobs\[0\]\.job_id"):
        parse_job(job, "jobs[0]")


def test_missing_optional_fields_take_defaults():
    job = parse_job({"job_id": 9, "job_state": "PENDING"})
    assert job == SlurmJob(job_id="9", job_id_num=9, state=JobState.PENDING)


def test_unknown_extra_fields_are_ignored():
    base = job_of("25.11", 23)
    extra = copy.deepcopy(base)
    extra.update({"brand_new": {"deep": [1, {"x": None}]}, "another": "field"})
    assert parse_job(extra) == parse_job(base)


@pytest.mark.parametrize("release", ["23.11", "24.05", "25.11"])
def test_node_list_and_count_from_job_resources_when_top_level_fields_are_missing(release):
    job = job_of(release, 23)
    want = parse_job(job)
    for key in ("nodes", "node_count"):
        job.pop(key)
    assert parse_job(job) == want  # nodes object (24.05+) or string (older)


def test_null_job_resources_of_a_pending_job():
    job = job_of("25.11", 24)
    assert job["job_resources"] is None
    assert parse_job(job).node_count == 2


def test_allocated_tres_with_gres_gpu_wins_over_gres_detail():
    job = job_of("24.11", 23)
    job["tres_alloc_str"] = "cpu=2,mem=1G,node=2,billing=2,gres/gpu=8,gres/gpu:a100=8"
    job["gres_detail"] = []
    j = parse_job(job)
    assert (j.gpus, j.gpus_per_node) == (8, 4)


def test_typed_and_multiple_gres_in_gres_detail():
    job = job_of("24.11", 23)
    job["gres_detail"] = ["gpu:h100:1(IDX:0),gpu:h200:2(IDX:1-2),shard:4",
                          "gpu:h100:1(IDX:0),gpu:h200:0(IDX:)"]
    j = parse_job(job)
    assert (j.gpus, j.gpus_per_node) == (4, 3)


def test_requested_gpus_per_task_and_from_the_tres_request():
    per_task = parse_job({"job_id": 5, "job_state": ["PENDING"], "tres_per_task": "gres/gpu:1",
                          "tasks": {"set": True, "infinite": False, "number": 6},
                          "tres_req_str": "cpu=6,node=3"})
    assert (per_task.node_count, per_task.gpus, per_task.gpus_per_node) == (3, 6, 2)
    req = parse_job({"job_id": 5, "job_state": "PENDING",
                     "tres_req_str": "cpu=4,node=2,gres/gpu=6"})
    assert (req.gpus, req.gpus_per_node) == (6, 3)


def test_requeued_pending_job_counts_nodes_from_its_tres_request():
    # 22.05 keeps node_count=1 from the shrunk allocation after NumNodes=3-3.
    j = parse_job({"job_id": 35, "job_state": "PENDING", "node_count": 1,
                   "tres_per_node": "gres:gpu:2", "tres_req_str": "cpu=3,node=3,billing=3",
                   "priority": 0, "state_reason": "JobHeldUser",
                   "state_description": "job requeued in held state"})
    assert (j.node_count, j.gpus, j.held, j.reason) == (3, 6, True, "job requeued in held state")


@pytest.mark.parametrize("line, field", [
    ("JobId=1 JobState=RUNNING TimeLimit=99999999999999-00:00:00", "TimeLimit"),
    ("JobId=1 JobState=RUNNING TimeLimit=soon", "TimeLimit"),
    ("JobId=1 JobState=RUNNING SubmitTime=9999-99-99T00:00:00", "SubmitTime"),
    ("JobId=1 JobState=RUNNING SubmitTime=0001-01-01T00:00:00", "SubmitTime"),
    ("JobId=x JobState=RUNNING", "JobId"),
    ("JobId=1 JobState=RUNNING NumNodes=many", "NumNodes"),
    ("JobId=1 JobState=RUNNING NodeList=n1 JOB_GRES=gpu:x:y:z", "JOB_GRES"),
])
def test_bad_text_values_name_the_field(line, field):
    with pytest.raises(SlurmParseError) as exc:
        parse_jobs_text(line)
    assert exc.value.field == f"job line 1.{field}"


# ----------------------------------------------------------------- documents

def test_truncated_json_is_a_parse_error_naming_the_source():
    text = (FIXTURES / "squeue-24.05.json").read_text()
    with pytest.raises(SlurmParseError, match="squeue --json: output is not valid JSON"):
        load_json(text[: len(text) // 2], "squeue --json")
    with pytest.raises(SlurmParseError, match="expected a JSON object"):
        load_json("[1, 2]", "squeue --json")
    with pytest.raises(SlurmParseError):
        load_json(b"\xff\xfe", "squeue --json")


def test_one_bad_job_is_skipped_and_reported_when_errors_are_collected():
    doc = copy.deepcopy(DOCS["23.11"])
    doc["jobs"][2]["node_count"] = "lots"
    with pytest.raises(SlurmParseError, match=r"jobs\[2\]\.node_count"):
        parse_jobs(doc)
    errors: list[SlurmParseError] = []
    jobs = parse_jobs(doc, errors=errors)
    assert len(jobs) == len(doc["jobs"]) - 1 and len(errors) == 1
    assert errors[0].field == "jobs[2].node_count" and errors[0].value == "lots"


@pytest.mark.parametrize("meta, match", [
    (None, "meta"), ({}, r"meta\.Slurm\.version"),
    ({"slurm": {"version": {"major": "x", "minor": "11", "micro": "0"}}},
     r"meta\.slurm\.version\.major"),
    ({"Slurm": {"version": {"major": 21, "minor": 8, "micro": 6}}}, "22.05 or newer"),
])
def test_meta_version_is_checked(meta, match):
    doc = {"jobs": []} if meta is None else {"meta": meta, "jobs": []}
    with pytest.raises(SlurmParseError, match=match):
        parse_jobs(doc)


def test_meta_of_a_release_newer_than_known_is_accepted():
    meta = parse_meta({"meta": {"slurm": {"version": {"major": "26", "minor": "05",
                                                      "micro": "1"}}}})
    assert meta.version == (26, 5, 1) and meta.release == "26.05.1" and meta.data_parser == ""


def test_missing_jobs_list_and_document_errors():
    doc = copy.deepcopy(DOCS["22.05"])
    del doc["jobs"]
    with pytest.raises(SlurmParseError, match="jobs: expected a list"):
        parse_jobs(doc)
    down = {"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                        "error": "Unspecified error", "source": "slurm_load_jobs"}]}
    assert document_errors(down) == [
        "Unspecified error: Failed while looking for jobs: slurm_load_jobs"]
    assert document_errors({"errors": []}) == [] and document_errors({}) == []


def test_nodes_of_22_05_and_25_11():
    meta = DOCS["22.05"]["meta"]
    old = parse_nodes({"meta": meta, "nodes": [
        {"name": "node1", "state": "mixed", "state_flags": ["DRAIN"], "gres": "gpu:a100:4(S:0-1)",
         "gres_used": "gpu:a100:2(IDX:0-1)", "partitions": ["gpu", "debug"]}]})
    new = parse_nodes({"meta": DOCS["25.11"]["meta"], "nodes": [
        {"name": "node1", "state": ["MIXED", "DRAIN"], "gres": "gpu:a100:4(S:0-1)",
         "gres_used": "gpu:a100:2(IDX:0-1)", "partitions": ["gpu", "debug"],
         "energy": {"current_watts": {"set": True, "infinite": False, "number": 0}}}]})
    want = SlurmNode(name="node1", state="mixed", state_flags=frozenset({"DRAIN"}),
                     partitions=("gpu", "debug"), gpus=4, gpus_allocated=2)
    assert old == new == [want] and not want.usable
    with pytest.raises(SlurmParseError, match=r"nodes\[0\]\.state"):
        parse_nodes({"meta": meta, "nodes": [{"name": "n1", "state": 3}]})
    with pytest.raises(SlurmParseError, match=r"node\.name"):
        parse_node({"state": "idle"})


# ----------------------------------------------------------------- random input

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.text(max_size=30)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12)
JOB_KEYS = sorted({k for doc in DOCS.values() for j in doc["jobs"] for k in j})
TEMPLATES = [(r, i) for r in RELEASES for i in range(len(DOCS[r]["jobs"]))]


def outcome(fn, *args):
    """Call a parser; return its result, or the SlurmParseError it raised (any other
    exception fails the test)."""
    try:
        return fn(*args)
    except SlurmParseError as exc:
        assert exc.field and exc.field in str(exc)
        return exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=json_values)
def test_random_json_documents_give_records_or_parse_errors(doc):
    for fn in (parse_jobs, parse_nodes):
        out = outcome(fn, doc)
        assert isinstance(out, (SlurmParseError, list))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=st.sampled_from(TEMPLATES),
       changes=st.dictionaries(st.sampled_from(JOB_KEYS), json_values, min_size=1, max_size=4),
       drop=st.lists(st.sampled_from(JOB_KEYS), max_size=3))
def test_random_values_in_real_job_records_give_a_record_or_a_parse_error(
        template, changes, drop):
    release, index = template
    job = copy.deepcopy(DOCS[release]["jobs"][index])
    job.update(changes)
    for key in drop:
        job.pop(key, None)
    out = outcome(parse_job, job, "jobs[0]")
    if isinstance(out, SlurmParseError):
        assert out.field.startswith("jobs[0]")
    else:
        assert isinstance(out, SlurmJob) and out.gpus >= 0 and out.node_count >= 0


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300)
       | st.lists(st.sampled_from(["JobId=", "JobState=", "RUNNING", "12", " ", "NumNodes=",
                                   "TRES=", "node=", "gres/gpu=", "x", "(", ")", "TimeLimit=",
                                   "1-00:00:00", "Nodes=", "GRES=", "gpu:4", "\n"]),
                  max_size=40).map("".join))
def test_random_text_gives_records_or_parse_errors(text):
    out = outcome(parse_jobs_text, text)
    assert isinstance(out, SlurmParseError) or all(isinstance(j, SlurmJob) for j in out)
    out = outcome(load_json, text, "squeue --json")
    assert isinstance(out, (SlurmParseError, dict))
