"""The `malleable` command: a click group whose subcommands live with their subpackage.

Each subcommand is registered below as ``name -> "module:attribute"`` and
imported only when it is invoked (or listed by ``--help``), so ``malleable
--version`` and shell completion stay fast and a broken optional dependency
in one subpackage cannot break the others.

Exit codes, for every subcommand: 0 success, 1 the operation failed, 2 bad
input (a usage error, a bad value, an unusable file) with a one-line message
naming the field and the value.
"""

from __future__ import annotations

import importlib
import sys

import click

from malleable import __version__

# name -> "module:attribute" of a click command or group. Adding a command is one line here.
COMMANDS: dict[str, str] = {
    "actions": "malleable.ops.actions:actions",
    "conf": "malleable.slurm_conf.cli:conf",
    "config": "malleable.ops.config:config",
    "daemon": "malleable.daemon.cli:daemon",
    "db": "malleable.db.cli:db",
    "job": "malleable.ops.job:job",
    "pause": "malleable.ops.control:pause",
    "plan": "malleable.ops.plan:plan",
    "policy": "malleable.ops.policy:policy",
    "replay": "malleable.replay:replay_command",
    "report": "malleable.progress.cli:report",
    "resume": "malleable.ops.control:resume",
    "simulate": "malleable.sim.cli:simulate",
    "status": "malleable.ops.status:status",
    "submit": "malleable.submit:submit",
}


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class LazyGroup(click.Group):
    """A click group that imports each registered subcommand on first use."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module_name, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, name)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        """Run the command line; a usage error is one line on stderr and exit code 2.

        Click's own form prints the usage, a hint and the error on three or four
        lines; every other malleable error is one line ("malleable X: error: ..."),
        and a usage error is now the same, with the command's --help named.
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            if isinstance(exc, _NO_ARGS_IS_HELP):   # a group without a command: its help
                exc.show()
                sys.exit(exc.exit_code)
            path = exc.ctx.command_path if exc.ctx is not None else (prog_name or "malleable")
            click.echo(f"{path}: error: {exc.format_message()} (see {path} --help)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort as exc:
            click.echo("Aborted!", err=True)
            # Ctrl-C exits as a shell reports SIGINT (128 + 2); an end of input at a prompt, 1
            sys.exit(130 if isinstance(exc.__cause__, KeyboardInterrupt) else 1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="malleable")
def main() -> None:
    """Reallocate GPUs among malleable ML training jobs on Slurm.

    malleable runs beside slurmctld: it polls Slurm, reads the progress that
    malleable jobs log, estimates how each job speeds up with GPUs and how much
    work it has left, and resizes jobs through Slurm (pending resize, in-place
    shrink, checkpoint-requeue) so that jobs finish sooner on average.
    Rigid jobs are never touched.
    """
