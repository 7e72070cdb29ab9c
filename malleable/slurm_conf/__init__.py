"""Slurm configuration files: reading slurm.conf and gres.conf.

Owns parsing of the site's Slurm configuration (and ``scontrol show config``
output when a controller answers), the GPU inventory derived from it, the
prerequisite checks malleable needs (requeue allowed, select/cons_tres, GPU
GRES with device files, shrink allowed, a sane MinJobAge), each with its fix,
and the snippet of lines an admin adds. It reads files; it never changes them.

Public API (``malleable conf check`` is `check_configuration` plus a view):

* `parse_slurm_conf`, `parse_gres_conf`, `parse_conf_text` -> `ParsedConf`
* `expand_hostlist`, `compress_hostlist`; `parse_gres` -> [`GresSpec`]
* `build_inventory` -> (`Inventory`, [`Finding`])
* `parse_show_config` -> `ControllerConfig`; `query_controller` -> `ControllerQuery`
* `check_configuration` -> `Report` (``to_dict()`` is the JSON; `format_report` the text)
* `snippet` -> the slurm.conf lines to add
"""

from malleable.slurm.hostlist import HostlistError, compress_hostlist, expand_hostlist
from malleable.slurm_conf.controller import (
    ControllerConfig,
    ControllerQuery,
    ShowConfigError,
    parse_show_config,
    query_controller,
)
from malleable.slurm_conf.gres import GresSpecError, parse_count, parse_gres
from malleable.slurm_conf.inventory import build_inventory
from malleable.slurm_conf.parser import (
    Entry,
    ParsedConf,
    Record,
    parse_conf_file,
    parse_conf_text,
    parse_gres_conf,
    parse_slurm_conf,
)
from malleable.slurm_conf.records import (
    CheckResult,
    Finding,
    GresSpec,
    Inventory,
    Location,
    NodeInfo,
    PartitionInfo,
    Severity,
)
from malleable.slurm_conf.report import SCHEMA, Report, check_configuration, format_report
from malleable.slurm_conf.snippet import snippet

__all__ = [
    "SCHEMA", "CheckResult", "ControllerConfig", "ControllerQuery", "Entry", "Finding",
    "GresSpec", "GresSpecError", "HostlistError", "Inventory", "Location", "NodeInfo",
    "ParsedConf", "PartitionInfo", "Record", "Report", "Severity", "ShowConfigError",
    "build_inventory", "check_configuration", "compress_hostlist", "expand_hostlist",
    "format_report", "parse_conf_file", "parse_conf_text", "parse_count", "parse_gres",
    "parse_gres_conf", "parse_show_config", "parse_slurm_conf", "query_controller", "snippet",
]
