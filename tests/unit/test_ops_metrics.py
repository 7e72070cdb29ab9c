"""The Prometheus exporter (malleable.daemon.metrics) on a real SQLite store, fed with
cycle reports as the service feeds it; its HTTP endpoint scraped with urllib.

The exporter inside a running daemon is scraped in tests/integration/test_ops_daemon.py.
"""

from __future__ import annotations

import errno
import socket
import urllib.request
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from malleable.config import Config
from malleable.daemon.cycle import CycleReport
from malleable.daemon.metrics import Exporter, exporter_from_config, parse_address
from malleable.daemon.reconcile import ActionKind, PlannedAction
from malleable.daemon.shapes import Shape
from malleable.db import store
from malleable.db.engine import make_engine, session_factory
from malleable.ops.access import effective_config
from tests.unit.ops_store import T0, build_store, write_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def setup(tmp_path):
    built = build_store(tmp_path / "m.db")
    cfg = write_config(tmp_path / "m.toml", built.url)
    return built, effective_config(str(cfg), None)


def value(exp: Exporter, name: str, **labels) -> float | None:
    return exp.registry.get_sample_value(name, labels)


def test_cycle_and_store_metrics(setup):
    built, config = setup
    exp = Exporter(config)
    # Baseline: what the store held before the exporter started is not counted.
    assert value(exp, "malleable_progress_lines_rejected_total", reason="not_json") == 0
    assert value(exp, "malleable_actions_total", kind="requeue", outcome="done") == 0
    eng = make_engine(built.url)
    with session_factory(eng)() as s, s.begin():
        ids = store.job_ids(s, ["101", "102"])
        store.save_progress_file(s, job_id=ids["101"], path="/spool/101.jsonl", device=1,
                                 inode=2, offset=5000, size=5000, now=T0, accepted=7,
                                 rejected={"not_json": 1, "future_time": 3})
        store.update_action(s, built.hold_id, now=T0 + timedelta(seconds=290),
                            state="abandoned", finished=True)
    planned = [PlannedAction("102", ActionKind.ADMIT, 2, 4, Shape(1, 4)),
               PlannedAction("101", ActionKind.REQUEUE, 4, 8, Shape(2, 4))]
    exp(CycleReport("decide", 7, T0, duration_s=0.3, rpc=3, decision_id=built.decision_id,
                    managed=2, planned=planned))
    exp(CycleReport("poll", 8, T0, duration_s=0.02, rpc=1, slurm_unavailable=True,
                    paused=True))
    assert value(exp, "malleable_progress_lines_rejected_total", reason="not_json") == 1
    assert value(exp, "malleable_progress_lines_rejected_total", reason="future_time") == 3
    assert value(exp, "malleable_progress_lines_accepted_total") == 7
    assert value(exp, "malleable_actions_total", kind="hold", outcome="abandoned") == 1
    assert value(exp, "malleable_actions_total", kind="requeue", outcome="done") == 0
    assert value(exp, "malleable_actions_in_flight", kind="hold") == 0
    assert value(exp, "malleable_actions_planned_total", kind="admit", mode="acting") == 1
    assert value(exp, "malleable_jobs", state="RUNNING") == 1        # 101; 104 is rigid
    assert value(exp, "malleable_jobs", state="PENDING") == 1
    assert value(exp, "malleable_jobs", state="COMPLETED") == 1
    assert value(exp, "malleable_jobs", state="FAILED") == 0
    assert value(exp, "malleable_gpus_held") == 4
    assert value(exp, "malleable_gpus_target") == 8
    assert value(exp, "malleable_managed_jobs") == 2
    assert value(exp, "malleable_policy_objective", policy="equi") == 2.5
    assert value(exp, "malleable_policy_duration_seconds", policy="equi") == 0.012
    assert value(exp, "malleable_cycle_duration_seconds_count", kind="decide") == 1
    assert value(exp, "malleable_cycle_duration_seconds_sum", kind="decide") == 0.3
    assert value(exp, "malleable_cycle_duration_seconds_bucket", kind="poll", le="0.025") == 1
    assert value(exp, "malleable_slurm_rpcs_per_cycle_sum", kind="decide") == 3
    assert value(exp, "malleable_slurm_rpcs_total") == 4
    assert value(exp, "malleable_cycles_total", kind="poll", outcome="slurm_unavailable") == 1
    assert value(exp, "malleable_paused") == 1
    # Counting is incremental: the same rows are not counted twice.
    with session_factory(eng)() as s, s.begin():
        store.save_progress_file(s, job_id=ids["101"], path="/spool/101.jsonl", device=1,
                                 inode=2, offset=6000, size=6000, now=T0,
                                 rejected={"not_json": 2})
    exp(CycleReport("poll", 9, T0, duration_s=0.01, rpc=1))
    assert value(exp, "malleable_progress_lines_rejected_total", reason="not_json") == 3
    assert value(exp, "malleable_actions_total", kind="hold", outcome="abandoned") == 1
    assert value(exp, "malleable_paused") == 0
    eng.dispose()
    exp.close()


def test_a_failed_store_read_is_counted_not_raised(setup, tmp_path):
    built, config = setup
    exp = Exporter(config)
    built.path.unlink()
    for suffix in ("-wal", "-shm"):
        p = built.path.with_name(built.path.name + suffix)
        if p.exists():
            p.unlink()
    exp.close()   # drop the open connection: the next read must open the missing file
    exp(CycleReport("poll", 1, T0, duration_s=0.01, rpc=1))
    assert value(exp, "malleable_exporter_errors_total") == 1
    assert value(exp, "malleable_cycles_total", kind="poll", outcome="ok") == 1


def test_endpoint_serves_its_own_registry(setup):
    _, config = setup
    port = free_port()
    cfg = Config(database=config.database, metrics=type(config.metrics)(f"127.0.0.1:{port}"))
    exp = exporter_from_config(cfg)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        text = body.decode()
        assert "malleable_up 1.0" in text and 'malleable_build_info{version="' in text
        assert "python_gc_objects_collected_total" not in text   # not the global registry
        assert REGISTRY.get_sample_value("malleable_up") is None
        with pytest.raises(OSError, match=f"metrics.address = '127.0.0.1:{port}': cannot "
                                          f"listen: port {port} is already in use") as ei:
            exporter_from_config(cfg)
        assert ei.value.errno == errno.EADDRINUSE and "[Errno" not in str(ei.value)
    finally:
        exp.close()


def test_off_by_default_and_address_validation(setup):
    assert Config().metrics.address == ""
    assert exporter_from_config(Config()) is None
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)
    assert parse_address(":9464") == ("0.0.0.0", 9464)
    assert parse_address("metrics.example.org:80") == ("metrics.example.org", 80)
    for bad in ("9464", "host:", "host:99999", "host:0", "[::1:9464", "a:b:9464"):
        with pytest.raises(ValueError, match="metrics.address = .*expected host:port"):
            parse_address(bad)


def test_the_operator_guide_lists_exactly_the_exported_metrics(setup):
    import re
    from pathlib import Path

    _, config = setup
    exp = Exporter(config)
    exported = set()
    for fam in exp.registry.collect():
        exported.add(fam.name + ("_total" if fam.type == "counter" else ""))
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md").read_text()
    documented = set(re.findall(r"^\| `(malleable_[a-z_]+)[`{]", guide, flags=re.M))
    assert documented == exported
    exp.close()
