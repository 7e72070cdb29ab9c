"""Estimators: what each job's progress says about its future.

Owns the throughput model X(k, n, m) (Pollux iteration-time model, with
Amdahl / k^p priors), statistical efficiency E(m) from the gradient noise
scale, goodput X*E and its optimal batch size, remaining-work estimates with
uncertainty, and the speedup table that policies consume. Pure functions over
numpy arrays: no database, no Slurm, no clock.
"""
