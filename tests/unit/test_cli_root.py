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
