"""The GPU inventory from slurm.conf + gres.conf, and their cross-check."""

from __future__ import annotations

import pytest

from malleable.slurm_conf import (
    Severity,
    build_inventory,
    parse_conf_text,
    parse_gres_conf,
    parse_slurm_conf,
)
from malleable.slurm_conf.parser import GRES_CONF_RECORD_KEYS


def inventory(tmp_path, slurm_text: str, gres_text: str | None):
    (tmp_path / "slurm.conf").write_text(slurm_text)
    if gres_text is not None:
        (tmp_path / "gres.conf").write_text(gres_text)
    slurm = parse_slurm_conf(tmp_path / "slurm.conf")
    gres = parse_gres_conf(tmp_path / "gres.conf") if gres_text is not None else None
    assert not slurm.findings and (gres is None or not gres.findings)
    return build_inventory(slurm, gres, str(tmp_path / "gres.conf"))


HARNESS_LIKE = """\
GresTypes=gpu
NodeName=node[1-4] NodeHostname=localhost Port=[17001-17004] CPUs=16 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP
"""
HARNESS_GRES = "".join(f"NodeName=node{i} Name=gpu File=/h/dev/node{i}/gpu[0-3]\n"
                       for i in range(1, 5))


def test_harness_like_inventory(tmp_path):
    inv, findings = inventory(tmp_path, HARNESS_LIKE, HARNESS_GRES)
    assert findings == []
    assert [n.name for n in inv.nodes] == ["node1", "node2", "node3", "node4"]
    assert inv.total_gpus == 16 and len(inv.gpu_nodes) == 4
    n3 = inv.node("node3")
    assert n3.gpus == 4 and n3.gres_conf_gpus == 4 and n3.partitions == ("gpu",)
    assert n3.device_files == tuple(f"/h/dev/node3/gpu{i}" for i in range(4))
    assert n3.location.line == 2 and n3.state == "UNKNOWN"
    (p,) = inv.partitions
    assert (p.name, p.default, p.state, p.gpu_nodes, p.gpus) == ("gpu", True, "UP", 4, 16)


def test_defaults_nodesets_all_and_types(tmp_path):
    slurm = """\
NodeName=DEFAULT CPUs=64 Gres=gpu:a100:8
NodeName=a[01-02] Features=big
NodeName=DEFAULT Gres=gpu:v100:4,mps:400
NodeName=b[1-3]
NodeName=login Gres=
NodeSet=bigones Feature=big
PartitionName=DEFAULT State=UP MaxTime=1-0
PartitionName=big Nodes=bigones Default=YES
PartitionName=all Nodes=ALL State=DRAIN
PartitionName=mixed Nodes=b[1-2],login
"""
    (tmp_path / "slurm.conf").write_text(slurm.replace("NodeName=login Gres=\n",
                                                       "NodeName=login CPUs=4 Gres=(null)\n"))
    gres = ("NodeName=a[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-7]\n"
            "NodeName=b[1-3] Name=gpu Type=v100 File=/dev/nvidia[0-3]\n")
    (tmp_path / "gres.conf").write_text(gres)
    inv, findings = build_inventory(parse_slurm_conf(tmp_path / "slurm.conf"),
                                    parse_gres_conf(tmp_path / "gres.conf"))
    assert findings == []
    a1, b2 = inv.node("a01"), inv.node("b2")
    assert a1.gpus == 8 and a1.gpu_types == (("a100", 8),)
    assert b2.gpus == 4 and b2.gpu_types == (("v100", 4),)
    assert [str(g) for g in b2.gres] == ["gpu:v100:4", "mps:400"]
    assert inv.node("login").gpus == 0
    assert inv.total_gpus == 2 * 8 + 3 * 4
    big, all_, mixed = inv.partitions
    assert big.nodes == ("a01", "a02") and big.default and big.state == "UP"
    assert len(all_.nodes) == 6 and all_.state == "DRAIN" and all_.gpus == 28
    assert mixed.nodes == ("b1", "b2", "login") and mixed.gpu_nodes == 2
    assert inv.node("b3").partitions == ("all",)


def test_gres_lines_without_nodename_apply_to_every_node_and_autodetect(tmp_path):
    slurm = "NodeName=n[1-3] Gres=gpu:2\nPartitionName=p Nodes=ALL\n"
    gres = "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-1]\nNodeName=n3 AutoDetect=off\n"
    inv, findings = inventory(tmp_path, slurm, gres)
    assert findings == []
    assert inv.node("n1").autodetect == "nvml" and inv.node("n1").gres_conf_gpus == 2
    assert inv.node("n3").autodetect is None and len(inv.node("n3").device_files) == 2


def test_autodetect_alone_is_enough(tmp_path):
    inv, findings = inventory(tmp_path, "NodeName=n[1-2] Gres=gpu:8\n", "AutoDetect=nvml\n")
    assert findings == [] and inv.node("n2").autodetect == "nvml"
    assert inv.node("n2").gres_conf_gpus is None


def test_no_gres_conf_is_one_error_for_all_gpu_nodes(tmp_path):
    inv, findings = inventory(tmp_path, "NodeName=n[1-4] Gres=gpu:4\nNodeName=cpu1\n", None)
    (f,) = findings
    assert f.severity == Severity.ERROR and f.check == "gpu-devices"
    assert f.location.line == 1 and f.location.path.endswith("slurm.conf")
    assert "n[1-4]" in f.message and "cannot bind" in f.message
    assert "NodeName=n[1-4] Name=gpu File=/dev/nvidia[0-3]" in f.fix
    assert str(tmp_path / "gres.conf") in f.fix


def test_gpu_lines_without_files_and_nodes_without_lines(tmp_path):
    slurm = "NodeName=n[1-2] Gres=gpu:4\nNodeName=m[1-2] Gres=gpu:2\n"
    gres = "NodeName=n[1-2] Name=gpu Count=4\n"
    inv, findings = inventory(tmp_path, slurm, gres)
    by_kind = {("File=" in f.message, f.location.line): f for f in findings}
    no_files = by_kind[(True, 1)]
    assert no_files.severity == Severity.ERROR and "n[1-2]" in no_files.message
    assert no_files.fix.startswith("add File=/dev/nvidia[0-3]")
    no_lines = next(f for f in findings if f.location.line is None)
    assert no_lines.location.path.endswith("gres.conf") and "m[1-2]" in no_lines.message
    assert "NodeName=m[1-2] Name=gpu File=/dev/nvidia[0-1]" in no_lines.fix
    assert inv.node("n1").gres_conf_gpus == 4 and inv.node("m1").gres_conf_gpus is None


@pytest.mark.parametrize("gres_line,gres_gpus,effect", [
    ("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-1]\n", 2, "drains"),
    ("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-7]\n", 8, "idle"),
])
def test_count_mismatch_between_the_files(tmp_path, gres_line, gres_gpus, effect):
    _, findings = inventory(tmp_path, "ClusterName=x\nNodeName=n[1-2] Gres=gpu:4\n", gres_line)
    (f,) = findings
    assert f.severity == Severity.ERROR and f.location.line == 1
    assert f.location.path.endswith("gres.conf")
    assert f"gives {gres_gpus} GPU(s)" in f.message and "slurm.conf:2" in f.message
    assert effect in f.message
    assert f"Gres=gpu:{gres_gpus}" in f.fix


def test_count_and_file_disagree_on_one_line(tmp_path):
    _, findings = inventory(tmp_path, "NodeName=n1 Gres=gpu:4\n",
                            "NodeName=n1 Name=gpu File=/dev/nvidia[0-3] Count=2\n")
    msgs = [f.message for f in findings]
    assert any("Count=2 but File= names 4" in m for m in msgs)


def test_typed_mismatch_with_equal_totals_is_a_warning(tmp_path):
    _, findings = inventory(tmp_path, "NodeName=n1 Gres=gpu:a100:4\n",
                            "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-3]\n")
    (f,) = findings
    assert f.severity == Severity.WARNING and "a100" in f.message and "h100" in f.message


def test_multiple_files_counts_one_gpu_per_line(tmp_path):
    gres = ("NodeName=n1 Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/cap1\n"
            "NodeName=n1 Name=gpu MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/cap2\n")
    inv, findings = inventory(tmp_path, "NodeName=n1 Gres=gpu:2\n", gres)
    assert findings == [] and inv.node("n1").gres_conf_gpus == 2


def test_gres_conf_gpus_for_a_node_without_gres_and_unknown_nodes(tmp_path):
    _, findings = inventory(tmp_path, "NodeName=n1\n",
                            "NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-1]\n")
    msgs = sorted((f.severity.value, f.message) for f in findings)
    assert any("no Gres=gpu" in m and "n1" in m for _, m in msgs)
    assert any("does not define: n2" in m for _, m in msgs)
    assert all(s == "warning" for s, _ in msgs)


def test_bad_node_and_partition_definitions(tmp_path):
    slurm = ("NodeName=n[1-2] Gres=gpu:2\nNodeName=n2 Gres=gpu:2\nNodeName=x[3-1]\n"
             "NodeName=y1 Gres=gpu:2,gpu:a100:2\nNodeName=z1 Gres=gpu:lots:of:4\n"
             "PartitionName=p Nodes=n[1-2],ghost[1-2]\nPartitionName=p Nodes=n1\n")
    (tmp_path / "slurm.conf").write_text(slurm)
    inv, findings = build_inventory(parse_slurm_conf(tmp_path / "slurm.conf"), None)
    lines = sorted((f.check, f.location.line) for f in findings if f.check != "gpu-devices")
    assert lines == [("gpu-nodes", 2), ("gpu-nodes", 3), ("gpu-nodes", 4), ("gpu-nodes", 5),
                     ("partitions", 6), ("partitions", 7)]
    ghost = next(f for f in findings if f.location.line == 6)
    assert "ghost[1-2]" in ghost.message
    assert [n.name for n in inv.nodes] == ["n1", "n2", "y1", "z1"]


def test_gres_text_parser_is_usable_directly(tmp_path):
    gres = parse_conf_text("Name=gpu File=/dev/nvidia0\n", str(tmp_path / "gres.conf"),
                           record_keys=GRES_CONF_RECORD_KEYS)
    slurm = parse_conf_text("NodeName=n1 Gres=gpu:1\n", str(tmp_path / "slurm.conf"))
    inv, findings = build_inventory(slurm, gres)
    assert findings == [] and inv.node("n1").device_files == ("/dev/nvidia0",)
