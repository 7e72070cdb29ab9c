"""malleable: GPU reallocation for malleable ML training jobs on Slurm.

A daemon beside ``slurmctld`` polls Slurm into a database, ingests the progress
that malleable jobs log, estimates each job's speedup and remaining work,
computes a new GPU assignment with a scheduling policy, and applies it through
Slurm (pending-job resize, in-place shrink, checkpoint-requeue). The simulator
replays traces through the same decision loop. See DESIGN.md for the layering:
``config`` < ``slurm`` < ``slurm_conf`` < ``db`` < ``progress`` < ``estimators``
< ``policies`` < ``daemon`` < ``sim`` < ``cli``.
"""

__version__ = "0.1.0"
