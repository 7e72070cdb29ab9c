"""`malleable submit` without a cluster: spec merging, #SBATCH parsing, sizes, bad input.

Submitting to the real harness is tested in tests/integration/test_job_contract.py.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from malleable.cli import main
from malleable.spec import parse_spec
from malleable.submit import (
    SubmitError,
    build_spec,
    comment_in,
    initial_shape,
    script_directives,
    without_comment,
)


def test_script_directives_stop_at_the_first_command(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n"
                      "#SBATCH --comment=\"owner=ann malleable:gpus=2-8,batch=64\"  # note\n"
                      "#SBATCH -p gpu --time=10\n"
                      "\n# plain comment\n"
                      "echo hi\n"
                      "#SBATCH --comment=ignored\n")
    words = script_directives(str(script))
    assert words == ["--comment=owner=ann malleable:gpus=2-8,batch=64", "-p", "gpu",
                     "--time=10"]
    assert comment_in(words) == "owner=ann malleable:gpus=2-8,batch=64"
    assert comment_in(["--comment", "a", "--comment=b"]) == "b"
    assert without_comment(["-p", "x", "--comment", "a", "--comment=b", "-t", "1"]) == \
        ["-p", "x", "-t", "1"]


def test_options_override_spec_which_overrides_the_script():
    spec = build_spec(["x malleable:gpus=2-8,batch=64,step=2", "y malleable:signal=USR2"],
                      "gpus=2-16,grace=30", {"step": "4", "batch": None, "model": "cifar10"})
    assert spec == parse_spec("malleable:gpus=2-16,batch=64,step=4,grace=30,model=cifar10,"
                              "signal=USR2")


def test_a_comment_without_a_spec_is_kept_as_other_text():
    spec = build_spec(["owner=ann"], None, {"gpus": "2-4"})
    assert spec == parse_spec("malleable:gpus=2-4")
    assert build_spec([None], "malleable:gpus=1-2", {}) == parse_spec("malleable:gpus=1-2")


def test_the_default_initial_size_holds_the_initial_batch():
    """Without --initial-gpus a job started on its minimum even when that could not hold
    its batch at its per-GPU limit (gpus=1-8, batch=8, max_local_batch=1 asked for 1 GPU);
    it starts on the smallest size that holds it, and an explicit smaller size is refused."""
    assert initial_shape(parse_spec("malleable:gpus=1-8,batch=8,max_local_batch=1"),
                         None, 4) == (2, 4)
    assert initial_shape(parse_spec("malleable:gpus=1-8,batch=4,max_local_batch=1"),
                         None, 4) == (1, 4)
    assert initial_shape(parse_spec("malleable:gpus=1-12,step=3,batch=7,max_local_batch=1,max_batch=64"),
                         None, 4) == (3, 4)
    assert initial_shape(parse_spec("malleable:gpus=2-8,batch=8,max_local_batch=4"),
                         None, 4) == (1, 2)
    # (9 holds the batch but is not whole nodes, and 12 is above the maximum)
    with pytest.raises(SubmitError, match=r"^no size can start the job on 4-GPU nodes: none "
                                          r"holds batch=7 at max_local_batch=1 per GPU \(sizes "
                                          r"it can start on, on 4-GPU nodes: 1, 3\)$"):
        initial_shape(parse_spec("malleable:gpus=1-9,step=3,batch=7,max_local_batch=1,max_batch=64"),
                      None, 4)
    with pytest.raises(SubmitError, match=r"^--initial-gpus=2: 2 GPUs cannot hold batch=8 at "
                                          r"max_local_batch=1 per GPU; 8 is the smallest size "
                                          r"it can start on that holds it$"):
        initial_shape(parse_spec("malleable:gpus=1-8,batch=8,max_local_batch=1"), 2, 4)


def test_initial_shape_whole_nodes_above_one_node():
    spec = parse_spec("malleable:gpus=2-16,step=4")
    assert initial_shape(spec, None, 4) == (1, 2)
    assert initial_shape(spec, 4, 4) == (1, 4)
    assert initial_shape(spec, 12, 4) == (3, 4)
    with pytest.raises(SubmitError, match="not allowed"):
        initial_shape(spec, 3, 4)
    with pytest.raises(SubmitError, match="whole"):
        initial_shape(parse_spec("malleable:gpus=1-16"), 6, 4)
    # Without --initial-gpus the job starts on the smallest size it can start on (the
    # minimum, 6, is not whole nodes: it was refused, blaming "the initial size").
    assert initial_shape(parse_spec("malleable:gpus=6-8"), None, 4) == (2, 4)
    with pytest.raises(SubmitError, match=r"^no size can start the job on 4-GPU nodes: it "
                                          r"allows gpus=5-7 with step=1, and none of these"):
        initial_shape(parse_spec("malleable:gpus=5-7"), None, 4)
    # The sizes listed are those the job can start on (whole nodes above one).
    with pytest.raises(SubmitError, match=r"^--initial-gpus=32: not allowed by the spec \(sizes "
                                          r"it can start on, on 4-GPU nodes: 2, 3, 4, 8, 12, "
                                          r"16\)$"):
        initial_shape(parse_spec("malleable:gpus=2-16"), 32, 4)
    with pytest.raises(SubmitError, match=r"^--initial-gpus=6: more than one node \(4 GPUs\) "
                                          r"but not whole nodes \(sizes it can start on, on "
                                          r"4-GPU nodes: 1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, "
                                          r"36, \.\.\.\)$"):
        initial_shape(parse_spec("malleable:gpus=1-2000000000"), 6, 4)
    # A size no request can have is named as the option the user gave.
    with pytest.raises(SubmitError, match=r"^--initial-gpus=100000000: 25000000 nodes of 4 "
                                          r"GPUs; invalid nodes 25000000"):
        initial_shape(parse_spec("malleable:gpus=1-100000000"), 100000000, 4)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "16-2"], "malleable spec: gpus=16-2: minimum exceeds maximum"),
    (["--gpus", "2-4", "--signal", "KILL"], "signal=KILL"),
    (["--spec", "gpus=2-4,colour=red"], "colour=red: unknown key"),
    (["--gpus", "2-4", "--grace", "soon"], "grace=soon"),
    ([], "gpus: missing"),
    (["--gpus", "2-4", "--gres=gpu:2"], "--gres=gpu:2: malleable submit sets the GPU request"),
    (["--gpus", "2-4", "-N", "2"], "-N: malleable submit sets the GPU request"),
    (["--gpus", "2-4", "--wrap"], "--wrap: malleable submit needs a batch script file"),
    (["--gpus", "2-4", "--no-requeue"], "--no-requeue: a malleable job must be requeueable"),
    (["--gpus", "2-4", "--open-mode=truncate"], "--open-mode=truncate: each requeue would"),
    (["--gpus", "2-4", "--open-mode", "truncate"], "--open-mode=truncate: each requeue"),
    (["--gpus", "2-4", "--export=NONE"], "--export=NONE: MALLEABLE_SPOOL, MALLEABLE_SIGNAL"),
    (["--gpus", "2-4", "--export", "PATH,HOME"], "--export=PATH,HOME: MALLEABLE_SPOOL"),
    (["--gpus", "2-4", "--tres-per-task=gres/gpu:1"],
     "--tres-per-task=gres/gpu:1: malleable submit sets the GPU request"),
    (["--spec", "nonsense"], "--spec 'nonsense': expected key=value fields separated by commas"),
    (["--spec", "gpus=2-4 step=2"], "(cannot read 'step=2')"),
    (["--gpus", "2-8", "--model", "a,b"], "model='a,b': a value cannot be empty or hold ','"),
    (["--gpus", "2-8", "--model", "a b"], "model='a b': a value cannot be empty"),
    (["--gpus", "2-8", "--model", ""], "model='': a value cannot be empty"),
    (["--comment=malleable:gpus=2-8,gpus=4"],
     "gpus=4: key given twice (in the command line's --comment)"),
    (["--spec", "gpus=2-8,step=2,step=4"], "step=4: key given twice (in --spec)"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    result = CliRunner().invoke(main, ["submit", *args, str(script)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("malleable submit: error: ")
    assert message in lines[0]


def test_missing_script_exits_2(tmp_path):
    result = CliRunner().invoke(main, ["submit", "--gpus", "2-4", str(tmp_path / "nope.sh")])
    assert result.exit_code == 2
    assert "No such file" in result.output



def test_script_arguments_are_refused_naming_the_script(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                  "2-4", str(script), "extra"])
    assert r.exit_code == 2
    assert f"extra: no such file; the batch script ({script}?) must be the last argument: " \
           "script arguments are not supported" in r.output


def test_capacity_check_warns_above_the_cluster_and_refuses_a_minimum_above_it():
    from malleable.slurm.records import ClusterInfo
    from malleable.submit import check_capacity

    cluster = ClusterInfo(version="22.05.8", version_tuple=(22, 5, 8), gpus_per_node=4, nodes=4)
    assert check_capacity(parse_spec("malleable:gpus=2-16"), cluster) is None
    warning = check_capacity(parse_spec("malleable:gpus=1-1000"), cluster)
    assert warning == ("gpus=1-1000: the cluster has 16 GPUs (4 nodes x 4); the job will run "
                       "on at most 16")
    # At most the largest size it can start on (15 is not whole nodes; a tester).
    assert check_capacity(parse_spec("malleable:gpus=3-30,step=3"), cluster).endswith(
        "the job will run on at most 12")
    with pytest.raises(SubmitError, match=r"gpus=32-64: the minimum exceeds the cluster's 16 "
                                          r"GPUs \(4 nodes x 4\); the job could never start"):
        check_capacity(parse_spec("malleable:gpus=32-64"), cluster)
    # A batch only more GPUs than the cluster has can hold (it was submitted on 16 nodes
    # and pended for ever, PartitionNodeLimit; a tester).
    with pytest.raises(SubmitError, match=r"^batch=64 at max_local_batch=1 per GPU needs at "
                                          r"least 64 GPUs, more than the cluster's 16 GPUs"):
        check_capacity(parse_spec("malleable:gpus=1-64,batch=64,max_local_batch=1"), cluster)
    assert check_capacity(parse_spec("malleable:gpus=1-64,batch=64,max_local_batch=4"),
                          cluster).startswith("gpus=1-64: the cluster has 16 GPUs")
    unknown = ClusterInfo(version="22.05.8", version_tuple=(22, 5, 8), gpus_per_node=4)
    assert check_capacity(parse_spec("malleable:gpus=1-1000"), unknown) is None


def test_submit_connects_with_the_configured_slurm_section(tmp_path):
    # backend = "pyslurm" where pyslurm does not import: the configured backend is used
    # (it used to connect with the defaults, "auto", which falls back to the CLI).
    try:
        import pyslurm  # noqa: F401
        pytest.skip("pyslurm imports here; the configured-backend failure cannot be shown")
    except ImportError:
        pass
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'[slurm]\nbackend = "pyslurm"\n[progress]\nspool_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(main, ["submit", "--config", str(cfg), "--dry-run",
                                       "--gpus", "1-4", str(script)])
    assert result.exit_code == 1, result.output
    assert "backend pyslurm configured but unusable" in result.output


def test_dry_run_with_gpus_per_node_needs_no_controller(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --comment=malleable:gpus=2-8,step=2\necho hi\n")
    cfg = tmp_path / "m.toml"   # a controller that does not exist: never contacted
    cfg.write_text(f'[slurm]\nbackend = "pyslurm"\n[progress]\nspool_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(main, ["submit", "--config", str(cfg), "--dry-run",
                                       "--gpus-per-node", "4", "--initial-gpus", "8",
                                       str(script)])
    assert result.exit_code == 0, result.output
    assert "sbatch" in result.output and "--nodes=2" in result.output
    assert "gpu:4" in result.output and "malleable:gpus=2-8,step=2" in result.output
    bad = CliRunner().invoke(main, ["submit", "--config", str(cfg), "--dry-run",
                                    "--gpus-per-node", "4", "--gpus", "16-2", str(script)])
    assert bad.exit_code == 2 and "minimum exceeds maximum" in bad.output
    real = CliRunner().invoke(main, ["submit", "--gpus-per-node", "4", str(script)])
    assert real.exit_code == 2 and "--gpus-per-node: only with --dry-run" in real.output


def test_dry_run_sizes_the_port_refuses_exit_2_without_a_traceback(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                  "1-9223372036854775807", "--initial-gpus", "100000000",
                                  str(script)])
    assert r.exit_code == 2 and "invalid nodes 25000000" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "2000", "--gpus",
                                  "1-8", str(script)])
    assert r.exit_code == 2 and "1<=x<=1024" in r.output


def test_a_key_twice_in_the_script_names_the_script(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --comment=malleable:gpus=2-8,gpus=4\necho hi\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2
    assert "gpus=4: key given twice (in the script's --comment)" in r.output


def test_an_option_given_twice_is_warned_and_the_last_applies(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                  "2-4", "--signal", "USR2", "--gpus=2-8", "--time", "10",
                                  "--signal", "TERM", str(script)])
    assert r.exit_code == 0, r.output
    assert "malleable submit: warning: --gpus given 2 times: the last one applies" in r.stderr
    assert "malleable submit: warning: --signal given 2 times: the last one applies" in r.stderr
    assert "gpus=2-8" in r.stdout and "signal=TERM" in r.stdout
    once = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                     "2-4", str(script)])
    assert once.exit_code == 0 and "warning" not in once.stderr
    # After the script (click reads it there too), and not an option's value.
    last = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                     "2-4", str(script), "--gpus=2-8"])
    assert last.exit_code == 0 and "gpus=2-8" in last.stdout
    assert "--gpus given 2 times" in last.stderr
    value = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                      "2-4", "--model", "--gpus", str(script)])
    assert "warning" not in value.stderr, value.stderr


@pytest.mark.parametrize("word, message", [
    ("--gpus-per-nod=4", "--gpus-per-node=4: malleable submit sets the GPU request"),
    ("--gpus-per-t=2", "--gpus-per-task=2: malleable submit sets the GPU request"),
    ("--nod=2", "--nodes=2: malleable submit sets the GPU request"),
    ("--gpus-per=2", "--gpus-per: an abbreviation of sbatch's --gpus-per-node, "
                     "--gpus-per-task, --gpus-per-socket: spell the option out"),
    ("--no-req", "--no-requeue: a malleable job must be requeueable"),
    ("--open-mo=truncate", "--open-mode=truncate: each requeue would truncate"),
    ("--tres-per-n=gres/gpu:2", "--tres-per-node=gres/gpu:2: malleable submit sets the GPU"),
    ("--wra=hostname", "--wrap: malleable submit needs a batch script file"),
])
def test_abbreviated_sbatch_options_are_read_as_sbatch_reads_them(tmp_path, word, message):
    """sbatch takes an unambiguous prefix of a long option: --gpus-per-nod=4 passed the
    refusal and was submitted with a second GPU request."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "2-4",
                                  word, str(script)])
    assert r.exit_code == 2 and message in r.stderr, r.output
    ok = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus",
                                   "2-4", "--nodel=node1", "--co=x", str(script)])
    assert ok.exit_code == 0 and "--nodel=node1 --co=x" in ok.stdout   # sbatch's to judge


def test_options_that_keep_the_contract_pass(tmp_path):
    """--open-mode=append, --export=ALL,... and a CPU-only --tres-per-task go to sbatch."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    result = CliRunner().invoke(main, [
        "submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "2-8", "--open-mode=append",
        "--export", "ALL,FOO=1", "--tres-per-task=cpu:2", "--requeue", str(script)])
    assert result.exit_code == 0, result.output
    assert "--export ALL,FOO=1" in result.output and "--tres-per-task=cpu:2" in result.output


def test_target_epochs_without_samples_per_epoch_is_warned(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    args = ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "2-8", "--target-epochs", "3"]
    result = CliRunner().invoke(main, [*args, str(script)])
    assert result.exit_code == 0
    assert "warning: target_epochs=3 without samples_per_epoch" in result.stderr
    result = CliRunner().invoke(main, [*args, "--samples-per-epoch", "50000", str(script)])
    assert result.exit_code == 0 and "warning" not in result.stderr


@pytest.mark.parametrize("directive, message", [
    ("--export=NONE", "#SBATCH --export=NONE: MALLEABLE_SPOOL, MALLEABLE_SIGNAL"),
    ("--export PATH", "#SBATCH --export=PATH: MALLEABLE_SPOOL"),
    ("--gpus-per-node=4", "#SBATCH --gpus-per-node=4: malleable submit sets the GPU request"),
    ("--gpus-per-nod=4", "#SBATCH --gpus-per-node=4: malleable submit sets the GPU request"),
    ("--gpus=3", "#SBATCH --gpus=3: malleable submit sets the GPU request"),
    ("-G 2", "#SBATCH -G: malleable submit sets the GPU request"),
    ("--tres-per-task=gres/gpu:1", "#SBATCH --tres-per-task=gres/gpu:1: malleable submit"),
    ("-vG2", "#SBATCH -vG2: malleable submit sets the GPU request"),   # a getopt bundle
])
def test_a_scripts_directive_that_undoes_the_contract_is_refused(tmp_path, directive, message):
    """sbatch lets the command line override the script, but not across options: a
    script's --export=NONE kept MALLEABLE_SPOOL from the job, and its --gpus-per-node
    was added to the spec's --gres (a helper on the harness)."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --comment=malleable:gpus=1-2\n#SBATCH {directive}\n"
                      "true\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"malleable submit: error: {script}: " + \
        r.output.strip().split(f"{script}: ", 1)[1]
    assert message in r.output


def test_a_scripts_own_gres_nodes_requeue_and_open_mode_are_replaced_not_refused(tmp_path):
    """The command line's --nodes, --gres, --requeue and --open-mode=append win over the
    script's (the examples carry them for plain sbatch)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --comment=malleable:gpus=1-2\n#SBATCH --nodes=1\n"
                      "#SBATCH --gres=gpu:2\n#SBATCH --no-requeue\n"
                      "#SBATCH --open-mode=truncate\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 0, r.output
    assert "--requeue" in r.output and "--open-mode=append" in r.output


def test_sbatchs_signal_form_on_the_command_line_points_to_the_script(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "1-2",
                                  "--signal=B:USR1@120", str(script)])
    assert r.exit_code == 2
    assert "--signal=B:USR1@120: here the spec's checkpoint signal (e.g. USR1); sbatch's " \
        "--signal=[B:]SIG@TIME goes in an #SBATCH line of the script" in r.output


def test_a_spec_split_by_blanks_in_the_script_is_refused(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/bash\n#SBATCH --comment="malleable:gpus=1-8 step=4 batch=32"\n'
                      "true\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2
    assert "step=4: after a blank, outside the spec" in r.output
    assert "(in the script's --comment)" in r.output


def test_a_script_without_its_interpreter_line_is_refused_before_sbatch(tmp_path):
    """sbatch refuses a script whose first line is not #!...: --dry-run passed it and the
    real submit exited 1 with sbatch's text (a helper)."""
    script = tmp_path / "job.sh"
    script.write_text("#SBATCH --comment=malleable:gpus=1-2\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2
    assert f"script {script}: its first line must be #! and an interpreter (e.g. " \
        "#!/bin/bash), as sbatch requires" in r.output


@pytest.mark.parametrize("spec, top", [("gpus=1-8,step=3", 3), ("gpus=1-7", 4)])
def test_a_maximum_no_node_shape_reaches_is_warned_about(tmp_path, spec, top):
    """gpus=1-8,step=3 allows 1, 3 and 6; on 4-GPU nodes 6 is not whole nodes, so the
    job can never get more than 3, yet nothing said so (a helper)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--spec", spec,
                                  str(script)])
    assert r.exit_code == 0, r.output
    lo_hi = spec.split(",")[0]
    assert f"malleable submit: warning: {lo_hi} with step=" in r.output
    assert f"the largest size it allows on 4-GPU nodes is {top} (above one node, only " \
        "whole nodes)" in r.output


def test_largest_size_and_start_sizes_match_the_listed_sizes():
    from malleable.submit import largest_size, start_sizes
    for text in ("gpus=1-8,step=3", "gpus=2-16,step=4", "gpus=1-8", "gpus=1-7", "gpus=6-6",
                 "gpus=3-100,step=3", "gpus=5-40,step=5", "gpus=8-8", "gpus=6-8", "gpus=5-7"):
        spec = parse_spec("malleable:" + text)
        for g in (1, 2, 3, 4, 8):
            sizes = [k for k in spec.allowed_gpus() if k <= g or k % g == 0]   # (no batch)
            assert largest_size(spec, g) == max(sizes, default=0), (text, g)
            assert start_sizes(spec, g, count=1000) == sizes, (text, g)
            for least, most in ((0, 12), (5, 0), (7, 40), (9, 8)):
                want = [k for k in sizes if k >= least and (most == 0 or k <= most)]
                assert start_sizes(spec, g, least=least, most=most, count=3) == want[:3]
                assert largest_size(spec, g, most=most) == max(
                    [k for k in sizes if most == 0 or k <= most], default=0)


def test_no_start_size_has_more_gpus_than_the_batch_has_samples():
    """gpus=5-16,batch=6 started on 8 GPUs, and --initial-gpus 16 with batch=3 was taken
    (a tester): every GPU needs a sample of each step."""
    from malleable.submit import largest_size, start_sizes
    assert initial_shape(parse_spec("malleable:gpus=4-16,batch=6"), None, 4) == (1, 4)
    with pytest.raises(SubmitError, match=r"^no size can start the job on 4-GPU nodes"):
        initial_shape(parse_spec("malleable:gpus=5-16,batch=6"), None, 4)
    with pytest.raises(SubmitError, match=r"^--initial-gpus=16: more GPUs than its largest "
                                          r"global batch \(3 samples\) can give a sample each "
                                          r"\(sizes it can start on, on 4-GPU nodes: 1, 2, 3\)$"):
        initial_shape(parse_spec("malleable:gpus=1-16,batch=3"), 16, 4)
    spec = parse_spec("malleable:gpus=1-64,batch=8,max_batch=24")
    assert start_sizes(spec, 4, count=100) == [1, 2, 3, 4, 8, 12, 16, 20, 24]
    assert largest_size(spec, 4) == 24


def test_the_initial_size_is_checked_against_the_cluster():
    """An initial size above the cluster was submitted and pended for ever (a tester)."""
    spec = parse_spec("malleable:gpus=1-64")
    assert initial_shape(spec, 16, 4, cluster_gpus=16) == (4, 4)
    with pytest.raises(SubmitError, match=r"^--initial-gpus=32: more than the cluster's 16 GPUs; "
                                          r"the job could never start \(sizes it can start on, "
                                          r"on 4-GPU nodes, 16 GPUs in all: 1, 2, 3, 4, 8, 12, "
                                          r"16\)$"):
        initial_shape(spec, 32, 4, cluster_gpus=16)
    # A size below what holds the batch names the first size that does.
    with pytest.raises(SubmitError, match=r"^--initial-gpus=2: 2 GPUs cannot hold batch=5 at "
                                          r"max_local_batch=1 per GPU; 8 is the smallest size "
                                          r"it can start on that holds it$"):
        initial_shape(parse_spec("malleable:gpus=1-64,batch=5,max_local_batch=1,max_batch=64"), 2, 4,
                      16)



def test_sbatch_reads_a_directive_without_a_blank_and_not_an_indented_one(tmp_path):
    """sbatch reads "#SBATCH--gpus=2" (a helper: it then carried two GPU requests), but
    not "  #SBATCH --gpus=2", and an unquoted # ends the line even inside a word."""
    script = tmp_path / "job.sh"

    def submit(body: str):
        script.write_text("#!/bin/bash\n#SBATCH --comment=malleable:gpus=1-2\n" + body + "true\n")
        return CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4",
                                         str(script)])
    r = submit("#SBATCH--gpus=2\n")
    assert r.exit_code == 2 and "#SBATCH --gpus=2: malleable submit sets the GPU" in r.output
    assert submit("  #SBATCH --gpus=2\n").exit_code == 0
    r = submit("#SBATCH --job-name=x#y --gpus=2\n")
    assert r.exit_code == 0, r.output
    assert script_directives(str(script))[-1] == "--job-name=x"


def test_a_script_with_dos_line_breaks_is_refused_before_sbatch(tmp_path):
    script = tmp_path / "job.sh"
    script.write_bytes(b"#!/bin/bash\r\n#SBATCH --comment=malleable:gpus=1-2\r\ntrue\r\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2 and "DOS line breaks" in r.output


@pytest.mark.parametrize("args", [["-vG2"], ["-HN2"], ["-HG", "2"]])
def test_bundled_short_options_cannot_request_the_size(tmp_path, args):
    """getopt reads -vG2 as -v -G 2: it passed the refusal and the job carried two GPU
    requests; -HN2 ran the job on 2 nodes (a helper on the harness)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "1-4",
                                  *args, str(script)])
    assert r.exit_code == 2
    assert f"{args[0]}: malleable submit sets the GPU request from the spec" in r.output


@pytest.mark.parametrize("word", ["--sig=B:USR1@120", "--signa=USR2"])
def test_an_abbreviated_signal_is_not_passed_to_sbatch(tmp_path, word):
    """click leaves --sig to sbatch, which reads it as its own --signal, while the spec's
    signal stayed USR1 (a helper)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", "--gpus", "1-4",
                                  word, str(script)])
    assert r.exit_code == 2
    assert f"{word}: sbatch would read it as its --signal; here --signal is the spec's " \
        "checkpoint signal" in r.output


def _script(tmp_path, *lines: str):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + "".join(line + "\n" for line in lines) + "true\n")
    return script


@pytest.mark.parametrize("line, words, fix", [
    ("#SBATCH --comment=malleable:gpus=1-4 step=2", "'step=2'",
     "separate the spec's fields by commas: --comment=malleable:gpus=1-4,step=2"),
    ("#SBATCH --comment malleable:gpus=1-4 step=2 batch=64 -J x", "'step=2 batch=64'",
     "separate the spec's fields by commas: --comment=malleable:gpus=1-4,step=2,batch=64"),
    ("#SBATCH --comment=malleable:gpus=1-4 nightly", "'nightly'",
     "quote the comment: --comment=\"malleable:gpus=1-4 nightly\""),
    ("#SBATCH --comment=malleable:gpus=1-4 step=2 nightly", "'step=2 nightly'",
     "quote the comment: --comment=\"malleable:gpus=1-4 step=2 nightly\" (and separate "
     "the spec's fields by commas)"),
])
def test_an_unquoted_comment_with_a_blank_is_refused_naming_the_line_and_words(
        tmp_path, line, words, fix):
    """sbatch splits `#SBATCH --comment=malleable:gpus=1-4 step=2` at the blank and refuses
    the script over step=2 ("Invalid directive found in batch script"); --dry-run printed
    a command with the comment malleable:gpus=1-4, step=2 gone without a word (a new-user
    tester)."""
    script = _script(tmp_path, "#SBATCH -p gpu", line)
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output
    assert r.output.startswith(f"malleable submit: error: script {script}: line 3: {line}: "
                               f"sbatch splits #SBATCH lines at blanks: the comment would be "
                               f"'malleable:gpus=1-4', and sbatch refuses the script over "
                               f"{words}, which is not an option")
    assert r.output.rstrip("\n").endswith(fix)


@pytest.mark.parametrize("lines, line, word", [
    (["#SBATCH -p gpu stray"], 2, "'stray'"),
    (["#SBATCH -pgpu stray"], 2, "'stray'"),
    (["#SBATCH --requeue stray"], 2, "'stray'"),
    (["#SBATCH -H -k stray"], 2, "'stray'"),
    (["#SBATCH --time=10 stray more -J x"], 2, "'stray more'"),
    (["#SBATCH --comment=x", "#SBATCH stray"], 3, "'stray'"),
    (["#SBATCH -J a", "#SBATCH -- -J b"], 3, "'-J'"),
    (["#SBATCHfoo"], 2, "'foo'"),
])
def test_a_word_sbatch_would_refuse_is_refused_naming_the_line(tmp_path, lines, line, word):
    """sbatch reads the #SBATCH lines as one command line and refuses a word that is
    neither an option nor an option's value (each checked against sbatch 22.05)."""
    script = _script(tmp_path, *lines)
    with pytest.raises(SubmitError) as info:
        script_directives(str(script))
    assert str(info.value).startswith(f"script {script}: line {line}: {lines[-1]}: {word}: ")
    assert "sbatch refuses the script (Invalid directive found in batch script)" in \
        str(info.value)


@pytest.mark.parametrize("lines, words", [
    (["#SBATCH -J", "#SBATCH foo"], ["-J", "foo"]),          # a value on the next line
    (["#SBATCH --partition gpu -k"], ["--partition", "gpu", "-k"]),
    (['#SBATCH --comment=a "" stray'], ["--comment=a"]),     # an empty word ends the line
    (["#SBATCH -J a\\#b --comment=c"], ["-J", "a#b", "--comment=c"]),
    (['#SBATCH -J "a\\"b" -J a"b c"d'], ["-J", 'a"b', "-J", "ab cd"]),
    (["#SBATCH -J x#y stray"], ["-J", "x"]),
    (["#SBATCH --comment=malleable:gpus=1-4 # step=2"], ["--comment=malleable:gpus=1-4"]),
    (["#SBATCH -J a", "#SBATCH hetjob", "#SBATCH -J b"], ["-J", "a", "hetjob", "-J", "b"]),
    (["#SBATCH -J a --"], ["-J", "a", "--"]),
])
def test_directives_sbatch_accepts_are_read_as_it_reads_them(tmp_path, lines, words):
    assert script_directives(str(_script(tmp_path, *lines))) == words


def test_an_unmatched_quote_in_a_directive_is_refused(tmp_path):
    script = _script(tmp_path, '#SBATCH --comment="malleable:gpus=1-4')
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--gpus-per-node", "4", str(script)])
    assert r.exit_code == 2
    assert f"script {script}: line 2: #SBATCH --comment=\"malleable:gpus=1-4: unmatched \" " \
        "quote, which sbatch refuses" in r.output


def test_dry_run_and_errors_show_a_scripts_control_characters_as_escapes(tmp_path):
    """An admin dry-running a user's script: the comment's escape sequence and bidi
    override reached the terminal raw, in the printed sbatch command and in errors (a
    new-user tester; click strips ANSI only when writing to a pipe, which hid it)."""
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'[progress]\nspool_dir = "{tmp_path}"\n')
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/bash\n#SBATCH --comment="night\x1b[2J\u202e malleable:gpus=1-4"\n'
                      "echo hi\n")
    run = CliRunner().invoke(main, ["submit", "--config", str(cfg), "--dry-run",
                                    "--gpus-per-node", "4", str(script)], color=True)
    assert run.exit_code == 0, run.output
    assert "night\\x1b[2J\\u202e" in run.output
    assert "\x1b" not in run.output and "\u202e" not in run.output
    script.write_text("#!/bin/bash\n#SBATCH --comment=a\x1b[2J b\necho hi\n")
    bad = CliRunner().invoke(main, ["submit", "--config", str(cfg), "--dry-run",
                                    "--gpus-per-node", "4", str(script)], color=True)
    assert bad.exit_code == 2, bad.output
    assert "\\x1b[2J" in bad.output and "\x1b" not in bad.output
