"""The six ``squeue --json`` shapes (22.05 .. 25.11) parse to the same records.

squeue-22.05.json is a real (anonymised) capture of the harness; the others are
the same jobs in the shapes of later data_parser versions (see
tests/fixtures/slurm/make_fixtures.py and shapes.py). scontrol-jobs-22.05.txt is
the text form of the same jobs at the same moment.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from malleable.slurm import JobState
from malleable.slurm.parse import parse_jobs, parse_meta
from malleable.slurm.text import parse_jobs_text
from malleable.slurm.versions import DATA_PARSER, json_option
from tests.fixtures.slurm.shapes import RELEASES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def load(release: str) -> dict:
    return json.loads((FIXTURES / f"squeue-{release}.json").read_text())


def at(hh: int, mm: int, ss: int) -> datetime:
    return datetime(2026, 11, 29, hh, mm, ss, tzinfo=UTC)


# (job_id, num, name, state, held, reason, nodes, node_count, gpus, per node,
#  time limit minutes, requeueable, array (job, task), het (job, offset))
EXPECTED = [
    ("22", 22, "done", JobState.COMPLETED, False, "None", "node1", 1, 1, 1, None, True,
     (None, None), (None, None)),
    ("23", 23, "resnet", JobState.RUNNING, False, "None", "node[1-2]", 2, 8, 4, 60, True,
     (None, None), (None, None)),
    ("24", 24, "bert", JobState.PENDING, True, "JobHeldUser", "", 2, 4, 2, 120, True,
     (None, None), (None, None)),
    ("25", 25, "later", JobState.PENDING, False, "BeginTime", "", 1, 4, 4, None, True,
     (None, None), (None, None)),
    ("26_1", 30, "sweep", JobState.RUNNING, False, "None", "node3", 1, 1, 1, 30, True,
     (26, 1), (None, None)),
    ("27+0", 27, "het", JobState.PENDING, True, "JobHeldUser", "", 1, 1, 1, None, True,
     (None, None), (27, 0)),
    ("27+1", 28, "het", JobState.PENDING, True, "JobHeldUser", "", 1, 2, 2, None, True,
     (None, None), (27, 1)),
    ("29", 29, "rigid", JobState.RUNNING, False, "None", "node3", 1, 2, 2, None, False,
     (None, None), (None, None)),
    ("26_2", 26, "sweep", JobState.RUNNING, False, "None", "node3", 1, 1, 1, 30, True,
     (26, 2), (None, None)),
]


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_release_shape_parses_to_the_expected_records(release):
    jobs = parse_jobs(load(release))
    got = [(j.job_id, j.job_id_num, j.name, j.state, j.held, j.reason, j.nodes, j.node_count,
            j.gpus, j.gpus_per_node,
            None if j.time_limit is None else j.time_limit // timedelta(minutes=1),
            j.requeueable, (j.array_job_id, j.array_task_id), (j.het_job_id, j.het_job_offset))
           for j in jobs]
    assert got == EXPECTED
    resnet = jobs[1]
    assert (resnet.user, resnet.uid, resnet.comment) == \
        ("alice", 1001, "malleable: min_gpus=4 max_gpus=16")
    assert (resnet.submit_time, resnet.start_time, resnet.end_time) == \
        (at(8, 26, 51), at(8, 26, 52), at(9, 26, 52))
    assert jobs[3].eligible_time == at(9, 26, 51)  # --begin=now+1hour
    assert jobs[7].end_time is None  # unlimited and running: no end


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_release_gives_identical_records(release):
    assert parse_jobs(load(release)) == parse_jobs(load("22.05"))


@pytest.mark.parametrize("release", list(RELEASES))
def test_meta_version_and_the_parser_the_cli_pins(release):
    parser, version = RELEASES[release]
    meta = parse_meta(load(release))
    assert meta.version == version and meta.data_parser == parser
    # The cli backend asks each release for exactly the shape its fixture has.
    assert DATA_PARSER[version[:2]] == parser
    assert json_option(version) == ("--json" if version < (23, 11, 0) else f"--json={parser}")


def test_text_form_of_the_same_jobs_parses_to_the_same_records(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # scontrol printed local time on a UTC machine
    time.tzset()
    try:
        text = parse_jobs_text((FIXTURES / "scontrol-jobs-22.05.txt").read_text())
    finally:
        monkeypatch.undo()
        time.tzset()
    by_id = {j.job_id: j for j in parse_jobs(load("22.05"))}
    assert len(text) == len(by_id)
    for job in text:
        assert job == by_id[job.job_id]
