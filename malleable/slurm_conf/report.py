"""`check_configuration`: read the files, ask the controller, check; and the report's two views.

`check_configuration` is the whole of ``malleable conf check`` without the
command line: it returns a `Report`. ``Report.to_dict`` is the ``--json``
view (schema in docs/conf-check.md) and `format_report` the plain-text view;
both show the same result.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field

from malleable.config import Config
from malleable.slurm.hostlist import compress_hostlist
from malleable.slurm_conf.checks import run_checks
from malleable.slurm_conf.controller import ControllerQuery, query_controller
from malleable.slurm_conf.inventory import build_inventory
from malleable.slurm_conf.parser import ParsedConf, parse_gres_conf, parse_slurm_conf
from malleable.slurm_conf.records import CheckResult, Finding, Inventory, NodeInfo, Severity
from malleable.slurm_conf.settings import Settings, compare

SCHEMA = "malleable.conf-check/1"
"""The ``schema`` value of the JSON report; bumped when a key changes meaning or goes away."""

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
ENV_SLURM_CONF = "SLURM_CONF"


def default_slurm_conf(env: dict | None = None) -> str:
    """``$SLURM_CONF`` if set and non-empty, else ``/etc/slurm/slurm.conf``."""
    env = os.environ if env is None else env
    return env.get(ENV_SLURM_CONF) or DEFAULT_SLURM_CONF


def default_gres_conf(slurm_conf: str) -> str:
    """gres.conf(5): gres.conf is always in the same directory as slurm.conf."""
    return os.path.join(os.path.dirname(os.path.abspath(slurm_conf)), "gres.conf")


@dataclass
class Report:
    """The result of one configuration check.

    Attributes:
        slurm_conf: the slurm.conf checked.
        gres_conf: the gres.conf path used (it may not exist: see ``gres_conf_found``).
        gres_conf_found: whether that gres.conf exists.
        files: every file read (Includes too).
        controller: the controller query (``queried`` False with ``--no-controller``).
        inventory: the GPU inventory.
        checks: one result per check, in report order.
        findings: every finding, errors first.
    """

    slurm_conf: str
    gres_conf: str
    gres_conf_found: bool
    files: list[str]
    controller: ControllerQuery
    inventory: Inventory
    checks: list[CheckResult]
    findings: list[Finding] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        """Number of findings of one severity."""
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def ok(self) -> bool:
        """True when there is no error finding (warnings and infos allowed)."""
        return self.count(Severity.ERROR) == 0

    def to_dict(self) -> dict:
        """The ``--json`` document; its keys and types are documented in docs/conf-check.md."""
        differences = [f.to_dict() for f in self.findings if f.check == "controller"]
        return {
            "schema": SCHEMA,
            "ok": self.ok,
            "slurm_conf": self.slurm_conf,
            "gres_conf": self.gres_conf,
            "gres_conf_found": self.gres_conf_found,
            "files": list(self.files),
            "controller": {**self.controller.to_dict(), "differences": differences},
            "inventory": self.inventory.to_dict(),
            "checks": [c.to_dict() for c in self.checks],
            "findings": [f.to_dict() for f in self.findings],
            "summary": {"errors": self.count(Severity.ERROR),
                        "warnings": self.count(Severity.WARNING),
                        "infos": self.count(Severity.INFO)},
        }


def check_configuration(slurm_conf: str | os.PathLike, gres_conf: str | os.PathLike | None = None,
                        *, config: Config, ask_controller: bool = True,
                        controller_timeout_s: float | None = None,
                        scontrol: str = "scontrol") -> Report:
    """Read slurm.conf and gres.conf, ask the controller, and run every check.

    Args:
        slurm_conf: the slurm.conf to check (read only).
        gres_conf: the gres.conf; None means gres.conf next to slurm.conf,
            where Slurm looks (a missing one there is a finding, not an error).
        config: malleable's settings (poll interval, managed partitions,
            Slurm command timeout).
        ask_controller: run ``scontrol show config`` against the controller
            that slurm.conf names; its values override the files'.
        controller_timeout_s: timeout of that command, seconds (default
            ``config.slurm.command_timeout_s``).
        scontrol: the scontrol program.

    Returns:
        A `Report`. Bad or unreadable files are findings, never exceptions.
    """
    slurm_path = os.fspath(slurm_conf)
    gres_path = os.fspath(gres_conf) if gres_conf is not None else default_gres_conf(slurm_path)
    slurm = parse_slurm_conf(slurm_path)
    gres_found = os.path.lexists(gres_path)
    gres: ParsedConf | None = parse_gres_conf(gres_path) if gres_found else None
    if ask_controller and slurm.readable:
        timeout = config.slurm.command_timeout_s if controller_timeout_s is None \
            else controller_timeout_s
        query = query_controller(slurm_path, timeout, scontrol=scontrol)
    else:
        query = ControllerQuery(queried=False)
    settings = Settings(slurm, query.config)
    inventory, inv_findings = build_inventory(slurm, gres, gres_path)
    ctl_findings = compare(slurm, query, slurm_path)
    checks, findings = run_checks(
        slurm=slurm, gres=gres, gres_path=gres_path, settings=settings, inventory=inventory,
        inventory_findings=inv_findings, controller=query, controller_findings=ctl_findings,
        config=config)
    files = slurm.files + (gres.files if gres is not None else [])
    return Report(slurm_conf=slurm_path, gres_conf=gres_path, gres_conf_found=gres_found,
                  files=files, controller=query, inventory=inventory, checks=checks,
                  findings=findings)


def _devices(n: NodeInfo) -> str:
    if n.autodetect:
        return f"AutoDetect={n.autodetect}"
    if n.device_files:
        return f"{len(n.device_files)} files"
    if n.gres_conf_gpus is not None:
        return f"Count={n.gres_conf_gpus}, no files"
    return "none" if n.gpus else "-"


def _node_rows(inv: Inventory) -> list[tuple[str, ...]]:
    """Consecutive nodes that look the same share one row (hostlist of their names)."""
    rows: list[tuple[list[str], tuple[str, ...]]] = []
    for n in inv.nodes:
        types = ",".join(f"{t}:{c}" for t, c in n.gpu_types if t) or "-"
        key = (str(n.gpus), types, _devices(n), ",".join(n.partitions) or "-")
        if rows and rows[-1][1] == key:
            rows[-1][0].append(n.name)
        else:
            rows.append(([n.name], key))
    return [(compress_hostlist(names), *key) for names, key in rows]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]


def format_report(report: Report, width: int = 100) -> str:
    """The plain-text view: files, controller, inventory, checks, findings with fixes, verdict."""
    out: list[str] = []
    out.append(f"slurm.conf: {report.slurm_conf}")
    out.append(f"gres.conf:  {report.gres_conf}" + ("" if report.gres_conf_found
                                                    else "  (not found)"))
    ctl = next(c for c in report.checks if c.check == "controller")
    out.append(f"controller: {ctl.summary}")
    inv = report.inventory
    out.append("")
    out.append(f"GPU inventory: {inv.total_gpus} GPUs on {len(inv.gpu_nodes)} of "
               f"{len(inv.nodes)} nodes")
    if inv.nodes:
        out += _table(("NODES", "GPUS", "TYPES", "GRES.CONF", "PARTITIONS"), _node_rows(inv))
    if inv.partitions:
        rows = [(p.name + (" (default)" if p.default else ""), p.state,
                 str(len(p.nodes)), str(p.gpu_nodes), str(p.gpus),
                 compress_hostlist(p.nodes) or "-") for p in inv.partitions]
        out.append("")
        out += _table(("PARTITION", "STATE", "NODES", "GPU_NODES", "GPUS", "HOSTLIST"), rows)
    out.append("")
    out.append("Checks:")
    rows = [(c.status, c.check, c.title + (f": {c.summary}" if c.summary else ""))
            for c in report.checks]
    out += _table(("STATUS", "CHECK", "WHAT"), rows)
    n_err, n_warn, n_info = (report.count(s) for s in Severity)
    out.append("")
    out.append(f"Findings: {n_err} error(s), {n_warn} warning(s), {n_info} info(s)")
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False)
    for f in report.findings:
        out.append(f"  {str(f.severity).upper()} [{f.check}] {f.location}")
        out += wrap.wrap(f.message)
        if f.fix:
            out += textwrap.wrap(f"fix: {f.fix}", width=width, initial_indent="    ",
                                 subsequent_indent="         ", break_long_words=False,
                                 break_on_hyphens=False)
    out.append("")
    if report.ok:
        out.append(f"PASS: no errors ({n_warn} warning(s), {n_info} info(s))")
    else:
        out.append(f"FAIL: {n_err} error(s) ({n_warn} warning(s), {n_info} info(s))")
    return "\n".join(out)
