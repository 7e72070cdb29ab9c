"""GPU counts from GRES/TRES strings, host list sizes, the TresPerNode form per release,
and the checks on ids and arguments that run before any Slurm command."""

from __future__ import annotations

import pytest

from malleable.slurm import InvalidArgument, InvalidJobId, SlurmParseError
from malleable.slurm.gres import (
    gpus_in_gres,
    gpus_in_tres,
    hostlist_count,
    job_gpus,
    split_top,
    tres_count,
    tres_per_node_gpus,
)
from malleable.slurm.jobid import check_count, check_job_id, check_signal
from malleable.slurm.versions import has_scontrol_json, json_option, parse_version


@pytest.mark.parametrize("spec, gpus", [
    ("gres:gpu:4", 4), ("gres/gpu:4", 4), ("gres/gpu:a100:2", 2), ("gpu:4(IDX:0-3)", 4),
    ("gpu:h100:1(IDX:0),gpu:h200:0(IDX:)", 1), ("gpu:2(IDX:0,2),shard:1", 2),
    ("gres/gpu:2,gres/shard:1", 2), ("gpu", 1), ("gres/gpu:a100", 1), ("gpu:0", 0),
    ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:2,gpu:h100:2", 4),
    ("shard:4", None), ("", None), ("N/A", None), ("(null)", None), (None, None),
])
def test_gpus_in_gres(spec, gpus):
    assert gpus_in_gres(spec) == gpus


@pytest.mark.parametrize("spec", ["gpu:a:b:c", ":4", "gres/:2", "gpu:4:x"])
def test_malformed_gres_is_a_value_error(spec):
    with pytest.raises(ValueError, match="bad GRES"):
        gpus_in_gres(spec)


@pytest.mark.parametrize("tres, gpus", [
    ("cpu=2,node=2,billing=2", None), ("cpu=2,gres/gpu=8,gres/gpu:a100=8", 8),
    ("cpu=2,gres/gpu:a100=2,gres/gpu:h100=4", 6), ("", None), (None, None),
    ("cpu=10,mem=100G,node=1,billing=10,gres/gpu=1,gres/gpu:a100=1", 1),
])
def test_gpus_in_tres(tres, gpus):
    assert gpus_in_tres(tres) == gpus


def test_tres_count_and_malformed_tres():
    assert tres_count("cpu=3,mem=48000M,node=3,billing=3", "node") == 3
    assert tres_count("cpu=3", "node") is None
    for bad in ("cpu", "node=three", "gres/gpu=x"):
        with pytest.raises(ValueError):
            gpus_in_tres(bad) if "gpu" in bad else tres_count(bad, "node")


@pytest.mark.parametrize("expr, n", [
    ("node1", 1), ("node[1-2]", 2), ("node[1-2],gpu3", 3), ("ia[01-04,07]", 5),
    ("r[1-2]n[1-3]", 6), ("", 0), ("(null)", 0), (None, 0),
])
def test_hostlist_count(expr, n):
    assert hostlist_count(expr) == n


@pytest.mark.parametrize("expr", ["node[", "node[2-1]", "node[a-b]", "node[1-]"])
def test_malformed_hostlist(expr):
    with pytest.raises(ValueError):
        hostlist_count(expr)


def test_split_top_keeps_parenthesised_commas():
    assert split_top("gpu:2(IDX:0,2),shard:1") == ["gpu:2(IDX:0,2)", "shard:1"]
    assert split_top("a[1,3],b") == ["a[1,3]", "b"]


def test_job_gpus_order_of_sources():
    # allocated: TRES total first, else per-node detail, else the request
    assert job_gpus(allocated=True, node_count=2, alloc_total=8, node_gpus=[]) == (8, 4)
    assert job_gpus(allocated=True, node_count=2, alloc_total=8, node_gpus=[6, 2]) == (8, 6)
    assert job_gpus(allocated=True, node_count=2, node_gpus=[4, 4], per_node=2) == (8, 4)
    assert job_gpus(allocated=True, node_count=2, per_node=2) == (4, 2)
    # pending: per node, per job, per task, requested TRES
    assert job_gpus(allocated=False, node_count=3, node_gpus=[4], per_node=2) == (6, 2)
    assert job_gpus(allocated=False, node_count=2, per_job=3) == (3, 2)
    assert job_gpus(allocated=False, node_count=1, per_task=2, tasks=4) == (8, 8)
    assert job_gpus(allocated=False, node_count=0, req_total=5) == (5, 5)
    assert job_gpus(allocated=False, node_count=2) == (0, 0)


def test_tres_per_node_form_by_release():
    assert tres_per_node_gpus((22, 5, 8), 2) == "gres:gpu:2"    # verified on the harness
    assert tres_per_node_gpus((23, 2, 0), 2) == "gres/gpu:2"
    assert tres_per_node_gpus((25, 11, 0), 4) == "gres/gpu:4"


def test_release_capabilities():
    assert parse_version("slurm-wlm 22.05.8") == (22, 5, 8)
    assert parse_version("slurm 24.11.0-1") == (24, 11, 0)
    assert json_option((22, 5, 8)) == json_option((23, 2, 7)) == "--json"
    assert json_option((23, 11, 1)) == "--json=v0.0.40"
    assert json_option((25, 11, 0)) == "--json=v0.0.44"
    assert json_option((26, 5, 0)) == "--json"  # unknown release: its default parser
    assert not has_scontrol_json((22, 5, 8)) and has_scontrol_json((23, 2, 0))
    with pytest.raises(SlurmParseError, match="no Slurm version"):
        parse_version("squeue: command not found")


@pytest.mark.parametrize("good", ["1", "123", "123_4", "123_0", "123+0", "123+1", 7])
def test_valid_job_ids(good):
    assert check_job_id(good) == str(good)


@pytest.mark.parametrize("bad", [
    "", " 1", "1 ", "abc", "1;rm -rf /", "$(x)", "`id`", "1|2", "1&", "12 13", "-1", "0",
    "007", "12_", "_4", "+1", "1+", "1_2_3", "1+0+1", "12\n13", "1e3", "１２", 0, -4,
    12.0, None, True, False, ["1"], "9" * 11,
])
def test_invalid_job_ids(bad):
    with pytest.raises(InvalidJobId, match="invalid job id") as exc:
        check_job_id(bad)
    assert isinstance(exc.value, ValueError)


def test_signal_and_count_checks():
    for sig in ("USR1", "SIGUSR1", "TERM", "10", "SIGRTMIN"):
        assert check_signal(sig) == sig
    for sig in ("", "-9", "usr1", "USR1;x", "$(x)", "--full", 10, None, "100"):
        with pytest.raises(InvalidArgument, match="invalid signal"):
            check_signal(sig)
    assert check_count("nodes", 3) == 3
    for n in (0, -1, True, 2.0, "3", None):
        with pytest.raises(InvalidArgument, match="invalid nodes"):
            check_count("nodes", n)
