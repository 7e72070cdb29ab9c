"""The `malleable` console script: --version and --help answer."""

from __future__ import annotations

import shutil
import subprocess
import sys

from click.testing import CliRunner

from malleable import __version__
from malleable.cli import main


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"malleable, version {__version__}"


def test_help_lists_purpose():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "malleable ML training jobs on Slurm" in result.output


def test_console_script_installed():
    exe = shutil.which("malleable") or str(__import__("pathlib").Path(sys.executable).parent / "malleable")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_unknown_command_is_usage_error():
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "no-such-command" in result.output


def test_usage_errors_are_one_line_naming_the_command_and_its_help():
    """Click printed usage, a hint and the error on three or four lines; every other
    malleable error is one line, and so is a usage error now (exit 2)."""
    exe = str(__import__("pathlib").Path(sys.executable).parent / "malleable")
    for argv, words in ((["job", "show", "-1"], ["malleable job show: error:", "'-1'",
                                                 "(see malleable job show --help)"]),
                        (["actions", "--limit", "abc"], ["malleable actions: error:", "'abc'"]),
                        (["no-such-command"], ["malleable: error:", "no-such-command"])):
        proc = subprocess.run([exe, *argv], capture_output=True, text=True)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        for w in words:
            assert w in lines[0], (w, lines[0])
    # A group without its command still shows the group's help (exit 2, as click does).
    proc = subprocess.run([exe, "db"], capture_output=True, text=True)
    assert proc.returncode == 2 and "upgrade" in proc.stdout + proc.stderr
