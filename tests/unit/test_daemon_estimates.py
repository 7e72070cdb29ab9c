"""The estimator book's caches: what it keeps across cycles equals what it would recompute.

The book keeps the finished jobs' per-group prior and work history until a
finished job is learned or the group numbering changes, refits only the groups
that grew, reads new samples by id range and leaves the state as it is when the
jobs are the same. Each test compares what the book hands to the estimators
with a from-scratch computation (`prior_from_finished` and `WorkHistory` over
all finished jobs, a fresh book).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import select

import malleable.daemon.estimates as book_mod
from malleable.daemon.cycle import spec_as_dict
from malleable.daemon.estimates import (
    ESTIMATOR_MODEL,
    EstimatorBook,
    estimate_params,
    group_key,
)
from malleable.db import schema, store
from malleable.db.engine import make_engine, session_factory
from malleable.db.models import Job, ProgressSample
from malleable.estimators import (
    ThroughputParams,
    WorkHistory,
    group_prior,
    prior_from_finished,
)
from malleable.estimators.incremental import SETTLE_TOL
from malleable.slurm.records import JobState, SlurmJob

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
G = 4
SPECS = {"1": "malleable:gpus=1-4,batch=128,model=resnet",
         "2": "malleable:gpus=1-4,batch=128,model=resnet",
         "3": "malleable:gpus=1-4,batch=64,model=vgg",
         "4": "malleable:gpus=1-4,batch=64,model=bert",
         "5": "malleable:gpus=1-4,batch=64,model=aaa"}


def _slurm(job_id: str, state: JobState) -> SlurmJob:
    return SlurmJob(job_id=job_id, job_id_num=int(job_id), name=f"j{job_id}", user="alice",
                    uid=1000, partition="gpu", state=state, gpus=2, node_count=1,
                    gpus_per_node=2, comment=SPECS[job_id], restart_count=0,
                    requeueable=True, submit_time=T0, reason="None")


class Store:
    """An SQLite store the tests fill the way the daemon does (jobs, samples, estimates)."""

    def __init__(self, tmp_path):
        engine = make_engine(f"sqlite:///{tmp_path / 'state.db'}")
        schema.upgrade(engine)
        self.S = session_factory(engine)
        self.states: dict[str, JobState] = {}
        self.t = T0

    def set_state(self, **states: JobState) -> None:
        self.states.update({k.lstrip("j"): v for k, v in states.items()})
        with self.S() as s, s.begin():
            store.upsert_jobs(s, [_slurm(j, st) for j, st in self.states.items()], self.t,
                              parse_spec=spec_as_dict)

    def add_samples(self, job: str, n: int, gpus: int = 2, rate: float = 1000.0) -> None:
        with self.S() as s, s.begin():
            jid = store.job_ids(s, [job])[job]
            last = s.scalars(select(ProgressSample.samples)
                             .where(ProgressSample.job_id == jid)
                             .order_by(ProgressSample.id.desc())).first() or 0
            rows = [store.SampleIn(jid, self.t + timedelta(seconds=10 * (i + 1)), step=i,
                                   samples=int(last + rate * 10 * (i + 1)), gpus=gpus,
                                   batch_size=128, nodes=1, restart=0) for i in range(n)]
            store.add_progress_samples(s, rows)
        self.t += timedelta(seconds=10 * n + 60)

    def run(self, book: EstimatorBook, jobs: list[str], record: bool = True):
        """One cycle of ``book`` on ``jobs``; returns (est, table, cycle's prior, history)."""
        seen = {}
        real = book_mod.cycle_changed

        def spy(*a, **kw):
            seen.update(kw)
            return real(*a, **kw)

        with self.S() as s, s.begin():
            rows = [s.scalars(select(Job).where(Job.slurm_job_id == j)).one() for j in jobs]
            book_mod.cycle_changed = spy
            try:
                est, table = book.run(s, rows, G, 16)
            finally:
                book_mod.cycle_changed = real
            if record:
                for i, j in enumerate(rows):
                    store.record_estimate(s, job_id=j.id, time=self.t, model=ESTIMATOR_MODEL,
                                          params=estimate_params(est, i),
                                          remaining_work=float(est.remaining_work[i]),
                                          remaining_work_sd=float(est.remaining_std[i]),
                                          flags={})
            # The book's numbering: group key i has number i.
            groups = sorted(book.group_numbers, key=book.group_numbers.__getitem__)
            assert set(groups) >= set(book.finished.group) | {group_key(j) for j in rows}
        return est, table, seen.get("prior"), seen.get("history"), groups


def _fresh(book: EstimatorBook, groups: list[str], job_groups: np.ndarray):
    """The prior and history recomputed from all the book's finished knowledge."""
    fk = book.finished
    number = {g: i for i, g in enumerate(groups)}
    hg = np.array([number[g] for g in fk.group], np.int64)
    prior = prior_from_finished(ThroughputParams.from_u(np.array(fk.u)), hg, job_groups,
                                log_sd=np.array(fk.log_sd))
    return prior, WorkHistory(np.array(fk.total_work), hg)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _assert_prior_is_fresh(book, prior, history, groups, job_groups):
    want_prior, want_history = _fresh(book, groups, job_groups)
    assert _same(prior.given, want_prior.given)
    assert _same(prior.log_sd, want_prior.log_sd)
    for got, want in zip(prior.mean, want_prior.mean, strict=True):
        assert _same(got, want)
    assert _same(history.total_work, want_history.total_work)
    assert _same(history.group, want_history.group)


@pytest.fixture
def filled(tmp_path):
    st = Store(tmp_path)
    st.set_state(j1=JobState.RUNNING, j2=JobState.RUNNING, j3=JobState.RUNNING)
    for j, rate in (("1", 900.0), ("2", 1100.0), ("3", 500.0)):
        st.add_samples(j, 6, rate=rate)
    return st


def test_the_kept_prior_equals_the_recomputed_one_as_jobs_finish(filled):
    st, book = filled, EstimatorBook()
    *_, prior, history, _ = st.run(book, ["1", "2", "3"])
    assert prior is None and history is None          # nothing finished yet
    st.set_state(j1=JobState.COMPLETED)
    st.add_samples("2", 3)
    est, _, prior, history, groups = st.run(book, ["2", "3"])
    assert book.finished.seen == {1} and prior.given.tolist() == [True, False]
    _assert_prior_is_fresh(book, prior, history, groups, np.array([0, 1]))
    kept = book._priors
    # Nothing new finished: the same prior and history objects are used again.
    st.add_samples("2", 2)
    *_, prior2, history2, groups = st.run(book, ["2", "3"])
    assert book._priors is kept and history2 is history
    _assert_prior_is_fresh(book, prior2, history2, groups, np.array([0, 1]))
    # A second job of the group finishes: the group's prior is refitted.
    st.set_state(j2=JobState.COMPLETED)
    st.add_samples("3", 2)
    *_, prior3, history3, groups = st.run(book, ["3"])
    assert book._priors is not kept and len(book.finished.group) == 2
    assert book._group_priors["model:resnet"][0] == 2
    _assert_prior_is_fresh(book, prior3, history3, groups, np.array([1]))


def test_a_new_group_gets_the_next_number_and_the_others_keep_theirs(filled):
    """Numbers are never reassigned: a job's spec row (its history group) does not
    change because another group appeared, so it is not fitted again for it."""
    st, book = filled, EstimatorBook()
    st.run(book, ["1", "2", "3"])
    st.set_state(j1=JobState.COMPLETED)
    *_, groups = st.run(book, ["2", "3"])
    kept = book._priors
    assert groups == ["model:resnet", "model:vgg"]
    # Job 5's group sorts first by name, but is numbered after the others.
    st.set_state(j5=JobState.RUNNING)
    st.add_samples("5", 4)
    *_, prior, history, groups = st.run(book, ["2", "3", "5"])
    assert groups == ["model:resnet", "model:vgg", "model:aaa"]
    assert book._priors is not kept and history.group.tolist() == [0]
    assert prior.given.tolist() == [True, False, False]
    _assert_prior_is_fresh(book, prior, history, groups, np.array([0, 1, 2]))
    # Job 3 (vgg) leaves: the numbers stay, so nothing is rebuilt.
    kept = book._priors
    *_, groups = st.run(book, ["2", "5"])
    assert groups == ["model:resnet", "model:vgg", "model:aaa"] and book._priors is kept


def test_group_prior_for_jobs_equals_the_per_job_prior():
    rng = np.random.default_rng(3)
    H = 9
    u = np.column_stack([rng.normal(-3, 1, (H, 6)), rng.normal(0, 1, H)])
    fin = ThroughputParams.from_u(u)
    group = np.array([2, 2, 0, 5, 5, 5, 2, 7, 0])
    sd = np.abs(rng.normal(0.3, 0.2, (H, 7)))
    sd[1, 3] = np.nan
    jobs = np.array([5, -1, 2, 3, 0, 7, 5, 2])
    for log_sd in (None, sd):
        a = prior_from_finished(fin, group, jobs, log_sd=log_sd)
        b = group_prior(fin, group, log_sd=log_sd).for_jobs(jobs)
        assert a.given.tolist() == [True, False, True, False, True, True, True, True]
        assert _same(a.log_sd, b.log_sd) and _same(a.given, b.given)
        # Each job's prior is its group's: the mean of the group's u.
        for j, g in enumerate(jobs):
            if a.given[j]:
                np.testing.assert_allclose(ThroughputParams(*(f[j] for f in a.mean)).to_u(),
                                           u[group == g].mean(axis=0), rtol=1e-12)
    empty = group_prior(ThroughputParams.from_u(np.zeros((0, 7))), np.zeros(0, np.int64))
    assert empty.for_jobs(np.array([0, -1])).given.tolist() == [False, False]


def test_samples_come_once_each_by_id_range(filled):
    st, book = filled, EstimatorBook()
    st.run(book, ["1"], record=False)                 # job 2's samples exist, not read yet
    st.add_samples("1", 3)
    st.add_samples("2", 4)
    st.add_samples("3", 2)
    st.run(book, ["1", "2"], record=False)            # 2 is new: all its samples
    st.add_samples("2", 2)
    st.run(book, ["1", "2"], record=False)            # the same jobs: the state as it was
    fresh = EstimatorBook()
    st.run(fresh, ["1", "2"], record=False)           # a restart: every sample at once
    assert book.state.intervals.tolist() == fresh.state.intervals.tolist()
    assert book.state.rejected.tolist() == fresh.state.rejected.tolist() == [0, 0]
    assert book.watermark == fresh.watermark
    np.testing.assert_allclose(book.state.progress, fresh.state.progress, rtol=1e-12)


def test_job_specs_cache_gives_what_a_fresh_read_gives():
    """`job_specs` with its per-job cache equals it without, cycle after cycle, while a
    job's spec text, name or user changes, jobs come and go, and the list is empty."""
    from dataclasses import fields
    from types import SimpleNamespace

    from malleable.daemon.estimates import job_specs

    def job(i, spec, name="train", user="alice"):
        return SimpleNamespace(id=i, spec=spec, spec_text=repr(sorted(spec.items())),
                               name=name, user=user)

    a = job(1, {"min_gpus": 1, "max_gpus": 8, "batch_size": 64, "target_samples": 1e6})
    b = job(2, {"min_gpus": 2, "max_gpus": 4, "step": 2, "metric_goal": "min",
                "target_metric": 0.1, "model": "bert"})
    c = job(3, {"min_gpus": 1, "max_gpus": 2, "max_batch_size": 512.0})
    b2 = job(2, {"min_gpus": 2, "max_gpus": 6, "step": 2, "target_epochs": 3,
                 "samples_per_epoch": 5e4})
    c2 = job(3, c.spec, name="renamed")
    groups = {"model:bert": 0, "name:alice/train": 1, "name:alice/renamed": 2}
    cache: dict = {}
    for jobs, first in ([a, b], {1: 32.0}), ([a, b, c], {3: 16.0}), ([b2, c2], {}), ([], {}), \
            ([c2, a], {1: 8.0}):
        got, want = job_specs(jobs, groups, first, cache), job_specs(jobs, groups, first)
        for f in fields(want):
            x, y = getattr(got, f.name), getattr(want, f.name)
            if isinstance(y, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name
        assert set(cache) == {j.id for j in jobs}
    assert cache[3][3][-1] == "name:alice/renamed"


def test_stored_estimates_are_forgotten_after_a_gap_or_an_uncommitted_cycle():
    from datetime import UTC, datetime, timedelta

    from malleable.daemon.estimates import StoredEstimates

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def changed(kept, now, **remaining):
        """Positions to write, for jobs 1 and 2 with these remaining works."""
        ids = [1, 2]
        keys = [([1.0], [0.0], 1.0, 0.1, 0.5, 64.0, remaining[f"w{j}"], 0.0, 0) for j in ids]
        return kept.changed(ids, keys, now, 90)

    kept = StoredEstimates()
    assert changed(kept, t0, w1=5.0, w2=6.0) == [0, 1]
    kept.committed(t0)
    t1 = t0 + timedelta(seconds=60)
    assert changed(kept, t1, w1=5.0, w2=7.0) == [1]
    kept.committed(t1)
    # Not committed: what that cycle saw is not taken as stored.
    t2 = t1 + timedelta(seconds=60)
    assert changed(kept, t2, w1=8.0, w2=7.0) == [0]
    assert changed(kept, t2, w1=8.0, w2=7.0) == [0]
    kept.clear()
    assert changed(kept, t2, w1=8.0, w2=7.0) == [0, 1]
    kept.committed(t2)
    assert changed(kept, t2 + timedelta(seconds=60), w1=8.0, w2=7.0) == []
    # A longer gap than the lease timeout: another daemon may have written meanwhile.
    assert changed(kept, t2 + timedelta(seconds=91), w1=8.0, w2=7.0) == [0, 1]


def test_estimate_rows_hold_what_estimate_params_gives(filled):
    """`estimate_keys` and `estimate_row` store the same params as `estimate_params`
    (non-finite values as None), and the remaining work and flags of the row."""
    from datetime import UTC, datetime

    from malleable.daemon.estimates import estimate_keys, estimate_row

    filled.set_state(j4=JobState.PENDING)   # (no samples: non-finite values)
    est, *_ = filled.run(EstimatorBook(), ["1", "2", "3", "4"], record=False)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    keys = estimate_keys(est)
    assert len(keys) == 4
    for i, key in enumerate(keys):
        row = estimate_row(100 + i, t, key)
        assert row["params"] == estimate_params(est, i)
        assert row["job_id"] == 100 + i and row["time"] == t
        w = float(est.remaining_work[i])
        assert row["remaining_work"] == (w if np.isfinite(w) else None)
        assert row["flags"] == {"bits": int(est.flags[i])}


def test_a_run_that_fails_after_reading_samples_loses_none(filled, monkeypatch):
    """The samples read by a run whose estimators raised are read again by the next
    run (the watermark had moved past them): its state is a fresh book's."""
    st, book = filled, EstimatorBook()
    st.run(book, ["1", "2"], record=False)
    st.set_state(j4=JobState.RUNNING)
    st.add_samples("1", 3)
    st.add_samples("4", 5)

    def broken(*a, **kw):
        raise ValueError("estimators failed")

    with monkeypatch.context() as m, st.S() as s:
        m.setattr(book_mod, "cycle_changed", broken)
        with pytest.raises(ValueError, match="estimators failed"):
            book.run(s, [s.scalars(select(Job).where(Job.slurm_job_id == j)).one()
                         for j in ("1", "2", "4")], G, 16)
    assert book.ids == [] and book.memo is None
    assert book._completed_key is None   # (finished jobs are checked again too)
    st.run(book, ["1", "2", "4"], record=False)
    fresh = EstimatorBook()
    st.run(fresh, ["1", "2", "4"], record=False)
    assert book.state.intervals.tolist() == fresh.state.intervals.tolist()
    assert min(book.state.intervals.tolist()) > 0
    np.testing.assert_allclose(book.state.progress, fresh.state.progress, rtol=1e-12)


def test_kept_jobs_keep_their_estimates_as_jobs_come_go_and_reorder(filled):
    """The book's memo follows its rows (`EstimatorBook._align`): a job with nothing
    new keeps its estimate, whichever jobs are around it and in whatever order."""
    st, book = filled, EstimatorBook()
    for _ in range(30):                          # until every fit has settled
        est, table, *_ = st.run(book, ["1", "2", "3"], record=False)
        if book.memo.settled.all():
            break
    assert book.memo.settled.all()
    u = {j: est.u[i].tolist() for i, j in enumerate("123")}
    goodput = {j: table.goodput[i].tolist() for i, j in enumerate("123")}
    st.set_state(j5=JobState.RUNNING)
    st.add_samples("5", 4)
    for jobs in (["3", "5", "1"], ["1", "3"], ["3", "1", "2"]):
        est, table, *_ = st.run(book, jobs, record=False)
        for i, j in enumerate(jobs):
            if j in ("1", "3"):
                assert est.u[i].tolist() == u[j], (jobs, j)
                assert table.goodput[i].tolist() == goodput[j], (jobs, j)
    # Job 2 left and came back: its state was rebuilt from its stored samples and it
    # was fitted anew (not settled yet), to about where it was; 1 and 3 were kept.
    assert book.memo.settled.tolist() == [True, True, False]
    np.testing.assert_allclose(est.u[2], u["2"], atol=SETTLE_TOL)
