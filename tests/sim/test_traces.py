"""Trace loaders on the real files in ../shared/data and on malformed rows (tmp files)."""

from __future__ import annotations

import collections
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from malleable.sim.profiles import DATA_DIR, MODELS
from malleable.sim.traces import (
    TraceError,
    TraceJob,
    busiest_window,
    load_gavel,
    load_philly,
    load_pollux_workload,
    load_sacct,
    load_swf,
    philly_model,
)

SHARED = Path("/work/shared/data")
need_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                 reason="the shared data folder /work/shared/data is not here")
PHILLY = SHARED / "philly_pollux" / "philly.csv"


@pytest.fixture(scope="module")
def philly() -> list[TraceJob]:
    return load_philly(PHILLY, seed=0)


# ----------------------------------------------------------------------------- Pollux


@pytest.mark.parametrize("folder,count", [("workloads", 160), ("workloads-0.5", 80),
                                          ("workloads-1.5", 240), ("workloads-2.0", 320),
                                          ("workloads-realistic", 160)])
def test_every_vendored_pollux_workload_loads(folder, count):
    for i in range(1, 9):
        jobs = load_pollux_workload(DATA_DIR / folder / f"workload-{i}.csv")
        assert len(jobs) == count
        assert all(j.model in MODELS and j.gpus >= 1 and j.batch_size >= 1 for j in jobs)
        assert jobs == sorted(jobs, key=lambda j: (j.arrival_s, j.name))
        assert jobs[0].arrival_s >= 0 and jobs[-1].arrival_s < 8 * 3600


def test_pollux_workload_values_match_the_file():
    jobs = load_pollux_workload(DATA_DIR / "workloads" / "workload-1.csv")
    assert jobs[0] == TraceJob(name="cifar10-0", arrival_s=107.0, gpus=6, model="cifar10",
                               batch_size=2048)
    assert jobs[2].name == "ncf-2" and (jobs[2].gpus, jobs[2].batch_size) == (1, 32768)


def test_a_byte_order_mark_before_the_header_is_read_as_utf8(tmp_path):
    """Spreadsheets save CSV as "UTF-8 with BOM": the header's first name must not
    carry it (it did: 'missing column(s) name')."""
    src = DATA_DIR / "workloads" / "workload-1.csv"
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    assert load_pollux_workload(bom) == load_pollux_workload(src)
    gz = tmp_path / "bom.csv.gz"
    gz.write_bytes(gzip.compress(bom.read_bytes()))
    assert load_pollux_workload(gz) == load_pollux_workload(src)


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path, suffix):
    data = (b"name,time,application,num_replicas,batch_size\ncifar10-0,107,cifar10,6,2048\n"
            b"ncf-1,9\xff0,ncf,1,32768\n")
    f = tmp_path / f"w{suffix}"
    f.write_bytes(gzip.compress(data) if suffix == ".csv.gz" else data)
    with pytest.raises(TraceError) as err:
        load_pollux_workload(f)
    assert str(err.value) == f"{f}:3: not UTF-8 text: byte 0xff at column 8"
    assert err.value.line == 3


def _cut_gz(data: bytes) -> bytes:
    z = gzip.compress(data)
    return z[:len(z) // 2]


@pytest.mark.parametrize("name, data", [
    ("w.csv.gz", b"name,time,application,num_replicas,batch_size\n"
     + b"".join(b"j%d,%d,cifar10,1,128\n" % (i, i) for i in range(3000))),
    ("s.txt.gz", b"JobID|Submit|Elapsed|AllocTRES\n"
     + b"".join(b"%d|2026-01-01T00:00:00|00:10:00|gres/gpu=1\n" % i for i in range(1, 3000))),
    ("s.json.gz", json.dumps({"jobs": [{"job_id": i, "name": f"n{i * 7919}"}
                                      for i in range(1, 3000)]}).encode()),
])
def test_a_gzip_trace_cut_short_is_named_not_aborted(tmp_path, name, data):
    """A .gz cut short raised EOFError past the format detection (and in the sacct
    loaders past their first line): the CLI printed 'Aborted!' and exited 1."""
    from malleable.sim.workloads import load_workload
    f = tmp_path / name
    f.write_bytes(_cut_gz(data))
    with pytest.raises(TraceError, match="cannot read trace: Compressed file ended"):
        load_workload(f)
    f.write_bytes(gzip.compress(data)[:30])   # cut within the first line: detect_format
    with pytest.raises(TraceError, match="cannot read trace: Compressed file ended"):
        load_workload(f)
    corrupt = bytearray(gzip.compress(data))
    corrupt[len(corrupt) // 2:len(corrupt) // 2 + 32] = b"\xff" * 32
    f.write_bytes(bytes(corrupt))
    with pytest.raises(TraceError, match="cannot read trace: "):
        load_workload(f)


def test_lines_of_blank_cells_are_skipped_as_empty_lines(tmp_path):
    """Spreadsheets export empty rows as ",,,,"; whitespace-only lines are as empty."""
    f = tmp_path / "w.csv"
    f.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,107,cifar10,6,2048\n"
                 ",,,,\n   \n\nncf-1,90,ncf,1,32768\n , ,\n")
    assert [j.name for j in load_pollux_workload(f)] == ["ncf-1", "cifar10-0"]


@need_shared
def test_vendored_pollux_files_are_byte_identical_to_the_shared_copies():
    for src in sorted((SHARED / "pollux").rglob("*.csv")):
        rel = src.relative_to(SHARED / "pollux")
        assert (DATA_DIR / rel).read_bytes() == src.read_bytes(), rel


@pytest.mark.parametrize("bad,field,value", [
    ("cifar10-0,107,cifar10,six,2048", "num_replicas", "six"),
    ("cifar10-0,107,cifar10,0,2048", "num_replicas", "0"),
    ("cifar10-0,-5,cifar10,6,2048", "time", "-5"),
    ("cifar10-0,107,gpt3,6,2048", "application", "gpt3"),
    ("cifar10-0,107,cifar10,6,20.5", "batch_size", "20.5"),
    (",107,cifar10,6,2048", "name", ""),
])
def test_pollux_workload_refuses_a_malformed_row(tmp_path, bad, field, value):
    f = tmp_path / "w.csv"
    f.write_text("name,time,application,num_replicas,batch_size\nok-1,1,ncf,1,256\n" + bad + "\n")
    with pytest.raises(TraceError) as err:
        load_pollux_workload(f)
    msg = str(err.value)
    assert f"{f}:3" in msg and f"field {field}={value!r}" in msg
    assert (err.value.line, err.value.field, err.value.value) == (3, field, value)


@pytest.mark.parametrize("gpus, batch", [(2, 1), (8, 4), (16, 15)])
def test_pollux_workload_refuses_a_batch_smaller_than_its_gpus(tmp_path, gpus, batch):
    # Fewer samples than replicas: no data-parallel job runs that (the estimators find no
    # batch on its GPUs, and las and static held such a job for the whole run).
    f = tmp_path / "w.csv"
    f.write_text("name,time,application,num_replicas,batch_size\nok-1,1,ncf,1,256\n"
                 f"cifar10-2,5,cifar10,{gpus},{batch}\n")
    with pytest.raises(TraceError) as err:
        load_pollux_workload(f)
    assert str(err.value) == (f"{f}:3: field batch_size='{batch}': below num_replicas "
                              f"({gpus}): data-parallel training needs at least one sample "
                              f"per GPU")
    assert (err.value.line, err.value.field, err.value.value) == (3, "batch_size", str(batch))


def test_pollux_workload_accepts_one_sample_per_gpu(tmp_path):
    # At the limit (below the profile's smallest measured per-GPU batch, which the
    # profile clamps) the row is a job that can run: it is kept as it is.
    f = tmp_path / "w.csv"
    f.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,2,2\n"
                 "bert-1,3,bert,4,4\n")
    jobs = load_pollux_workload(f)
    assert [(j.gpus, j.batch_size) for j in jobs] == [(2, 2), (4, 4)]


def test_pollux_workload_refuses_missing_columns_short_rows_and_duplicates(tmp_path):
    f = tmp_path / "w.csv"
    f.write_text("name,time,application,num_replicas\nx,1,ncf,1\n")
    with pytest.raises(TraceError, match=r"w.csv:1: field header=.*missing column\(s\) batch_size"):
        load_pollux_workload(f)
    f.write_text("name,time,application,num_replicas,batch_size\nx,1,ncf,1\n")
    with pytest.raises(TraceError, match=r"w.csv:2: field row='x,1,ncf,1': 4 fields, "
                                         r"expected 5"):
        load_pollux_workload(f)
    f.write_text("name,time,application,num_replicas,batch_size\nx,1,ncf,1,2,extra\n")
    with pytest.raises(TraceError, match=r"w.csv:2: field row='x,1,ncf,1,2,extra': 6 fields, "
                                         r"expected 5"):
        load_pollux_workload(f)
    f.write_text("name,time,application,num_replicas,batch_size\nx,1,ncf,1,2\nx,2,ncf,1,2\n")
    with pytest.raises(TraceError, match=r"w.csv:3: field name='x': duplicate of line 2"):
        load_pollux_workload(f)
    f.write_text("name,time,application,num_replicas,batch_size\nx,1,cifar10,2,99999\n")
    with pytest.raises(TraceError, match=r"w.csv:2: field batch_size='99999': above the "
                                         r"cifar10 profile's largest batch size \(4096\)"):
        load_pollux_workload(f)
    with pytest.raises(TraceError, match="cannot read trace"):
        load_pollux_workload(tmp_path / "missing.csv")


# ----------------------------------------------------------------------------- Philly


@need_shared
def test_philly_loads_all_jobs_with_models_by_gpu_time_class(philly):
    assert len(philly) == 82247
    assert philly[0].arrival_s == 0.0
    span = philly[-1].arrival_s
    assert 108 * 86400 < span < 109 * 86400          # 2017-09-04 .. 2017-12-22
    gpus = collections.Counter(j.gpus for j in philly)
    assert gpus[1] == 76627 and gpus[128] == 3
    for j in philly:
        gt = j.gpu_time_s
        allowed = ("cifar10", "ncf") if gt < 3600 else ("deepspeech2", "bert") if gt < 36000 \
            else ("yolov3",) if gt < 360000 else ("imagenet",)
        assert j.model in allowed
    models = collections.Counter(j.model for j in philly)
    # The coin is fair: both models of a two-model class get about half.
    assert 0.45 < models["cifar10"] / (models["cifar10"] + models["ncf"]) < 0.55


@need_shared
def test_philly_model_choice_is_seeded_and_filters_do_not_change_it(philly):
    again = load_philly(PHILLY, seed=0)
    other = load_philly(PHILLY, seed=1)
    assert [j.model for j in again] == [j.model for j in philly]
    assert [j.model for j in other] != [j.model for j in philly]
    filtered = load_philly(PHILLY, seed=0, min_duration_s=60, max_gpu_time_s=3.6e6)
    assert all(j.duration_s >= 60 and j.gpu_time_s < 3.6e6 for j in filtered)
    by_name = {j.name: j.model for j in philly}
    assert all(by_name[j.name] == j.model for j in filtered)
    assert 70000 < len(filtered) < len(philly)


def test_philly_model_classes():
    assert philly_model(3599, 0.1) == "cifar10" and philly_model(3599, 0.9) == "ncf"
    assert philly_model(3600, 0.1) == "deepspeech2" and philly_model(35999, 0.7) == "bert"
    assert philly_model(36000, 0.9) == "yolov3" and philly_model(360000, 0.0) == "imagenet"


@need_shared
def test_busiest_two_week_window_of_philly(philly):
    start, window = busiest_window(philly, 14 * 86400)
    assert window[0].arrival_s == 0.0 and window[-1].arrival_s < 14 * 86400
    demand = sum(j.gpu_time_s for j in window)
    # No other window start has more GPU time arriving in 14 days (checked every hour).
    t = np.array([j.arrival_s for j in philly])
    cum = np.concatenate(([0.0], np.cumsum([j.gpu_time_s for j in philly])))
    starts = np.arange(0.0, t[-1], 3600.0)
    others = cum[np.searchsorted(t, starts + 14 * 86400)] - cum[np.searchsorted(t, starts)]
    assert others.max() <= demand * (1 + 1e-12)
    assert start in t
    by_jobs_start, by_jobs = busiest_window(philly, 14 * 86400, by="jobs")
    assert len(by_jobs) >= len(window)
    with pytest.raises(ValueError, match="length_s"):
        busiest_window(philly, 0)
    with pytest.raises(ValueError, match="no duration"):
        busiest_window([TraceJob("a", 0.0, 1)], 10.0)


def test_busiest_window_small_case():
    jobs = [TraceJob("a", 0.0, 1, duration_s=10.0), TraceJob("b", 5.0, 2, duration_s=100.0),
            TraceJob("c", 9.0, 1, duration_s=1.0), TraceJob("d", 30.0, 8, duration_s=100.0),
            TraceJob("e", 41.0, 1, duration_s=1.0)]
    start, win = busiest_window(jobs, 10.0)        # d alone: 800 GPU-s > a+b+c: 211
    assert start == 30.0 and [(j.name, j.arrival_s) for j in win] == [("d", 0.0)]
    start, win = busiest_window(jobs, 10.0, by="jobs")
    assert start == 0.0 and [j.name for j in win] == ["a", "b", "c"]
    start, win = busiest_window(jobs, 6.0)         # [0, 6) holds a and b; [5, 11) b and c
    assert start == 30.0
    assert busiest_window([], 10.0) == (0.0, [])


@pytest.mark.parametrize("bad,field,value", [
    ("2017-10-09 07:01,66.0,1,66.0,x", "timestamp", "2017-10-09 07:01"),
    ("2017-10-09 07:01:55,abc,1,66.0,x", "duration", "abc"),
    ("2017-10-09 07:01:55,66.0,0,0.0,x", "num_gpus", "0"),
    ("2017-10-09 07:01:55,66.0,2,66.0,x", "gpu_time", "66.0"),
    ("2017-10-09 07:01:55,nan,1,66.0,x", "duration", "nan"),
])
def test_philly_refuses_a_malformed_row(tmp_path, bad, field, value):
    f = tmp_path / "philly.csv"
    f.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:00:00,60.0,1,60.0,x\n" + bad + "\n")
    with pytest.raises(TraceError) as err:
        load_philly(f)
    assert f"{f}:3: field {field}={value!r}" in str(err.value)


# ----------------------------------------------------------------------------- Gavel


@need_shared
def test_gavel_traces_load_per_seed_and_vc():
    jobs = load_gavel(SHARED / "gavel" / "philly_msr_vc_traces.csv.gz", seed=0)
    assert len(jobs) == 15264
    assert all(j.total_steps >= 1 and j.gpus >= 1 and j.group for j in jobs)
    assert {j.model for j in jobs} >= {"ResNet-50", "Transformer", "A3C", "CycleGAN"}
    assert all(j.batch_size is None for j in jobs if j.model in ("A3C", "CycleGAN"))
    assert max(j.arrival_s for j in jobs) > 100 * 86400
    first = next(j for j in jobs if j.name == "0e4a51-0")
    assert (first.model, first.batch_size, first.total_steps, first.gpus, first.arrival_s) == \
        ("Transformer", 128, 95121, 1, 0.0)
    seed1 = load_gavel(SHARED / "gavel" / "philly_msr_vc_traces.csv.gz", seed=1, vc="0e4a51")
    assert 0 < len(seed1) <= 2000 and all(j.group == "0e4a51" for j in seed1)
    same = [j for j in jobs if j.group == "0e4a51"]
    assert [(j.arrival_s, j.gpus) for j in seed1] == [(j.arrival_s, j.gpus) for j in same]


def test_gavel_refuses_a_malformed_row(tmp_path):
    f = tmp_path / "g.csv.gz"
    head = ("seed,vc,line_no,job_type,num_steps_arg,needs_data_dir,total_steps,"
            "arrival_time_s,scale_factor\n")
    with gzip.open(f, "wt") as fh:
        fh.write(head + "0,v,0,LM (batch size 5),-n,1,100,0.0,1\n"
                 "0,v,1,LM (batch size 5),-n,1,100,12.5,two\n")
    with pytest.raises(TraceError, match=r"g.csv.gz:3: field scale_factor='two': not an integer"):
        load_gavel(f)
    # A (vc, line_no) twice in one seed made two jobs of one name; another seed's is fine.
    with gzip.open(f, "wt") as fh:
        fh.write(head + "0,v,0,LM (batch size 5),-n,1,100,0.0,1\n"
                 "1,v,0,LM (batch size 5),-n,1,100,0.0,1\n"
                 "0,v,0,LM (batch size 5),-n,1,100,12.5,2\n")
    assert [j.name for j in load_gavel(f, seed=1)] == ["v-0"]
    with pytest.raises(TraceError, match=r"g.csv.gz:4: field line_no='0': job v-0 of seed 0 "
                                         r"already on line 2"):
        load_gavel(f)
    # By the number: 1, 01 and 1.0 were three jobs, all named v-1 in jobs.csv.
    with gzip.open(f, "wt") as fh:
        fh.write(head + "0,v,1,LM (batch size 5),-n,1,100,0.0,1\n"
                 "0,v,01,LM (batch size 5),-n,1,100,12.5,2\n")
    with pytest.raises(TraceError, match=r"g.csv.gz:3: field line_no='01': job v-1 of seed 0 "
                                         r"already on line 2"):
        load_gavel(f)
    with gzip.open(f, "wt") as fh:   # " v" and "v" are one VC
        fh.write(head + "0,v,1,LM (batch size 5),-n,1,100,0.0,1\n"
                 "0, v,1,LM (batch size 5),-n,1,100,12.5,2\n")
    with pytest.raises(TraceError, match=r"g.csv.gz:3: field line_no='1': job v-1 of seed 0 "):
        load_gavel(f)


GAVEL_HEAD = ("seed,vc,line_no,job_type,num_steps_arg,needs_data_dir,total_steps,"
              "arrival_time_s,scale_factor\n")


def test_gavel_seed_or_vc_without_rows_says_what_the_file_has(tmp_path):
    """A seed (or VC) no row has gave [] and the command's 'no job to simulate (the trace
    has none, or none is left after the loader's filters)': now the seeds it has."""
    f = tmp_path / "g.csv"
    f.write_text(GAVEL_HEAD + "0,v,0,LM (batch size 5),-n,1,100,0.0,1\n"
                 "2,v,0,LM (batch size 5),-n,1,100,0.0,1\n"
                 "2,w,1,LM (batch size 5),-n,1,100,3.0,1\n")
    with pytest.raises(TraceError) as err:
        load_gavel(f, seed=1)
    assert str(err.value) == f"{f}: field seed=1: no row of seed 1: the file's seeds are 0, 2"
    assert (err.value.field, err.value.value) == ("seed", 1)
    with pytest.raises(TraceError, match=r"field vc='x': no row of seed 2 is of this VC: its "
                                         r"VCs are v, w$"):
        load_gavel(f, seed=2, vc="x")
    assert [j.name for j in load_gavel(f, seed=2, vc="w")] == ["w-1"]
    f.write_text(GAVEL_HEAD)
    assert load_gavel(f, seed=3) == []     # no rows at all: nothing to say about seeds


# ----------------------------------------------------------------------------- SWF


@need_shared
def test_swf_log_loads():
    jobs, skipped = load_swf(SHARED / "pwa_swf" / "NASA-iPSC-1993-3.1-cln.swf.gz")
    assert len(jobs) + skipped == 18239 and skipped == 0
    assert jobs[0] == TraceJob(name="1", arrival_s=0.0, gpus=128, duration_s=1451.0, group="u1")
    assert max(j.gpus for j in jobs) == 128
    assert 90 * 86400 < jobs[-1].arrival_s < 93 * 86400


@pytest.mark.parametrize("row,problem", [
    ("3 10 -1 100 4 -1 -1 -1 -1 -1 -1 1 1 -1 -1 -1 -1", "expected 18 fields, got 17"),
    ("3 10 -1 1x0 4 -1 -1 -1 -1 -1 -1 1 1 -1 -1 -1 -1 -1", "field run_time='1x0': not a number"),
    ("3 10 -1 100 -4 -1 -1 -1 -1 -1 -1 1 1 -1 -1 -1 -1 -1",
     "field alloc_procs='-4': must be >= 0 or -1"),
    ("3 10 -1 100 4.5 -1 -1 -1 -1 -1 -1 1 1 -1 -1 -1 -1 -1",
     "field alloc_procs='4.5': not an integer"),
])
def test_swf_refuses_a_malformed_row(tmp_path, row, problem):
    f = tmp_path / "log.swf"
    f.write_text("; Version: 2.2\n;\n1 0 5 100 4 -1 -1 4 -1 -1 1 1 1 -1 -1 -1 -1 -1\n" + row + "\n")
    with pytest.raises(TraceError) as err:
        load_swf(f)
    assert f"{f}:4" in str(err.value) and problem in str(err.value)


def test_swf_unknown_fields_fall_back_or_skip(tmp_path):
    f = tmp_path / "log.swf"
    f.write_text("1 100 5 100 -1 -1 -1 8 -1 -1 1 3 1 -1 -1 -1 -1 -1\n"   # requested procs used
                 "2 200 5 -1 4 -1 -1 4 -1 -1 1 3 1 -1 -1 -1 -1 -1\n")  # unknown run time: skip
    jobs, skipped = load_swf(f)
    assert skipped == 1
    assert jobs == [TraceJob(name="1", arrival_s=0.0, gpus=8, duration_s=100.0, group="u3")]


def test_swf_without_a_job_to_simulate_names_the_unknown_field(tmp_path):
    """Every processor count -1 gave (jobs [], skipped 2) and the command only 'no job to
    simulate': the loader now refuses the log naming the field and the first line."""
    f = tmp_path / "log.swf"
    f.write_text("; Version: 2.2\n"
                 "1 0 5 100 -1 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n"
                 "2 10 5 100 -1 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n")
    with pytest.raises(TraceError) as err:
        load_swf(f)
    assert str(err.value) == (
        f"{f}: field alloc_procs=-1: no job to simulate: the processor count (field 5, "
        "alloc_procs, and 8, req_procs) is unknown (-1) on all 2 job(s) (the first on line 2)")
    # Jobs lacking different fields: each field with its count and first line.
    f.write_text("1 0 5 -1 4 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n"
                 "2 10 5 -1 -1 -1 -1 -1 -1 -1 1 3 -1 -1 -1 -1 -1 -1\n")
    with pytest.raises(TraceError) as err:
        load_swf(f)
    assert err.value.field == "alloc_procs" and str(err.value).endswith(
        "no job to simulate: each of its 2 job(s) lacks a field the simulator needs (-1): "
        "the run time (field 4, run_time) on 2 (the first on line 1); the processor count "
        "(field 5, alloc_procs, and 8, req_procs) on 1 (the first on line 2)")
    f.write_text("; only comments\n")
    assert load_swf(f) == ([], 0)          # no job at all: not refused here


# ----------------------------------------------------------------------------- sacct


@need_shared
def test_nrel_eagle_sacct_csv_loads():
    jobs, skipped = load_sacct(SHARED / "nrel_eagle_slurm" / "sample_eagle_data.csv")
    assert len(jobs) + skipped == 1000 and skipped == 0
    assert sum(1 for j in jobs if j.gpus > 0) == 4
    assert len({j.name for j in jobs}) == 1000        # repeated ids made unique
    assert any(j.name == "532939#2" for j in jobs)
    assert all(j.nodes >= 1 and j.duration_s >= 0 and j.group for j in jobs)
    assert jobs[0].arrival_s == 0.0 and jobs[-1].arrival_s < 3 * 86400


SACCT_P = """JobID|JobName|Partition|Submit|Start|End|Elapsed|NNodes|AllocTRES|State|
100|train|gpu|2024-03-01T10:00:00|2024-03-01T10:00:05|2024-03-01T12:00:05|02:00:00|2|billing=8,cpu=8,gres/gpu=8,mem=64G,node=2|COMPLETED|
100.batch|batch||2024-03-01T10:00:05|2024-03-01T10:00:05|2024-03-01T12:00:05|02:00:00|1|cpu=4,gres/gpu=4,mem=32G,node=1|COMPLETED|
101_3|sweep|gpu|2024-03-01T10:30:00|2024-03-01T10:31:00|2024-03-02T11:31:00|1-01:00:00|1|cpu=2,gres/gpu:a100=2,node=1|COMPLETED|
102|cpujob|cpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:10:30|10:30|1|cpu=1,node=1|FAILED|
103|never|gpu|2024-03-01T11:05:00|Unknown|Unknown|00:00:00|1||CANCELLED by 0|
"""


def test_sacct_pipe_text_loads_jobs_and_skips_steps_and_unstarted(tmp_path):
    f = tmp_path / "sacct.txt"
    f.write_text(SACCT_P)
    jobs, skipped = load_sacct(f)
    assert skipped == 1
    assert [(j.name, j.arrival_s, j.gpus, j.duration_s, j.nodes, j.group) for j in jobs] == [
        ("100", 0.0, 8, 7200.0, 2, "gpu"),
        ("101_3", 1800.0, 2, 90000.0, 1, "gpu"),
        ("102", 3600.0, 0, 630.0, 1, "cpu")]


def test_sacct_pipe_text_skips_a_running_job_despite_its_elapsed(tmp_path):
    """With the documented columns a running job has Elapsed (the time so far) and End
    Unknown: it is skipped, not replayed as a job of that length."""
    f = tmp_path / "sacct.txt"
    f.write_text(SACCT_P + "104|running|gpu|2024-03-01T11:06:00|2024-03-01T11:07:00|Unknown|"
                 "00:10:00|1|gres/gpu=1|RUNNING|\n")
    jobs, skipped = load_sacct(f)
    assert skipped == 2 and "104" not in [j.name for j in jobs]


@pytest.mark.parametrize("line,problem", [
    ("104|x|gpu|2024-03-01 11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|1|node=1|OK|",
     "field Submit='2024-03-01 11:00:00'"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|9 sec|1|node=1|OK|",
     "field Elapsed='9 sec'"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:61:99|1|node=1|"
     "OK|", "field Elapsed='00:61:99': not a duration [D-][HH:]MM:SS (minutes and seconds"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|1-24:00:00|1|"
     "node=1|OK|", "field Elapsed='1-24:00:00'"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|one|node=1|OK|",
     "field NNodes='one'"),
    ("job104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|1||OK|",
     "field JobID='job104'"),
    ("104|x|gpu|2024-03-01T11:00:00", "expected 10 fields, got 4"),
    # End before Start was checked only without Elapsed.
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:09|2024-03-01T11:00:00|00:09|1|node=1|OK|",
     "field End='2024-03-01T11:00:00': before Start"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|1|"
     "cpu=8,gres/gpu=notanumber,node=2|OK|",
     "field AllocTRES='cpu=8,gres/gpu=notanumber,node=2': the gres/gpu count 'notanumber' is "
     "not an integer from 0 to 9223372036854775807"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|1|"
     "gres/gpu:a100=|OK|", "field AllocTRES='gres/gpu:a100=': the gres/gpu count ''"),
    ("104|x|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:00:09|00:09|1|"
     "gres/gpu=-2|OK|", "field AllocTRES='gres/gpu=-2': the gres/gpu count '-2'"),
])
def test_sacct_pipe_text_refuses_a_malformed_row(tmp_path, line, problem):
    f = tmp_path / "sacct.txt"
    f.write_text(SACCT_P + line + "\n")
    with pytest.raises(TraceError) as err:
        load_sacct(f)
    assert f"{f}:7" in str(err.value) and problem in str(err.value)


def test_sacct_pipe_text_gpus_from_req_tres_and_gres_and_a_malformed_gres(tmp_path):
    f = tmp_path / "sacct.txt"
    head = "JobID|Submit|Elapsed|AllocTRES|ReqTRES|AllocGRES\n"
    f.write_text(head + "1|2024-03-01T10:00:00|00:10||cpu=1,gres/gpu=3|\n"
                 "2|2024-03-01T10:00:00|00:10|cpu=1|cpu=1|gpu:tesla:4(IDX:0-1,3)\n"
                 "3|2024-03-01T10:00:00|00:10|cpu=1,gres/gpumem=16G||gpumem:2\n")
    jobs, _ = load_sacct(f)
    assert [(j.name, j.gpus) for j in jobs] == [("1", 3), ("2", 4), ("3", 0)]
    for cells, problem in [
            ("gres/gpu=4|gres/gpu=many|", "field ReqTRES='gres/gpu=many': the gres/gpu count "
                                          "'many' is not an integer from 0 to "
                                          "9223372036854775807"),
            ("||gpu:tesla", "field AllocGRES='gpu:tesla': 'gpu:tesla' has no GPU count")]:
        f.write_text(head + f"1|2024-03-01T10:00:00|00:10|{cells}\n")
        with pytest.raises(TraceError) as err:
            load_sacct(f)
        assert str(err.value).startswith(f"{f}:2: {problem}"), str(err.value)


def test_sacct_json_in_22_05_and_23_11_shapes(tmp_path):
    def num(v):
        return {"set": True, "infinite": False, "number": v}

    doc = {"meta": {}, "errors": [], "jobs": [
        {"job_id": 200, "name": "a", "partition": "gpu", "allocation_nodes": 2,
         "time": {"submission": 1000, "start": 1010, "end": 4610, "elapsed": 3600},
         "tres": {"allocated": [{"type": "cpu", "count": 8},
                                {"type": "gres", "name": "gpu", "count": 8}]}},
        {"job_id": 202, "name": "b", "partition": "gpu", "allocation_nodes": num(1),
         "array": {"job_id": 201, "task_id": num(4)},
         "time": {"submission": num(1600), "start": num(1700), "end": num(1760),
                  "elapsed": 60},
         "tres": {"allocated": [], "requested": [{"type": "gres", "name": "gpu:a100",
                                                  "count": 2}]}},
        {"job_id": 203, "name": "pending", "time": {"submission": 1700, "start": 0, "end": 0}},
    ]}
    f = tmp_path / "sacct.json"
    f.write_text(json.dumps(doc))
    jobs, skipped = load_sacct(f)
    assert skipped == 1
    assert [(j.name, j.arrival_s, j.gpus, j.duration_s, j.nodes) for j in jobs] == [
        ("200", 0.0, 8, 3600.0, 2), ("201_4", 600.0, 2, 60.0, 1)]
    doc["jobs"][0]["time"]["elapsed"] = "an hour"
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"field jobs\[0\]\.time\.elapsed='an hour'"):
        load_sacct(f)
    # An elapsed that is not set is taken from start and end (it was refused as unset).
    doc["jobs"][0]["time"]["elapsed"] = {"set": False, "infinite": False, "number": 0}
    f.write_text(json.dumps(doc))
    assert load_sacct(f)[0][0].duration_s == 3600.0
    doc["jobs"][0]["time"]["end"] = 1000   # named as end, not as elapsed=None
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"field jobs\[0\]\.time\.end=1000: before "
                                         r"jobs\[0\]\.time\.start \(1010\)"):
        load_sacct(f)
    doc["jobs"][0]["time"]["end"] = 4610
    for bad, field in (({"x": 1}, "job_id"), (-9, "job_id"), (num(-3), "task_id"),
                       (num(1.5), "task_id")):
        doc["jobs"][1]["array"][field] = bad    # became job names like "{'x': 1}_4", "9_-3"
        f.write_text(json.dumps(doc))
        with pytest.raises(TraceError, match=rf"field jobs\[1\]\.array\.{field}=.*not an "
                                             r"integer >= 0"):
            load_sacct(f)
        doc["jobs"][1]["array"] = {"job_id": 201, "task_id": num(4)}
    doc["jobs"][0]["time"]["elapsed"] = 3600
    doc["jobs"][0]["tres"]["allocated"][1]["count"] = "x"   # was read as 0 GPUs
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"field jobs\[0\]\.tres\.allocated\[1\]\.count='x': "
                                         r"the GPU count is not an integer from 0 to 9223372036854775807"):
        load_sacct(f)
    doc["jobs"][0]["tres"]["allocated"][1]["count"] = 8
    for bad in (-3, 1.5):    # -3 was accepted as a node count
        doc["jobs"][0]["allocation_nodes"] = bad
        f.write_text(json.dumps(doc))
        with pytest.raises(TraceError, match=rf"field jobs\[0\]\.allocation_nodes={bad}: "
                                             r"jobs\[0\]: not an integer >= 0"):
            load_sacct(f)
    doc["jobs"][0]["allocation_nodes"] = 2
    doc["jobs"][1]["tres"]["requested"] = {"gres/gpu": 2}
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"field jobs\[1\]\.tres\.requested=.*expected a list"):
        load_sacct(f)
    f.write_text('{"jobs": [')
    with pytest.raises(TraceError, match="not valid JSON"):
        load_sacct(f)
    f.write_text('{"meta": {}}')
    with pytest.raises(TraceError, match="'jobs' list"):
        load_sacct(f)


def test_sacct_unknown_format_and_eagle_csv_malformed(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="not sacct --json, sacct -P text"):
        load_sacct(f)
    src = (SHARED / "nrel_eagle_slurm" / "sample_eagle_data.csv")
    if not src.exists():
        pytest.skip("the shared data folder /work/shared/data is not here")
    lines = src.read_text().splitlines()[:4]
    cells = lines[3].split(",")
    cells[8] = "-2"   # gpus_req
    lines[3] = ",".join(cells)
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"x.csv:4: field gpus_req='-2': must be >= 0"):
        load_sacct(f)


def test_eagle_rows_without_a_start_time_are_counted_as_left_out(tmp_path):
    """(Regression: already counted, and noted by the command.) An Eagle row whose
    start_time is empty or None is a job that never started: skipped and counted."""
    head = ("job_id,user,account,partition,qos,wallclock_req,nodes_req,processors_req,"
            "gpus_req,mem_req,submit_time,start_time,end_time,run_time,state,name,work_dir,"
            "submit_line\n")
    row = ("{id},u,a,p,normal,600.0,1,1,0,0.0,2019-01-01 08:55:55,{start},,{run},{state},n,w,"
           "s\n")
    f = tmp_path / "eagle.csv"
    f.write_text(head + row.format(id=1, start="2019-01-01 08:55:56", run="60.0",
                                   state="COMPLETED")
                 + row.format(id=2, start="", run="0.0", state="CANCELLED")
                 + row.format(id=3, start="None", run="0.0", state="CANCELLED"))
    jobs, skipped = load_sacct(f)
    assert [j.name for j in jobs] == ["1"] and skipped == 2


@pytest.mark.parametrize("text", [
    '{"jobs": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"jobs": [{"job_id": 1, "time": ' + "{\"a\": " * 100_000 + "1" + "}" * 100_000 + "}]}",
])
def test_sacct_json_nested_too_deeply_is_refused(tmp_path, text):
    """Python's JSON decoder recurses per level: 100000 levels raised RecursionError
    (a traceback, exit code 1)."""
    f = tmp_path / "deep.json"
    f.write_text(text)
    with pytest.raises(TraceError) as err:
        load_sacct(f)
    assert str(err.value).startswith(f"{f}: JSON nested too deeply to read (lists or objects "
                                     "more than about ")


def test_a_nested_json_value_is_shown_abridged(tmp_path):
    """A job that is a list 900 deep (within the decoder's reach) was shown whole: 1800
    characters of brackets in a one-line error."""
    f = tmp_path / "deep.json"
    f.write_text('{"jobs": [' + "[" * 900 + "]" * 900 + "]}")
    with pytest.raises(TraceError) as err:
        load_sacct(f)
    assert str(err.value) == f"{f}: field jobs[0]=[[[[...]]]]: not an object"
    big = {"job_id": 1, "name": "x" * 500, "time": {"submission": 5}}
    message = str(TraceError(f, 0, "jobs[0]", [big] * 50, "not an object"))
    assert message.startswith(f"{f}: field jobs[0]=[{{'job_id': 1, ")
    assert len(message) - len(str(f)) <= len(": field jobs[0]=: not an object") + 200
    assert str(TraceError(f, 2, "name", "x" * 90, "bad")) == f"{f}:2: field name={'x' * 90!r}: bad"


def test_trace_job_gpu_time():
    assert TraceJob("a", 0.0, 4, duration_s=10.0).gpu_time_s == 40.0
    assert TraceJob("a", 0.0, 4).gpu_time_s is None
    assert math.isfinite(TraceJob("a", 1.5, 0, duration_s=0.0).gpu_time_s)


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("cell, problem", [
    # (a tester: Python's float() takes these, so they were read as integers)
    ("1e2", "not an integer"), ("1_000", "not an integer"), ("\u0663", "not an integer"),
    ("9" * 5000, "must be <= 9223372036854775807"),
    ("99999999999999999999", "must be <= 9223372036854775807"),
    ("2.5", "not an integer"), ("nan", "not an integer"),
])
def test_an_integer_field_takes_ascii_digits_only(tmp_path, cell, problem):
    f = tmp_path / "g.csv"
    f.write_text(GAVEL_HEAD + f"0,v,0,LM (batch size 5),-n,1,{cell},0.0,1\n")
    with pytest.raises(TraceError) as err:
        load_gavel(f)
    assert err.value.field == "total_steps" and str(err.value).endswith(problem)
    assert len(str(err.value)) < 300     # a 5,000-digit value is cut, its length said
    f.write_text(GAVEL_HEAD + "0,v,0,LM (batch size 5),-n,1, 4.0 ,0.0,+1\n")
    assert load_gavel(f)[0].total_steps == 4     # (as pandas writes an integer column)


@pytest.mark.parametrize(("cell", "problem"), [
    ("1_000", "not a decimal number"), ("\u0663", "not a decimal number"),
    ("inf", "not a finite number"), ("nan", "not a finite number"),
    ("1e999", "not a finite number")])
def test_a_number_field_takes_ascii_decimal_notation_only(tmp_path, cell, problem):
    f = tmp_path / "g.csv"
    f.write_text(GAVEL_HEAD + f"0,v,0,LM (batch size 5),-n,1,100,{cell},1\n")
    with pytest.raises(TraceError, match=f"field arrival_time_s=.*: {problem}"):
        load_gavel(f)


def test_a_long_value_is_shown_cut_with_its_length():
    message = str(TraceError("t.csv", 3, "x", "7" * 5000, "bad"))
    assert message.startswith("t.csv:3: field x='777") and message.endswith(
        "... (5000 characters): bad") and len(message) < 200
    message = str(TraceError("t.json", 0, "x", 10**5000, "bad"))
    assert message == "t.json: field x=<an integer of about 5000 digits>: bad"


@pytest.mark.parametrize("row, field, problem", [
    # (a tester: batch size 0 and a 30-digit batch were taken; 10**12 GPUs was a job; an
    # empty VC named its jobs "-<line_no>")
    ("0,v,0,LM (batch size 0),-n,1,100,0.0,1", "job_type", "batch size 0 outside 1 to "
     "2147483647"),
    ("0,v,0,LM (batch size 99999999999),-n,1,100,0.0,1", "job_type", "batch size "
     "99999999999 outside 1 to 2147483647"),
    ("0,v,0,LM (batch size 5),-n,1,100,0.0,1000000000000", "scale_factor", "must be <= "
     "1048576"),
    ("0, ,0,LM (batch size 5),-n,1,100,0.0,1", "vc", "empty (every job names its virtual "
     "cluster; its jobs were named '-<line_no>')"),
    ("0,v,0,LM (batch size 1e2),-n,1,100,0.0,1", "job_type", "expected 'MODEL (batch size "
     "N)', N in ASCII digits"),
    ("0,v,0,LM (batch size 128) extra,-n,1,100,0.0,1", "job_type", "expected 'MODEL (batch "
     "size N)', N in ASCII digits"),
    ("0,v,0,LM (batch size \uff11\uff12),-n,1,100,0.0,1", "job_type", "expected 'MODEL (batch "
     "size N)', N in ASCII digits"),
])
def test_gavel_refuses_an_impossible_batch_size_gpu_count_or_vc(tmp_path, row, field, problem):
    f = tmp_path / "g.csv"
    f.write_text(GAVEL_HEAD + row + "\n")
    with pytest.raises(TraceError) as err:
        load_gavel(f)
    assert err.value.line == 2 and err.value.field == field
    assert str(err.value).endswith(": " + problem), str(err.value)


@pytest.mark.parametrize("job, field, problem", [
    ('{"job_id": %s, "time": {"submission": 5}}' % ("9" * 30), "jobs[0].job_id",
     "not an integer from 1 to 9223372036854775807"),
    ('{"job_id": 1, "time": {"submission": %s}}' % ("9" * 400), "jobs[0].time.submission",
     "a number beyond +-9223372036854775807"),
])
def test_sacct_json_refuses_integers_beyond_int64(tmp_path, job, field, problem):
    """An integer above 1e308 was an OverflowError traceback (math.isfinite)."""
    f = tmp_path / "s.json"
    f.write_text('{"jobs": [' + job + ']}')
    with pytest.raises(TraceError) as err:
        load_sacct(f)
    assert err.value.field == field and str(err.value).endswith(problem)
    # Beyond Python's 4,300 digits (json.load raised ValueError): named by its path too.
    f.write_text('{"jobs": [{"job_id": ' + "9" * 5000 + '}]}')
    with pytest.raises(TraceError, match=r"s.json: field jobs\[0\]\.job_id=<an integer of 5000 "
                                         r"digits>: not an integer from 1 to"):
        load_sacct(f)
    f.write_text('{"jobs": [{"job_id": 3, "time": {"submission": -' + "9" * 5000 + '}}]}')
    with pytest.raises(TraceError, match=r"field jobs\[0\]\.time\.submission=<an integer of "
                                         r"5000 digits>: a number beyond"):
        load_sacct(f)


def test_swf_and_sacct_text_counts_are_ascii_integers_within_int64(tmp_path):
    """float() took 1e1 processors (10 GPUs), full-width digits, 1_451 and 2**63 in SWF;
    a 5,000-digit sacct GPU count or day count was a ValueError without line or field,
    and 99999999999999999999 days a duration (a tester)."""
    row = "1 0 0 100 {p} -1 -1 {p} -1 -1 1 1 1 1 1 1 -1 -1\n"
    f = tmp_path / "t.swf"
    for procs, problem in (("1e1", "not an integer"), ("\uff14", "not an integer"),
                           ("9223372036854775808", "must be <= 9223372036854775807"),
                           ("9" * 5000, "must be <= 9223372036854775807")):
        f.write_text(row.format(p=procs))
        with pytest.raises(TraceError) as err:
            load_swf(f)
        assert err.value.field == "alloc_procs" and str(err.value).endswith(problem)
        assert len(str(err.value)) < 300
    f.write_text(row.format(p=4).replace(" 100 ", " 1_451 "))
    with pytest.raises(TraceError, match=r"field run_time='1_451': not a number$"):
        load_swf(f)
    head = "JobID|Submit|Elapsed|AllocTRES|ReqTRES|AllocGRES\n"
    f = tmp_path / "sacct.txt"
    for cells, field in ((f"00:10|gres/gpu={'9' * 5000}||", "AllocTRES"),
                         ("00:10|gres/gpu=9223372036854775808||", "AllocTRES"),
                         (f"00:10|||gpu:{'9' * 5000}", "AllocGRES"),
                         (f"{'9' * 5000}-01:00:00|||", "Elapsed"),
                         ("99999999999999999999-01:00:00|||", "Elapsed")):
        f.write_text(head + f"1|2024-03-01T10:00:00|{cells}\n")
        with pytest.raises(TraceError) as err:
            load_sacct(f)
        assert (err.value.line, err.value.field) == (2, field), str(err.value)
        assert len(str(err.value)) < 400


@pytest.mark.parametrize("submission, problem", [
    (None, "missing submission time"), (-5, "not a submission time (seconds since 1970, > 0)"),
    (0, "not a submission time (seconds since 1970, > 0)")])
def test_sacct_json_names_a_missing_or_negative_submission_time(tmp_path, submission, problem):
    """-5 was reported as missing, though present (a tester)."""
    f = tmp_path / "s.json"
    time = {} if submission is None else {"submission": submission}
    f.write_text(json.dumps({"jobs": [{"job_id": 1, "time": time}]}))
    with pytest.raises(TraceError) as err:
        load_sacct(f)
    assert err.value.field == "jobs[0].time.submission" and str(err.value).endswith(problem)
