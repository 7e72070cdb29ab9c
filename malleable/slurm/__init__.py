"""The Slurm port: the only code that talks to Slurm.

Owns the typed, immutable records (`SlurmJob`, `SlurmNode`, `ClusterInfo`), the
`SlurmClient` protocol the daemon and the simulator program against, its error
hierarchy, and the backends behind it: ``cli`` (squeue/scontrol/scancel as argv
lists with timeouts, JSON parsing tolerant of Slurm 22.05 to 25.11) and
``pyslurm`` (when pyslurm imports and matches the controller). Nothing outside
this package runs a Slurm command.
"""
