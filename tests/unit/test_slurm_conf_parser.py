"""slurm.conf / gres.conf reading: hostlists, GRES values, comments, continuations, includes.

The expected behaviour is Slurm 22.05's parser (parse_config.c) and man pages;
where this repository's harness scontrol was asked (e.g. two settings on one
line), the comment says what Slurm printed.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from malleable.slurm_conf import (
    GresSpec,
    GresSpecError,
    HostlistError,
    Severity,
    compress_hostlist,
    expand_hostlist,
    parse_conf_file,
    parse_conf_text,
    parse_count,
    parse_gres,
    parse_gres_conf,
    parse_slurm_conf,
)
from malleable.slurm_conf.parser import logical_lines

# --------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize("expr,names", [
    ("node[1-4,7]", ["node1", "node2", "node3", "node4", "node7"]),
    ("node[01-10]", [f"node{i:02d}" for i in range(1, 11)]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    ("gpu[1-2],login1", ["gpu1", "gpu2", "login1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("/dev/nvidia[0,2-3]", ["/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia3"]),
    ("[17001-17003]", ["17001", "17002", "17003"]),
    ("node5", ["node5"]),
    ("  ", []),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr,fault", [
    ("node[1-", "never closed"),
    ("node]1", "without '['"),
    ("node[4-1]", "backwards"),
    ("node[a-c]", "not a number"),
    ("node[[1]]", "nested"),
    ("a,,b", "empty item"),
    ("node[]", "empty range"),
    ("node[1-10000000]", "more than"),
])
def test_expand_hostlist_errors_name_expression_and_fault(expr, fault):
    with pytest.raises(HostlistError) as exc:
        expand_hostlist(expr)
    assert expr in str(exc.value) and fault in str(exc.value)


@pytest.mark.parametrize("names,expr", [
    (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
    (["gpu01", "gpu02", "gpu10"], "gpu[01-02,10]"),
    (["n8", "n9", "n10"], "n[8-10]"),
    (["login", "n2", "n1"], "login,n[1-2]"),
    (["n1"], "n1"),
    (["n1", "n1"], "n1"),
])
def test_compress_hostlist(names, expr):
    assert compress_hostlist(names) == expr


@given(st.lists(st.tuples(st.sampled_from(["n", "gpu", "rack1-n", ""]),
                          st.integers(0, 120), st.sampled_from([0, 2, 3])), max_size=40))
def test_compress_then_expand_gives_the_same_names(parts):
    names = [f"{p}{str(i).zfill(w)}" for p, i, w in parts]
    assert sorted(set(expand_hostlist(compress_hostlist(names)))) == sorted(set(names))


# --------------------------------------------------------------------------- GRES values


@pytest.mark.parametrize("value,specs", [
    ("gpu:4", [GresSpec("gpu", None, 4)]),
    ("gpu:a100:4", [GresSpec("gpu", "a100", 4)]),
    ("gpu:a100:4,gpu:v100:2", [GresSpec("gpu", "a100", 4), GresSpec("gpu", "v100", 2)]),
    ("gpu", [GresSpec("gpu", None, 1)]),
    ("gpu:tesla", [GresSpec("gpu", "tesla", 1)]),
    ("gpu:2(S:0-1)", [GresSpec("gpu", None, 2)]),
    ("bandwidth:lustre:no_consume:4G", [GresSpec("bandwidth", "lustre", 4 * 1024 ** 3, True)]),
    ("mps:100,gpu:1", [GresSpec("mps", None, 100), GresSpec("gpu", None, 1)]),
    ("(null)", []),
])
def test_parse_gres(value, specs):
    assert parse_gres(value) == specs


@pytest.mark.parametrize("value", ["gpu:4x", "gpu:a:b:c:4", ":4", "gpu:4,,mps:1"])
def test_parse_gres_errors_name_the_value(value):
    with pytest.raises(GresSpecError) as exc:
        parse_gres(value)
    assert value in str(exc.value)


def test_parse_count_suffixes():
    assert parse_count("4") == 4
    assert parse_count("10K") == 10 * 1024
    assert parse_count("2m") == 2 * 1024 ** 2
    with pytest.raises(GresSpecError):
        parse_count("-1")


# --------------------------------------------------------------------------- lines


def test_comments_escapes_and_continuations():
    text = (
        "# a comment\n"                          # 1
        "ClusterName=c1   # trailing comment\n"  # 2
        "\n"                                      # 3
        "NodeName=n[1-2] \\\n"                    # 4
        "   CPUs=8 \\   \n"                       # 5: blanks after the backslash
        "   Gres=gpu:2\n"                         # 6
        "Epilog=/x/e\\#1\n"                       # 7: escaped '#'
        "Prolog=a\\\\\n"                          # 8: an even count of '\' does not continue
        "MinJobAge=5\n"                           # 9
    )
    lines = list(logical_lines(text))
    assert lines[0] == (2, "ClusterName=c1   ")
    assert lines[1][0] == 4 and lines[1][1].split() == ["NodeName=n[1-2]", "CPUs=8", "Gres=gpu:2"]
    assert lines[2] == (7, "Epilog=/x/e#1")
    assert lines[3] == (8, "Prolog=a\\")
    assert lines[4] == (9, "MinJobAge=5")


def test_continuation_joins_without_adding_a_blank():
    # Slurm removes the backslash and appends the next line as is.
    assert list(logical_lines("SelectType=select/\\\ncons_tres\n")) == \
        [(1, "SelectType=select/cons_tres")]


def test_a_comment_ending_in_backslash_does_not_continue():
    assert [n for n, _ in logical_lines("A=1 # note \\\nB=2\n")] == [1, 2]


def test_keys_case_insensitive_quotes_and_last_value_wins(tmp_path):
    conf = parse_conf_text(
        'jobrequeue=0\nSchedulerParameters="bf_continue, defer"\nJOBREQUEUE=1\n',
        str(tmp_path / "slurm.conf"))
    assert conf.get("JobRequeue") == "1"
    assert conf.entry("jobRequeue").location.line == 3
    assert conf.get("SchedulerParameters") == "bf_continue, defer"
    dup = [f for f in conf.findings if f.check == "duplicate"]
    assert len(dup) == 1 and dup[0].severity == Severity.WARNING
    assert dup[0].location.line == 3 and ":1" in dup[0].message


def test_record_lines_carry_parameters(tmp_path):
    conf = parse_conf_text(
        "NodeName=node[1-4] NodeHostname=localhost Port=[17001-17004] Gres=gpu:4\n"
        "PartitionName=gpu Nodes=node[1-4] Default=YES State=UP\n",
        str(tmp_path / "slurm.conf"))
    node, part = conf.records
    assert (node.kind, node.name) == ("NodeName", "node[1-4]")
    assert node.get("gres") == "gpu:4" and node.get("PORT") == "[17001-17004]"
    assert (part.kind, part.name, part.get("nodes")) == ("PartitionName", "gpu", "node[1-4]")
    assert not conf.findings


@pytest.mark.parametrize("text,line,words", [
    # scontrol 22.05 on this file: 'Parse error in file ... line 2: " MinJobAge=3"'
    ("ClusterName=c\nJobRequeue=1 MinJobAge=3\n", 2, ["MinJobAge=3", "own"]),
    ("ClusterName=c\n\nfoo\n", 3, ["'foo'", "Key=Value"]),
    ("A=1\\\n B=2 \\\n C\nD=4 E\n", 1, ["B=2"]),
    ("NodeName=n1 CPUs=4 junk\n", 1, ["'junk'"]),
    ("Include a b\n", 1, ["'b'"]),
])
def test_syntax_errors_are_findings_with_their_line(tmp_path, text, line, words):
    (tmp_path / "a").write_text("")
    conf = parse_conf_text(text, str(tmp_path / "slurm.conf"))
    errors = [f for f in conf.findings if f.check == "syntax"]
    assert errors, conf.findings
    f = errors[0]
    assert f.severity == Severity.ERROR and f.location.line == line
    assert f.fix
    for w in words:
        assert w in f.message + f.fix


def test_a_junk_line_is_quoted_cut_short(tmp_path):
    """A binary file's line (5,000 NULs) is quoted in 80 characters with its length,
    not whole (from the new-user helper: thousands of \\x00 in one finding)."""
    conf = parse_conf_text("\x00" * 5000 + "\nfoo\n", str(tmp_path / "slurm.conf"))
    junk, foo = [f for f in conf.findings if f.check == "syntax"]
    assert "(5000 characters)" in junk.message and len(junk.message) < 200
    assert junk.fix == "write it as Key=Value"
    assert "'foo'" in foo.message and foo.fix == "write it as Key=Value (e.g. foo=...)"


def test_line_numbers_after_continued_lines_count_physical_lines(tmp_path):
    conf = parse_conf_text("NodeName=a \\\nCPUs=1 \\\nGres=gpu:1\nBad line\n",
                           str(tmp_path / "slurm.conf"))
    assert [f.location.line for f in conf.findings] == [4]


def test_parsing_goes_on_after_an_error(tmp_path):
    conf = parse_conf_text("oops\nMinJobAge=10\n", str(tmp_path / "slurm.conf"))
    assert conf.get("MinJobAge") == "10" and len(conf.findings) == 1


# --------------------------------------------------------------------------- includes


def test_include_relative_to_the_including_file_with_nesting(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "slurm.conf").write_text("ClusterName=c\nInclude sub/nodes.conf\nMinJobAge=1\n")
    (tmp_path / "sub" / "nodes.conf").write_text("include more.conf\nNodeName=n1 Gres=gpu:1\n")
    (tmp_path / "sub" / "more.conf").write_text("# more\nJobRequeue=0\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    assert not conf.findings
    assert conf.files == [str(tmp_path / "slurm.conf"), str(tmp_path / "sub" / "nodes.conf"),
                          str(tmp_path / "sub" / "more.conf")]
    e = conf.entry("JobRequeue")
    assert e.value == "0" and e.location.path == str(tmp_path / "sub" / "more.conf")
    assert e.location.line == 2
    assert conf.records[0].location.path.endswith("nodes.conf")
    assert conf.records[0].location.line == 2


def test_include_glob_in_sorted_order_and_cluster_name(tmp_path):
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "20-b.conf").write_text("MinJobAge=20\n")
    (d / "10-a.conf").write_text("MinJobAge=10\n")
    (tmp_path / "mycluster.conf").write_text("JobRequeue=0\n")
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=MyCluster\nInclude conf.d/*.conf\nInclude %c.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    assert [os.path.basename(f) for f in conf.files] == \
        ["slurm.conf", "10-a.conf", "20-b.conf", "mycluster.conf"]
    assert conf.get("MinJobAge") == "20"        # last one read wins
    assert conf.get("JobRequeue") == "0"
    assert [f.check for f in conf.findings] == ["duplicate"]


def test_missing_include_is_an_error_at_the_include_line(tmp_path):
    (tmp_path / "slurm.conf").write_text("ClusterName=c\nInclude nodes.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    (f,) = conf.findings
    assert f.severity == Severity.ERROR and f.check == "unreadable"
    assert f.location.path == str(tmp_path / "nodes.conf")
    assert "slurm.conf:2" in f.message and "No such file" in f.message
    assert conf.readable


def test_include_of_a_directory_is_unreadable_even_for_root(tmp_path):
    (tmp_path / "nodes.conf").mkdir()
    (tmp_path / "slurm.conf").write_text("Include nodes.conf\n")
    (f,) = parse_slurm_conf(tmp_path / "slurm.conf").findings
    assert f.check == "unreadable" and "Is a directory" in f.message


def test_glob_matching_nothing_and_include_loops(tmp_path):
    (tmp_path / "slurm.conf").write_text("Include none/*.conf\nInclude b.conf\n")
    (tmp_path / "b.conf").write_text("Include slurm.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    kinds = sorted((f.check, f.severity.value, f.location.line) for f in conf.findings)
    assert kinds == [("include", "error", 1), ("include", "warning", 1)]
    loop = next(f for f in conf.findings if f.severity == Severity.ERROR)
    assert loop.location.path.endswith("b.conf") and "loops" in loop.message


def test_cluster_name_must_precede_a_percent_c_include(tmp_path):
    (tmp_path / "slurm.conf").write_text("Include %c.conf\nClusterName=x\n")
    (f,) = parse_slurm_conf(tmp_path / "slurm.conf").findings
    assert f.check == "include" and f.location.line == 1 and "ClusterName" in f.fix


def test_unreadable_top_level_file_is_a_finding_not_an_exception(tmp_path):
    conf = parse_conf_file(tmp_path)          # a directory
    assert not conf.readable and not conf.files
    (f,) = conf.findings
    assert f.check == "unreadable" and f.location.path == str(tmp_path)


def test_gres_conf_lines(tmp_path):
    (tmp_path / "gres.conf").write_text(
        "AutoDetect=nvml\n"
        "NodeName=tux[0-2] Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-15\n"
        "Name=mps Count=100\n"
        "NodeName=tux3 AutoDetect=off Name=gpu File=/dev/nvidia[0,2-3]\n")
    conf = parse_gres_conf(tmp_path / "gres.conf")
    assert not conf.findings
    assert conf.get("autodetect") == "nvml"
    kinds = [(r.kind, r.name, r.get("name"), r.get("file")) for r in conf.records]
    assert kinds == [("NodeName", "tux[0-2]", "gpu", "/dev/nvidia[0-3]"),
                     ("Name", "mps", None, None),
                     ("NodeName", "tux3", "gpu", "/dev/nvidia[0,2-3]")]


def test_a_fifo_is_refused_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.conf")
    (tmp_path / "slurm.conf").write_text("Include pipe.conf\n")
    (f,) = parse_slurm_conf(tmp_path / "slurm.conf").findings
    assert f.check == "unreadable" and "not a regular file" in f.message


def test_an_indented_include_is_a_syntax_error_but_is_still_read(tmp_path):
    # scontrol 22.05: 'Parse error in file ... line 2: "  Include conf.d/a.conf"'
    (tmp_path / "a.conf").write_text("MinJobAge=10\n")
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n  Include a.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    (f,) = conf.findings
    assert f.check == "syntax" and f.location.line == 2 and "beginning of the line" in f.message
    assert f.fix == "remove the blanks before: Include a.conf"
    assert conf.get("MinJobAge") == "10"


def test_glob_includes_are_recorded(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.conf").write_text("")
    (tmp_path / "slurm.conf").write_text("Include d/*.conf\n")
    conf = parse_slurm_conf(tmp_path / "slurm.conf")
    ((loc, pattern, matches),) = conf.glob_includes
    assert loc.line == 1 and pattern == str(tmp_path / "d" / "*.conf")
    assert matches == (str(tmp_path / "d" / "x.conf"),)
