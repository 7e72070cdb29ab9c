"""The Prometheus exporter (off by default; ``[metrics] address = "host:port"``).

Filled in by the operator issue; until then `exporter_from_config` returns None
when no address is configured.
"""

from __future__ import annotations

from collections.abc import Callable

from malleable.config import Config


def exporter_from_config(config: Config) -> Callable | None:
    """The metrics sink for cycle reports, or None when ``metrics.address`` is empty.

    Raises:
        ValueError: an address is configured (the exporter is not built yet).
    """
    if not config.metrics.address:
        return None
    raise ValueError(f"metrics.address = {config.metrics.address!r}: the exporter is not "
                     "available in this build")
