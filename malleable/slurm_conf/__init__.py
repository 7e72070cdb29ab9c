"""Slurm configuration files: reading slurm.conf and gres.conf.

Owns parsing of the site's Slurm configuration (and ``scontrol show config``
output when a controller answers), the GPU inventory derived from it, the
prerequisite checks malleable needs (requeue allowed, select/cons_tres, GPU
GRES with device files, shrink allowed, a sane MinJobAge), each with its fix,
and the snippet of lines an admin adds. It reads files; it never changes them.
"""
