"""``malleable conf``: check Slurm's configuration for malleable, and print the lines to add.

    malleable conf check [--slurm-conf PATH] [--gres-conf PATH] [--no-controller]
                         [--controller-timeout S] [--strict] [--json]
    malleable conf snippet

Exit codes of ``check``: 0 no error finding (warnings allowed), 1 at least
one error finding (or, with ``--strict``, a warning), 2 bad input (a missing --slurm-conf or --gres-conf file,
an unusable malleable configuration), with a one-line message.
"""

from __future__ import annotations

import json
import os
from typing import NoReturn

import click

from malleable.clitypes import FiniteFloat
from malleable.config import Config, ConfigError, load_config
from malleable.slurm_conf.records import Severity
from malleable.slurm_conf.report import (
    DEFAULT_SLURM_CONF,
    check_configuration,
    default_slurm_conf,
    format_report,
)
from malleable.slurm_conf.snippet import snippet as make_snippet


def _usage_error(message: str) -> NoReturn:
    """Print ``malleable conf SUBCOMMAND: error: MESSAGE`` on stderr and exit with
    status 2 (the command path as invoked, e.g. ``malleable conf check``)."""
    ctx = click.get_current_context(silent=True)
    click.echo(f"{ctx.command_path if ctx else 'malleable conf'}: error: {message}", err=True)
    raise click.exceptions.Exit(2)


def _config(ctx: click.Context) -> Config:
    try:
        return load_config(ctx.obj.get("config_path"))
    except ConfigError as exc:
        msg = str(exc)
        _usage_error(msg if msg.startswith("--config") else f"--config: {msg}")


_CONFIG_HELP = ("malleable's settings file (default $MALLEABLE_CONFIG or "
                "/etc/malleable/malleable.toml); used for the poll interval and the "
                "managed partitions.")


def _config_option(fn):
    """``--config`` on a subcommand too (``conf check --config X``, as every other
    command takes it); it wins over the group's."""
    def remember(ctx: click.Context, _param, value):
        if value is not None:
            ctx.ensure_object(dict)["config_path"] = value
        return value

    return click.option("--config", "sub_config_path", type=click.Path(dir_okay=False),
                        default=None, expose_value=False, callback=remember,
                        help=_CONFIG_HELP)(fn)


@click.group("conf")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help=_CONFIG_HELP)
@click.pass_context
def conf(ctx: click.Context, config_path: str | None) -> None:
    """Check Slurm's configuration for malleable, or print the lines to add."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path


@conf.command("check")
@_config_option
@click.option("--slurm-conf", "slurm_conf", default=None, metavar="PATH",
              help=f"slurm.conf to check (default $SLURM_CONF, else {DEFAULT_SLURM_CONF}).")
@click.option("--gres-conf", "gres_conf", default=None, metavar="PATH",
              help="gres.conf to check (default: gres.conf next to slurm.conf, where Slurm "
                   "reads it).")
@click.option("--no-controller", is_flag=True,
              help="Do not run `scontrol show config`; check the files alone.")
@click.option("--controller-timeout", type=FiniteFloat(min=0.1), default=None,
              metavar="SECONDS",
              help="Timeout of `scontrol show config` (default slurm.command_timeout_s).")
@click.option("--strict", is_flag=True,
              help="Exit 1 on warnings too (for CI and provisioning scripts).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (schema: docs/conf-check.md).")
@click.pass_context
def check(ctx: click.Context, slurm_conf: str | None, gres_conf: str | None,
          no_controller: bool, controller_timeout: float | None, strict: bool,
          as_json: bool) -> None:
    """Read slurm.conf and gres.conf (and the running controller's settings), print the
    GPU inventory and each finding with its file:line and fix.

    Exit status: 0 no errors, 1 errors found (or warnings, with --strict), 2 bad input.
    """
    config = _config(ctx)
    explicit = slurm_conf is not None
    path = slurm_conf if explicit else default_slurm_conf()
    source = "--slurm-conf" if explicit else ("$SLURM_CONF" if os.environ.get("SLURM_CONF")
                                              else "default slurm.conf")
    if not os.path.lexists(path):
        _usage_error(f"{source} {path}: no such file")
    if os.path.isdir(path):
        _usage_error(f"{source} {path}: is a directory, expected slurm.conf")
    if gres_conf is not None and not os.path.lexists(gres_conf):
        _usage_error(f"--gres-conf {gres_conf}: no such file")
    report = check_configuration(path, gres_conf, config=config,
                                 ask_controller=not no_controller,
                                 controller_timeout_s=controller_timeout)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(format_report(report))
    failed = not report.ok or (strict and report.count(Severity.WARNING) > 0)
    ctx.exit(1 if failed else 0)


@conf.command("snippet")
@_config_option
@click.pass_context
def snippet(ctx: click.Context) -> None:
    """Print the slurm.conf (and gres.conf) lines malleable needs, each with a comment."""
    click.echo(make_snippet(_config(ctx)), nl=False)
