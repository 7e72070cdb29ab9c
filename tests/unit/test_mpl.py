"""`malleable.mpl.pyplot`: matplotlib imported for files, quiet about its config dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_config_dir_warnings_and_the_logger_level_is_restored(tmp_path):
    # A config dir matplotlib cannot create (as a home a service account cannot write):
    # plain matplotlib warns twice on stderr; pyplot() does not, and draws all the same.
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"MPLCONFIGDIR": str(blocker / "sub"), "PATH": "/usr/bin:/bin"}
    png = str(tmp_path / "x.png")
    code = ("import logging; from malleable.mpl import pyplot; plt = pyplot(); "
            f"fig, ax = plt.subplots(); ax.plot([0, 1]); fig.savefig({png!r}); "
            "print(plt.get_backend().lower(), logging.getLogger('matplotlib').level)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True, cwd=ROOT)
    assert r.stdout.split() == ["agg", "0"]          # Agg; matplotlib's logger as it was
    assert r.stderr == ""
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
    plain = subprocess.run([sys.executable, "-c", "import matplotlib.pyplot"], env=env,
                           capture_output=True, text=True, check=True)
    assert "MPLCONFIGDIR" in plain.stderr            # what pyplot() keeps off stderr
