"""Policies: how many GPUs each malleable job should have.

Owns the policy interface (arrays in, target GPUs, batch sizes and reasons
out), one module per policy (static, fifo, equi, las, srpt, hesrpt, optimus,
pollux, gittins, default), the registry by name, the shared feasibility
repair (bounds, step, node granularity, capacity) and hysteresis. Pure
functions over numpy arrays: no database, no Slurm, no clock.
"""
