"""``malleable daemon``: run the service in the foreground (systemd's ExecStart).

Exit codes: 0 stopped cleanly (SIGTERM) or ``--once`` done; 1 ``--once`` could
not poll Slurm (nothing was decided: for cron, a failed run is seen); 2 it could not
start: a bad configuration, an unusable database, a schema older or newer than
this malleable's, another daemon holding the lease, or a ``[metrics] address``
it cannot listen on, e.g. a port in use (the lease is taken first, so that a
second daemon names the holder, and given back; one line on stderr naming the
cause, no traceback); 3 its SQLite file was removed or replaced while it ran (it
stops without writing to the database again; the systemd unit does not restart it).
"""

from __future__ import annotations

import dataclasses

import click

from malleable.config import ConfigError, check_policy, load_config
from malleable.daemon.logs import setup_logging
from malleable.db.errors import StoreError
from malleable.slurm.client import SlurmError


@click.command("daemon")
@click.option("--config", "config_path", metavar="PATH", default=None,
              help="TOML configuration (default: $MALLEABLE_CONFIG or "
                   "/etc/malleable/malleable.toml).")
@click.option("--dry-run", is_flag=True, help="Plan and log actions; change nothing in Slurm.")
@click.option("--once", is_flag=True, help="Run one full cycle (poll, ingest, decide, apply) "
                                           "and exit.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                              case_sensitive=False),
              default=None, help="Override daemon.log_level (any case).")
def daemon(config_path: str | None, dry_run: bool, once: bool, log_level: str | None) -> None:
    """Run the malleable daemon in the foreground.

    It polls Slurm, reads the malleable jobs' progress, runs the active policy and
    resizes jobs through Slurm. Under systemd (Type=notify) it reports readiness and
    pings the watchdog; SIGHUP reloads the configuration; SIGTERM stops it after the
    step in progress. Its database is the configuration's [database] url, or
    $MALLEABLE_DATABASE_URL when set (there is no --database-url option).
    """
    from malleable.daemon.metrics import exporter_from_config
    from malleable.daemon.service import ServiceOptions, run_service

    try:
        config = load_config(config_path)
        check_policy(config)
    except ConfigError as exc:
        raise click.exceptions.Exit(_fail(f"{exc}")) from None
    if log_level:
        config = dataclasses.replace(
            config, daemon=dataclasses.replace(config.daemon, log_level=log_level))
    setup_logging(config.daemon.log_level)
    try:
        code = run_service(config, ServiceOptions(
            config_path, dry_run, once, metrics_factory=lambda: exporter_from_config(config)))
    except (StoreError, SlurmError, OSError, ValueError) as exc:
        raise click.exceptions.Exit(_fail(str(exc))) from None
    raise click.exceptions.Exit(code)


def _fail(message: str) -> int:
    click.echo(f"malleable daemon: error: {message}", err=True)
    return 2
