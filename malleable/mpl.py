"""matplotlib for writing image files: the Agg backend, imported without its warnings
about a missing config directory.

A service account or a job's user often has no writable home. matplotlib then makes a
temporary config and cache directory and logs two warnings at import. Neither affects
the image, and the commands print errors as one line, so `pyplot` silences matplotlib's
logger below ERROR for the import only.
"""

from __future__ import annotations

import logging
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed).

    Returns:
        The ``matplotlib.pyplot`` module.

    Raises:
        ImportError: matplotlib is not installed (it is a dependency of malleable).
    """
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(logging.ERROR)   # only during the import: the config-dir warnings
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        logger.setLevel(level)
    return plt
