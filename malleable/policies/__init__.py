"""Policies: how many GPUs each malleable job should have.

Owns the policy interface (`base`: JobSet, Capacity, Context, Allocation,
Policy), one module per policy (static, fifo, equi, las, srpt, hesrpt,
optimus, pollux, gittins; ``default`` is an alias in `registry`), the
registry by name (`registry.get_policy`, `registry.available`), the shared
feasibility repair (`feasibility`: bounds, step, node granularity, packing
into each node's free GPUs), hysteresis (`hysteresis.Hysteresis`,
`hysteresis.policy_from_config`), starvation protection (`starvation`),
Pollux's restart factor (`restarts`), helpers over the speedup table
(`curves`) and synthetic tables for tests and benchmarks (`synthetic`).
Pure functions over numpy arrays: no database, no Slurm, no clock.
docs/policies.md describes every policy and how to add one.
"""
