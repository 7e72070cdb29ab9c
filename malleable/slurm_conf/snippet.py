"""The slurm.conf (and gres.conf) lines malleable needs, with a comment saying why.

`snippet` is pure: the only input is malleable's configuration (MinJobAge
follows the daemon's poll interval). Every setting line printed passes the
checks of `malleable.slurm_conf.checks`; lines that depend on the site's
hardware (node names, GPU counts, device files) are printed commented out.
"""

from __future__ import annotations

import math

from malleable.config import Config
from malleable.slurm_conf.checks import RECOMMENDED_MIN_JOB_AGE_S


def snippet(config: Config) -> str:
    """The lines to add to slurm.conf (and gres.conf) for malleable, as text.

    Args:
        config: malleable's settings; ``daemon.poll_interval_s`` (seconds)
            sets the MinJobAge suggested (at least two poll intervals and
            never below Slurm's default of 300 s).

    Returns:
        Text ending in a newline: ``#`` comments and ``Key=Value`` lines.
    """
    poll = config.daemon.poll_interval_s
    min_age = max(RECOMMENDED_MIN_JOB_AGE_S, math.ceil(2 * poll))
    return f"""\
# ---- slurm.conf: settings malleable needs (check with: malleable conf check) ----
#
# GPUs are consumable TRES, allocated per GPU; a job can hold k GPUs of a node.
# (select/linear allocates whole nodes; cons_res lacks the GPU job options.)
SelectType=select/cons_tres
# Its default SelectTypeParameters=CR_Core_Memory gives a job without --mem the
# whole memory of its nodes; a default per GPU lets GPU jobs share a node:
#DefMemPerGPU=64000
# Slurm manages GPUs as generic resources (add other types after a comma).
GresTypes=gpu
# Batch jobs may be requeued: malleable grows and shrinks a running job by
# checkpoint-requeue. (1 is the default; `malleable submit` also adds --requeue.)
JobRequeue=1
# Finished jobs stay visible to the daemon for at least two poll intervals
# (daemon.poll_interval_s = {poll:g} s), so it sees every job's final state.
MinJobAge={min_age}
# Allow in-place shrink (scontrol update JobId=J NumNodes=n): do NOT put
# disable_job_shrink in SchedulerParameters.
# Track every process of a job, so none keeps a GPU busy after a requeue.
ProctrackType=proctrack/cgroup
#
# Each GPU node declares its GPUs (optionally typed: Gres=gpu:a100:4), and a
# partition holds the GPU nodes. Adapt names and counts, then uncomment:
#NodeName=gpu[01-04] CPUs=64 RealMemory=512000 Gres=gpu:4 State=UNKNOWN
#PartitionName=gpu Nodes=gpu[01-04] Default=YES MaxTime=INFINITE State=UP
#
# ---- gres.conf (in the same directory as slurm.conf) ----
# Every GPU is bound to its device file, so Slurm can give a job its own GPUs;
# or let Slurm find them with NVML (AMD: rsmi). Adapt, then uncomment one:
#NodeName=gpu[01-04] Name=gpu File=/dev/nvidia[0-3]
#AutoDetect=nvml
#
# After editing: restart slurmctld and every slurmd (SelectType, GresTypes and
# ProctrackType need a restart; the rest takes `scontrol reconfigure`).
"""
