"""`malleable submit` reads a script's #SBATCH lines as the real sbatch does.

Each script is given to the harness's sbatch (held, then cancelled by the fixture)
and to `script_directives`: a script sbatch refuses for its directives must be
refused by submit too (exit 2, naming the line, before sbatch), and one sbatch
takes must be read, not refused. The unit tests (tests/unit/test_spec_submit.py)
check the messages and the words read.
"""

from __future__ import annotations

import pytest

from malleable.submit import SubmitError, script_directives

pytestmark = pytest.mark.slurm

CASES = [
    # sbatch refuses these ("Invalid directive found in batch script", "Unmatched `"`")
    ("#SBATCH --comment=malleable:gpus=1-4 step=2", False),
    ("#SBATCH --comment malleable:gpus=1-4 nightly", False),
    ("#SBATCH --comment=malleable:gpus=1-4\\ step=2", False),
    ("#SBATCH -p gpu stray", False),
    ("#SBATCH -pgpu stray", False),
    ("#SBATCH --requeue stray", False),
    ("#SBATCH -H -k stray", False),
    ("#SBATCH --time=10 stray", False),
    ("#SBATCH --comment=x\n#SBATCH stray", False),
    ("#SBATCH --comment=x -- -J y", False),
    ("#SBATCHfoo", False),
    ('#SBATCH -J "abc', False),
    # sbatch takes these
    ('#SBATCH --comment="malleable:gpus=1-4,step=2 nightly"', True),
    ("#SBATCH --comment=malleable:gpus=1-4 # step=2", True),
    ('#SBATCH --comment=malleable:gpus=1-4 "" step=2', True),
    ("#SBATCH -J\n#SBATCH foo", True),
    ("#SBATCH --partition gpu -k", True),
    ("#SBATCH -J a\\#b", True),
    ("#SBATCH -J x#y stray", True),
    ("#SBATCH -J a --", True),
    ("#SBATCH -J a\n#SBATCH hetjob\n#SBATCH -J b", True),
]


@pytest.mark.parametrize("lines, accepted", CASES)
def test_submit_refuses_the_directives_sbatch_refuses(slurm, tmp_path, lines, accepted):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n{lines}\ntrue\n")
    proc = slurm.run("sbatch", "--parsable", "-H", str(script), check=False)
    assert (proc.returncode == 0) is accepted, proc.stderr
    try:
        script_directives(str(script))
    except SubmitError as exc:
        assert not accepted, exc
    else:
        assert accepted, "sbatch refused it: " + proc.stderr
