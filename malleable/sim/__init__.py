"""The simulator: replay traces through the production decision loop.

Owns the discrete-event engine and virtual clock, the simulated Slurm (a
`SlurmClient`), simulated jobs driven by measured throughput profiles, trace
loaders (Pollux, Philly, Gavel, SWF, sacct), metrics and plots. The daemon's
cycle runs against it unmodified.
"""
