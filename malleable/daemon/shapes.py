"""GPU counts to Slurm job shapes (nodes x GPUs per node) and back.

Node granularity (DESIGN.md section 4; `malleable.estimators.table.feasible_mask`):
a job either fits inside one node (k <= g: 1 node x k GPUs) or uses whole
nodes (k = n*g: n nodes x g GPUs). These are the only shapes the reconciler
asks Slurm for.
"""

from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    """A job's size as Slurm sees it: ``nodes`` x ``gpus_per_node`` GPUs."""

    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def shape_for(k: int, gpus_per_node: int) -> Shape:
    """The Slurm shape for k GPUs on nodes of ``gpus_per_node`` GPUs.

    Args:
        k: GPUs, >= 1.
        gpus_per_node: g, >= 1.

    Returns:
        Shape(1, k) if k <= g, else Shape(k // g, g).

    Raises:
        ValueError: k < 1, g < 1, or k > g and not a multiple of g (not a legal shape).
    """
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if k < 1:
        raise ValueError(f"GPU count must be >= 1, got {k}")
    if k <= gpus_per_node:
        return Shape(1, k)
    if k % gpus_per_node:
        raise ValueError(f"{k} GPUs is neither within one node nor whole nodes of "
                         f"{gpus_per_node} GPUs")
    return Shape(k // gpus_per_node, gpus_per_node)


def can_shrink_in_place(current: Shape, target: Shape) -> bool:
    """Whether Slurm can shrink ``current`` to ``target`` by releasing nodes.

    A running job's GRES per node cannot change ("Job is no longer pending
    execution", DESIGN.md section 6); only its node count can go down.
    """
    return (target.gpus_per_node == current.gpus_per_node
            and 1 <= target.nodes < current.nodes)
