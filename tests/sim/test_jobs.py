"""Simulated jobs on the simulated Slurm: progress, progress files, checkpoint-requeue, shrink."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from malleable.progress.lines import ProgressRecord, parse_line
from malleable.sim.engine import Engine
from malleable.sim.jobs import (
    ProfileJob,
    ProgressFiles,
    RigidJob,
    progress_path,
    progress_record,
    write_progress_line,
)
from malleable.sim.profiles import load_profile
from malleable.sim.slurm import SimSlurm
from malleable.slurm.records import JobState, SignalTarget, SubmitRequest

KEYS_REQUIRED = ["v", "t", "job", "event", "step", "samples", "gpus", "nodes", "batch"]


def lines(spool: Path, job_id: str) -> list[dict]:
    return [json.loads(x) for x in progress_path(spool, job_id).read_text().splitlines()]


def submit(s: SimSlurm, prog, nodes: int, gpn: int, requeue: bool = True) -> str:
    return s.submit_sim(SubmitRequest(script="x.sbatch", nodes=nodes, gpus_per_node=gpn,
                                      requeue=requeue), prog)


def test_a_job_alone_finishes_at_resume_plus_its_isolated_time(tmp_path):
    prof = load_profile("cifar10")
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4)
    job = ProfileJob(prof, spool_dir=tmp_path, batch=512)
    jid = submit(s, job, 1, 4)
    eng.run()
    assert job.done and s.job(jid).state == JobState.COMPLETED
    expected = job.resume_s + prof.isolated_time(4, batch=512, gpus_per_node=4)
    assert job.finished_at == pytest.approx(expected, rel=1e-9)
    assert job.resume_s == pytest.approx(0.9 * 30.0) and job.save_s == pytest.approx(3.0)
    recs = lines(tmp_path, jid)
    assert [r["event"] for r in recs[:2]] == ["started", "progress"]
    assert recs[-1]["event"] == "finished"
    assert all(r["event"] == "progress" for r in recs[1:-1])
    # Reports every 30 s of training; times, steps and samples never go back.
    assert recs[0]["t"] == pytest.approx(eng.epoch + job.resume_s)
    assert recs[1]["t"] - recs[0]["t"] == pytest.approx(30.0)
    for a, b in zip(recs, recs[1:], strict=False):
        assert b["t"] >= a["t"] and b["step"] >= a["step"] and b["samples"] >= a["samples"]
    last = recs[-1]
    assert last["samples"] == pytest.approx(last["step"] * 512, abs=512)
    assert (last["gpus"], last["nodes"], last["batch"], last["restart"], last["job"]) == \
        (4, 1, 512, 0, jid)
    assert last["metric"] == pytest.approx(prof.metric(prof.target_progress, 512))
    # Iterations to finish: progress / gain summed over epochs, as the profile says.
    assert job.progress == pytest.approx(prof.target_progress)


def test_progress_lines_have_exactly_the_documented_keys_in_order(tmp_path):
    rec = progress_record(t=1.23456, job="7", event="checkpointed", step=3, samples=12, gpus=2,
                          nodes=1, batch=4, restart=1, metric=0.5, grad_sqr=1.0, grad_var=2.0,
                          path="/ckpt/7")
    assert list(rec) == KEYS_REQUIRED + ["metric", "grad_sqr", "grad_var", "restart", "path"]
    assert rec["v"] == 1 and rec["t"] == 1.235
    minimal = progress_record(t=0.0, job="7", event="started", step=0, samples=0, gpus=1,
                              nodes=1, batch=4, restart=0)
    assert list(minimal) == KEYS_REQUIRED + ["restart"]
    with pytest.raises(ValueError, match="progress event must be"):
        progress_record(t=0.0, job="7", event="stopped", step=0, samples=0, gpus=1, nodes=1,
                        batch=4, restart=0)
    f = tmp_path / "7.jsonl"
    write_progress_line(f, rec)
    write_progress_line(f, minimal)
    text = f.read_text()
    assert text.count("\n") == 2 and text.startswith('{"v":1,"t":1.235,"job":"7"')


def test_kept_open_progress_files_hold_each_line_as_soon_as_it_is_written(tmp_path):
    # ProgressFiles keeps at most max_open files open; every line is readable by
    # another file object once the call returns, and the files end as
    # write_progress_line writes them.
    recs = [progress_record(t=float(i), job=str(i % 3), event="progress", step=i, samples=i,
                            gpus=1, nodes=1, batch=4, restart=0) for i in range(9)]
    with ProgressFiles(max_open=2) as files:
        for i, rec in enumerate(recs):
            files(tmp_path / f"{i % 3}.jsonl", rec)
            assert len(files) == min(i + 1, 2)
            got = [json.loads(x) for x in (tmp_path / f"{i % 3}.jsonl").read_text()
                   .splitlines()]
            assert got[-1] == rec and len(got) == i // 3 + 1
    assert len(files) == 0
    for j in range(3):
        write_progress_line(tmp_path / f"ref{j}.jsonl", recs[j])
        for rec in recs[j + 3::3]:
            write_progress_line(tmp_path / f"ref{j}.jsonl", rec)
        assert (tmp_path / f"{j}.jsonl").read_bytes() == (tmp_path / f"ref{j}.jsonl").read_bytes()
    with pytest.raises(ValueError, match="max_open must be an integer >= 1, got 0"):
        ProgressFiles(max_open=0)


def test_checkpoint_signal_save_then_requeue_resumes_from_the_checkpoint_at_a_new_size(tmp_path):
    prof = load_profile("cifar10")
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4)
    job = ProfileJob(prof, spool_dir=tmp_path, batch=1024)
    jid = submit(s, job, 1, 4)
    eng.run(until=600.0)
    s.signal(jid, "USR1", SignalTarget.BATCH)
    eng.run(until=600.0 + job.save_s - 0.01)
    assert job.phase == "saving"
    eng.run(until=660.0)
    assert job.phase == "checkpointed" and job.checkpoints == 1
    ck = [r for r in lines(tmp_path, jid) if r["event"] == "checkpointed"]
    assert len(ck) == 1 and ck[0]["t"] == pytest.approx(eng.epoch + 600.0 + job.save_s)
    assert ck[0]["path"].endswith(f"step-{ck[0]['step']}")
    step_at_ckpt = ck[0]["step"]
    # The job waits: no progress while checkpointed.
    assert job.progress == pytest.approx(job._ckpt[0])
    s.requeue_hold(jid)
    s.resize_pending(jid, 2, 4)
    s.release(jid)
    s.start_now(jid)
    eng.run()
    recs = lines(tmp_path, jid)
    started = [r for r in recs if r["event"] == "started"]
    assert len(started) == 2
    again = started[1]
    assert again["t"] == pytest.approx(eng.epoch + 660.0 + job.resume_s)
    assert (again["step"], again["gpus"], again["nodes"], again["restart"]) == \
        (step_at_ckpt, 8, 2, 1)
    assert recs[-1]["event"] == "finished" and job.done
    assert s.job(jid).restart_count == 1


def test_a_requeue_without_checkpoint_loses_the_work_since_the_last_one(tmp_path):
    prof = load_profile("ncf")
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4, requeue_delay_s=0.0)
    job = ProfileJob(prof, spool_dir=tmp_path)
    jid = submit(s, job, 1, 1)
    eng.run(until=45.0)
    job.advance()
    assert job.iterations > 0
    s.requeue_hold(jid)
    assert job.iterations == 0.0 and job.phase == "stopped"
    s.release(jid)
    eng.run(until=46.0)
    eng.run(until=46.0 + job.resume_s + 1)
    started = [r for r in lines(tmp_path, jid) if r["event"] == "started"]
    assert [r["step"] for r in started] == [0, 0]


def test_a_signal_that_misses_the_handler_is_recorded_and_ignored(tmp_path):
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4)
    job = ProfileJob(load_profile("bert"), spool_dir=tmp_path, signal_target=SignalTarget.BATCH)
    jid = submit(s, job, 1, 2)
    eng.run(until=200.0)
    s.signal(jid, "USR1", SignalTarget.STEPS)
    s.signal(jid, "TERM", SignalTarget.BATCH)
    eng.run(until=300.0)
    assert job.phase == "training" and job.checkpoints == 0
    assert [(sig, tgt) for _, sig, tgt in job.missed_signals] == [("USR1", "steps"),
                                                                   ("TERM", "batch")]
    s.signal(jid, "SIGUSR1", SignalTarget.FULL)   # FULL reaches every process
    eng.run(until=400.0)
    assert job.phase == "checkpointed"
    s.signal(jid, "USR1")                          # again: re-announces the checkpoint
    assert [r["event"] for r in lines(tmp_path, jid)].count("checkpointed") == 2


def test_shrink_in_place_continues_on_fewer_gpus_after_a_pause(tmp_path):
    prof = load_profile("deepspeech2")
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4)
    job = ProfileJob(prof, spool_dir=tmp_path, batch=160, shrink_pause_s=10.0)
    jid = submit(s, job, 2, 4)
    eng.run(until=300.0)
    job.advance()
    p_before = job.progress
    s.shrink_running(jid, 1)
    assert job.phase == "reconfiguring"
    eng.run(until=309.0)
    job.advance()
    assert job.progress == pytest.approx(p_before)   # no progress during the pause
    eng.run(until=400.0)
    recs = [r for r in lines(tmp_path, jid) if r["t"] > eng.epoch + 310.0]
    assert recs and all((r["gpus"], r["nodes"]) == (4, 1) for r in recs)
    assert [r["event"] for r in lines(tmp_path, jid)].count("started") == 1


def test_a_job_that_cannot_shrink_in_place_fails(tmp_path):
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4)
    job = ProfileJob(load_profile("yolov3"), spool_dir=tmp_path, shrink_in_place=False)
    jid = submit(s, job, 2, 4)
    eng.run(until=100.0)
    s.shrink_running(jid, 1)
    eng.run(until=101.0)
    assert s.job(jid).state == JobState.FAILED
    assert not job.done


def test_adaptive_batch_uses_the_goodput_optimal_batch(tmp_path):
    prof = load_profile("cifar10")
    eng = Engine()
    s = SimSlurm(eng, nodes=2, gpus_per_node=4)
    job = ProfileJob(prof, adaptive_batch=True)
    submit(s, job, 2, 4)
    eng.run(until=100.0)
    assert job.current_batch == prof.best_batch((4, 4), job.progress)
    fixed = ProfileJob(prof, batch=128)
    eng2 = Engine()
    s2 = SimSlurm(eng2, nodes=2, gpus_per_node=4)
    submit(s2, fixed, 2, 4)
    eng.run()
    eng2.run()
    assert job.finished_at < fixed.finished_at   # adapting the batch is faster than m0 on 8 GPUs


@pytest.mark.parametrize("batch, adaptive", [(None, False), (384, False), (None, True)])
def test_a_checkpoint_signal_before_training_starts_writes_a_line_the_parser_accepts(
        tmp_path, batch, adaptive):
    # Signalled while resuming (before its first step), a job has no current batch yet;
    # its checkpointed line carries the batch it is about to train at, never 0.
    prof = load_profile("cifar10")
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4)
    job = ProfileJob(prof, spool_dir=tmp_path, batch=batch, adaptive_batch=adaptive)
    jid = submit(s, job, 1, 2)
    eng.run(until=1.0)
    assert job.phase == "resuming" and job.current_batch == 0
    s.signal(jid, "USR1", SignalTarget.BATCH)
    eng.run(until=1.0 + job.save_s + 0.01)
    assert job.phase == "checkpointed"
    s.signal(jid, "USR1", SignalTarget.BATCH)      # again while checkpointed: the line again
    eng.run(until=2.0 + job.save_s)
    raw = progress_path(tmp_path, jid).read_bytes().splitlines()
    assert len(raw) == 2
    if adaptive:
        expected = prof.best_batch((2,), 0.0)
    else:
        expected = math.ceil((batch or prof.default_batch(2)) / 2) * 2
    for line in raw:
        rec = parse_line(line, now=eng.time() + 1.0, job_id=jid)
        assert isinstance(rec, ProgressRecord), rec
        assert (rec.event, rec.batch, rec.gpus, rec.step) == ("checkpointed", expected, 2, 0)


def test_set_batch_applies_from_the_next_start_and_bad_arguments_are_refused():
    job = ProfileJob(load_profile("cifar10"), batch=256)
    job.set_batch(512)
    assert job.batch == 512
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        job.set_batch(0)
    with pytest.raises(ValueError, match="report_interval_s"):
        ProfileJob(load_profile("cifar10"), report_interval_s=0)
    with pytest.raises(ValueError, match="save_fraction"):
        ProfileJob(load_profile("cifar10"), save_fraction=2)


def test_without_a_spool_directory_nothing_is_written(tmp_path):
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4)
    seen: list[dict] = []
    job = ProfileJob(load_profile("ncf"), spool_dir=tmp_path / "spool",
                     sink=lambda path, rec: seen.append(rec))
    quiet = ProfileJob(load_profile("ncf"))
    submit(s, job, 1, 1)
    submit(s, quiet, 1, 1)
    eng.run()
    assert job.done and quiet.done
    assert seen[0]["event"] == "started" and seen[-1]["event"] == "finished"
    assert not (tmp_path / "spool").exists()


def test_rigid_job_runs_its_duration_and_restarts_from_scratch():
    eng = Engine()
    s = SimSlurm(eng, nodes=1, gpus_per_node=4, requeue_delay_s=0.0)
    job = RigidJob(100.0)
    jid = submit(s, job, 1, 2)
    eng.run(until=40.0)
    s.signal(jid, "USR1")
    s.shrink_running(jid, 1)
    assert job.signals == ["USR1"]
    s.requeue_hold(jid)
    s.release(jid)
    eng.run()
    assert job.finished_at == pytest.approx(140.0)
    assert s.job(jid).state == JobState.COMPLETED
    with pytest.raises(ValueError, match="duration_s"):
        RigidJob(-1)
