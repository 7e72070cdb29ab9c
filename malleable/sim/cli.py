"""``malleable simulate``: replay traces through the decision loop, several runs in parallel.

Exit codes: 0 every run finished writing its outputs; 1 a run failed (or the
comparison of a sweep's runs could not be written); 2 bad input (a missing or
malformed trace, an unknown policy, a bad option or configuration, no valid run
to compare), with one line on stderr naming it. Notes (``note:`` lines on
stderr) say what the command did about input it accepts: skipped run folders,
runs of different settings compared together, replaced runs, jobs the cluster
cannot hold, CPU-only jobs, arrivals after --max-time, trace rows left out, what
of a Gavel trace is not used.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from malleable.clitypes import FiniteFloat

TRACE_SUFFIXES = (".csv", ".csv.gz", ".swf", ".swf.gz", ".json", ".txt", ".log")
# A trace folder's documentation, not a trace (README.txt, LICENSE.txt, NOTICE, ...).
NOT_TRACES = ("readme", "license", "licence", "notice", "copying", "changelog")


def _fail(message: str) -> click.exceptions.Exit:
    click.echo(f"malleable simulate: error: {message}", err=True)
    return click.exceptions.Exit(2)


def _items(option: str, values: tuple[str, ...], what: str) -> list[str]:
    """The comma-separated items of an option given once or more, stripped.

    Returns:
        The non-empty items ([] if there is none).

    Raises:
        click.exceptions.Exit(2): an empty item beside others (one line naming the
            option, as given, and ``what`` an item is).
    """
    items = [v.strip() for value in values for v in value.split(",")]
    if any(items) and "" in items:
        raise _fail(f"{option} {','.join(values)!r}: an empty {what} between commas")
    return [v for v in items if v]


def _workload_items(values: tuple[str, ...]) -> list[str]:
    """``--workload``'s paths: its values split at commas (`_items`).

    Raises:
        click.exceptions.Exit(2): as `_items`, or a value that names an existing file
            or directory as a whole but not once split at its commas (a path with a
            comma): the message says to give it with ``--workload-path``.
    """
    for value in values:
        if "," in value and Path(value).exists():
            parts = [v.strip() for v in value.split(",")]
            if not all(part and Path(part).exists() for part in parts):
                raise _fail(f"--workload {value!r}: --workload splits its value at commas "
                            f"(into {', '.join(repr(v) for v in parts)}); give a path with "
                            f"a comma with --workload-path")
    return _items("--workload", values, "path")


def _expand(paths: list[str], option: str = "--workload") -> list[str]:
    """Trace paths; a directory stands for its trace files (sorted). A path that is
    neither a directory nor a trace file stops the command (exit 2) naming ``option``."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.iterdir() if f.is_file()
                           and not f.name.startswith(".")
                           and not f.name.lower().startswith(NOT_TRACES)
                           and any(f.name.endswith(s) for s in TRACE_SUFFIXES))
            if not found:
                raise _fail(f"{option} {p}: directory holds no trace file")
            out.extend(found)
        else:
            from malleable.sim.workloads import trace_file_problem

            problem = trace_file_problem(path)
            if problem:
                raise _fail(f"{option} {p}: {problem}")
            out.append(str(path))
    return out


def _seeds(values: tuple[str, ...]) -> list[int]:
    items = _items("--seed", values, "seed")
    if not items:
        raise _fail(f"--seed {','.join(values)!r}: give at least one seed (N[,N...])")
    out = []
    for v in items:
        try:
            seed = int(v)
        except ValueError:
            raise _fail(f"--seed {v!r}: not an integer") from None
        if seed < 0:
            raise _fail(f"--seed {v!r}: expected an integer >= 0")
        if seed in out:
            raise _fail(f"--seed {v!r}: given twice (each seed is one run per workload "
                        "and policy)")
        out.append(seed)
    return out


@click.command("simulate")
@click.option("--workload", "workloads", multiple=True, metavar="PATH[,PATH...]",
              help="Trace file(s), comma-separated or repeated; a directory means its "
                   "trace files (*.csv, *.swf, *.json, *.txt, *.log, optionally .gz; not "
                   "README*, LICENSE* and the like). A path with a comma: --workload-path.")
@click.option("--workload-path", "workload_paths", multiple=True, metavar="PATH",
              help="One trace file or directory, taken whole (a path with a comma); "
                   "repeatable; read after --workload's.")
@click.option("--policy", "policies", multiple=True, metavar="NAME[,NAME...]",
              help="Policy name(s): pollux (= default), las, gittins, hesrpt, srpt, "
                   "optimus, equi, fifo, static (docs/policies.md). Default: --config's "
                   "[policy] name, if it has one.")
@click.option("--policy-params", "policy_params", multiple=True, metavar="NAME=JSON",
              help='Parameters of one policy, e.g. las=\'{"starve_s": 1e12}\' (repeatable).')
@click.option("--nodes", type=click.IntRange(min=1, max=100_000), default=16, show_default=True,
              help="Nodes in the simulated cluster (1 to 100,000).")
@click.option("--gpus-per-node", type=click.IntRange(min=1, max=1024), default=4,
              show_default=True, help="GPUs per node (1 to 1024).")
@click.option("--interval", type=FiniteFloat(min=1, max=86400), default=None,
              help="Decide interval, simulated seconds (1 to 86400). Default: --config's "
                   "daemon.decide_interval_s, else the daemon's 60 s; given, it overrides "
                   "the config.")
@click.option("--seed", "seeds", multiple=True, metavar="N[,N...]", default=("0",),
              show_default=True, help="Seed(s): request rounding, model choice, the policy's.")
@click.option("--out", "out_dir", metavar="DIR", required=True,
              help="Output directory (DIR/<workload>/<policy>/seed<N>/...).")
@click.option("--restart-cost", type=FiniteFloat(min=0, max=7 * 86400), default=None, metavar="S",
              help="Restart cost of every job, seconds, 0 to 604800 (7 days) [default: per model].")
@click.option("--format", "fmt", type=click.Choice(["auto", "pollux", "philly", "gavel", "swf",
                                                    "sacct"]),
              default="auto", show_default=True,
              help="Trace format. auto: from the name and first line: pollux "
                   "(name,time,application,num_replicas,batch_size), philly "
                   "(timestamp,duration,num_gpus,...), gavel (seed,vc,line_no,...), swf "
                   "(*.swf[.gz]), sacct (--json, -P text or the Eagle CSV); "
                   "docs/simulator.md has the columns.")
@click.option("--load-scale", type=FiniteFloat(min=0, min_open=True), default=1.0,
              show_default=True, metavar="X", help="Arrival times divided by X.")
@click.option("--window", "window_days", type=FiniteFloat(min=0, min_open=True),
              default=None, metavar="DAYS",
              help="Replay only the busiest window of DAYS whose demand fits the cluster.")
@click.option("--map-models", is_flag=True,
              help="SWF/sacct: give GPU jobs a model by GPU-time class (else rigid).")
@click.option("--job-setup", type=click.Choice(["auto", "requested", "elastic", "adaptive"]),
              default="auto", show_default=True,
              help="How trace jobs become malleable jobs (auto: as Pollux's simulator did "
                   "for the scheduler each policy stands for).")
@click.option("--oracle-work/--no-oracle-work", default=None,
              help="Jobs declare their true total work [default: optimus only].")
@click.option("--config", "config_path", metavar="PATH", default=None,
              help="TOML with daemon settings ([daemon], [policy], ...) for every run. "
                   "Its [policy] name is the policy when --policy is not given (one of the "
                   "two is needed); its [policy] params apply only to the runs of that "
                   "policy (a [policy] without a name: the \"default\" policy's). "
                   "Without it every run uses the defaults: $MALLEABLE_CONFIG and "
                   "/etc/malleable/malleable.toml are not read, so a simulation does not "
                   "depend on this machine's daemon settings.")
@click.option("--max-time", "max_time_h", type=FiniteFloat(min=0, min_open=True, max=1e6),
              default=2880.0, show_default=True, metavar="HOURS",
              help="Stop a run at this simulated time (default 120 days: a bound, not a "
                   "target; a stopped run's metrics cover its finished jobs; at most 1e6 "
                   "hours).")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None,
              help="Runs in parallel (worker processes). Default: one per CPU core this "
                   "process may use, at most one per run.")
@click.option("--slurm-array", is_flag=True,
              help="Write an sbatch job-array script for the sweep instead of running it.")
@click.option("--compare-only", is_flag=True,
              help="Only (re)build DIR's comparison from the runs already there.")
@click.option("--no-comparison", is_flag=True, help="Do not write the comparison.")
@click.option("--no-plots", is_flag=True, help="Do not write per-run plots.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--sweep-policies", "sweep_policies", default=None, hidden=True,
              help="(--slurm-array's tasks) the whole sweep's policies: --policy-params and "
                   "--config's [policy] params are checked against them, not --policy alone.")
def simulate(workloads, workload_paths, policies, policy_params, nodes, gpus_per_node, interval, seeds, out_dir, restart_cost,
             fmt, load_scale, window_days, map_models, job_setup, oracle_work, config_path,
             max_time_h, n_jobs, slurm_array, compare_only, no_comparison, no_plots,
             no_progress, sweep_policies) -> None:
    """Replay traces through the daemon's decision loop against a simulated Slurm.

    Each (workload, policy, seed) is one run of the production cycle (poll,
    ingest, estimators, policy, reconciler, actuator) on virtual time, with jobs
    driven by measured throughput profiles. Results: per run summary.json,
    jobs.csv and plots; over all runs comparison.json and a JCT CDF plot.
    """
    from malleable.sim import sweep

    logging.getLogger("malleable").setLevel(logging.ERROR)
    out = Path(out_dir)
    if compare_only:
        ignored = [name for name, given in (("--workload", workloads),
                                            ("--workload-path", workload_paths),
                                            ("--policy", policies),
                                            ("--slurm-array", slurm_array)) if given]
        if ignored:
            raise _fail(f"--compare-only rebuilds the comparison of the runs already in "
                        f"--out; it runs nothing, so {', '.join(ignored)} would be ignored: "
                        f"drop {'it' if len(ignored) == 1 else 'them'} or --compare-only")
        notes: list[str] = []
        runs = sweep.collect(out, notes)
        _notes(notes)
        skipped = sum(1 for n in notes if n.endswith(sweep.SKIPPED))
        if not runs:
            raise _fail(f"--out {out_dir}: no run (*/*/seed*/summary.json) to compare"
                        if not skipped else
                        f"--out {out_dir}: no valid run to compare ({skipped} run folder(s) "
                        "skipped: see the notes above)")
        path = _compare(runs, out, out_dir, notes=notes)
        click.echo(f"{len(runs)} run(s) compared: {path}" + (
            f" ({skipped} run folder(s) skipped: see the notes)" if skipped else ""))
        return
    paths = (_expand(_workload_items(workloads))
             + _expand(list(workload_paths), "--workload-path"))
    if not paths:
        raise _fail("--workload: give at least one trace file")
    config: dict = {}
    if config_path is not None:
        config = _read_config(config_path)
    if not policies and "name" in config.get("policy", {}):
        policies = (str(config["policy"]["name"]),)
    pols = _items("--policy", policies, "name")
    if not pols:
        raise _fail("--policy: give at least one policy (or a [policy] name in --config)")
    twice = sorted({p for p in pols if pols.count(p) > 1})
    if twice:
        raise _fail(f"--policy {twice[0]!r}: given twice (its runs would share one folder)")
    from malleable.policies.registry import DEFAULT, available, did_you_mean

    known = available()
    for p in pols:
        if p not in known:
            raise _fail(f"--policy {p!r}: unknown policy (known: {', '.join(known)})"
                        f"{did_you_mean(p)}")
    if "default" in pols and DEFAULT in pols:
        raise _fail(f"--policy: 'default' and {DEFAULT!r} are the same policy (default is "
                    f"an alias of {DEFAULT}): give one")
    seed_list = _seeds(seeds)
    # An array task runs one policy of a sweep: parameters of the sweep's others are
    # expected there (`sweep.write_slurm_array`).
    swept = _items("--sweep-policies", (sweep_policies,), "name") if sweep_policies else pols
    if not set(pols) <= set(swept):
        raise _fail(f"--sweep-policies {sweep_policies!r}: does not include --policy "
                    f"({', '.join(pols)})")
    params = _params(policy_params, swept)
    _check_config_params(config, config_path, swept)
    from malleable.sim.workloads import unique_names

    try:
        names = unique_names(paths)
    except ValueError as exc:
        raise _fail(f"--workload: {exc}") from None
    specs = [sweep.RunSpec(workload=str(Path(w).resolve()), name=n, policy=p, seed=s,
                           params=params.get(p),
                           out_dir=str(out), fmt=fmt, nodes=nodes, gpus_per_node=gpus_per_node,
                           interval_s=interval, restart_cost_s=restart_cost,
                           load_scale=load_scale, job_setup=job_setup, oracle_work=oracle_work,
                           window_days=window_days, gpu_time_classes=map_models, config=config,
                           max_time_s=max_time_h * 3600.0, plots=not no_plots)
             for w, n in zip(paths, names, strict=True) for p in pols for s in seed_list]
    sizes = _validate(specs)
    _check_out(out_dir)
    _notes(sweep.replaced_runs(specs))
    if slurm_array:
        common = _common_args(policy_params, nodes, gpus_per_node, interval, restart_cost, fmt, load_scale,
                              window_days, map_models, job_setup, oracle_work, config_path,
                              max_time_h, no_plots)
        array, compare = sweep.write_slurm_array([s.workload for s in specs[::len(pols) *
                                                                          len(seed_list)]],
                                                 pols, seed_list, common, out)
        click.echo(f"wrote {array} ({len(specs)} array tasks) and {compare}")
        click.echo("submit with:")
        click.echo(f"  {sweep.submit_hint(array, compare)}")
        return
    _check_run_dirs(specs, out_dir)
    bar = None
    ended = [0] * len(specs)
    if not no_progress:
        from tqdm import tqdm

        # disable=None: no bar when stderr is not a terminal (a log file, a batch job).
        bar = tqdm(total=sum(sizes), unit="job", desc=f"{len(specs)} run(s)", file=sys.stderr,
                   dynamic_ncols=True, disable=None)

    def progress(i: int, done: int, total: int, now: float) -> None:
        if bar is not None:
            ended[i] = done
            bar.n = sum(ended)
            bar.set_postfix_str(f"run {i + 1}: {now / 3600:.1f} h simulated", refresh=False)
            bar.update(0)  # redraws at most every mininterval (refresh() drew every cycle)

    try:
        results = sweep.run_sweep(specs, jobs=n_jobs or sweep.default_workers(len(specs)),
                                  progress=progress)
    except Exception as exc:
        if bar is not None:
            bar.close()
        # Ctrl-C inside the state store's commit can surface as the store's error on the
        # way out ("This transaction is closed"): still an interruption, not a failure.
        if _interrupted(exc):
            raise click.Abort() from KeyboardInterrupt()
        if not isinstance(exc, ValueError | OSError):
            raise
        click.echo(f"malleable simulate: error: a run failed: {exc}", err=True)
        raise click.exceptions.Exit(1) from None
    if bar is not None:
        bar.close()
    for r in results:
        click.echo(_summary_line(r["summary"], r["wall_s"]))
    _notes(line for r in results if (line := _waiting_note(r["summary"])))
    if not no_comparison:
        notes = []
        runs = sweep.collect(out, notes)
        _notes(notes)
        path = _compare(runs, out, out_dir, code=1, notes=notes)   # runs written
        others = len(runs) - len(results)
        skipped = sum(1 for n in notes if n.endswith(sweep.SKIPPED))
        click.echo(f"comparison: {path}" + (f" (with {others} earlier run(s) found in "
                                             f"{out_dir})" if others > 0 else "")
                   + (f" ({skipped} run folder(s) skipped: see the notes)" if skipped else ""))


def _notes(lines) -> None:
    for line in lines:
        click.echo(f"malleable simulate: note: {line}", err=True)


def _compare(runs: list[dict], out: Path, out_dir: str, code: int = 2,
             notes: list[str] | None = None) -> Path:
    """Write the comparison of ``runs`` (with ``notes`` of skipped run folders among its
    warnings) and note the settings they differ in; if it cannot be written, one error
    line and exit ``code``."""
    from malleable.sim import sweep

    skipped = [n for n in notes or [] if n.endswith(sweep.SKIPPED)]
    try:
        path = sweep.write_comparison(runs, out, skipped)
    except OSError as exc:
        click.echo(f"malleable simulate: error: --out {out_dir}: cannot write the "
                   f"comparison ({exc.strerror or exc})", err=True)
        raise click.exceptions.Exit(code) from None
    _notes(sweep.mixed_settings_notes(sweep.mixed_settings(runs)) + sweep.mixed_traces(runs))
    return path


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a KeyboardInterrupt was being handled."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _summary_line(s: dict, wall_s: float) -> str:
    """One run's result line; a run stopped by --max-time says so (its metrics are
    over the jobs that finished), and a metric with no data shows as "-"."""
    def num(key: str, scale: float = 1.0, digits: int = 0) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v / scale:.{digits}f}"

    stopped = "" if s.get("all_finished", True) else \
        f" [stopped at --max-time: {s['jobs'] - s['jobs_finished']} job(s) unfinished]"
    return (f"{s['workload']:>20s} {s['policy']:>8s} seed {s['seed']}: "
            f"{s['jobs_finished']}/{s['jobs']} jobs, avg JCT {num('avg_jct_s')} s, "
            f"p99 {num('p99_jct_s')} s, makespan {num('makespan_s', 3600, 1)} h "
            f"({wall_s:.1f} s wall){stopped}")


def _waiting_note(s: dict, groups: int = 3) -> str | None:
    """For a run stopped by --max-time with jobs waiting in Slurm (held or pending): which
    and why (its first ``groups`` groups of summary.json's ``unfinished_jobs``, the
    largest first); None if there is none. Jobs not submitted are noted with the
    workload, running ones need no reason."""
    from malleable.sim.loop import describe_group
    from malleable.sim.sweep import run_id

    waiting = [g for g in s.get("unfinished_jobs") or () if g.get("state") in ("held", "pending")]
    if not waiting:
        return None
    more = len(waiting) - groups
    return (f"{run_id(s['workload'], s['policy'], s['seed'])}: "
            f"{sum(g['jobs'] for g in waiting)} job(s) waiting when the run stopped: "
            + "; ".join(describe_group(g) for g in waiting[:groups])
            + (f"; {more} more group(s) in summary.json (unfinished_jobs)" if more > 0 else ""))


class _DuplicateKey(ValueError):
    """A JSON object of ``--policy-params`` names a key twice."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """`json.loads`'s ``object_pairs_hook``: the object as a dict, refusing a key given
    twice (JSON itself keeps the last, silently).

    Raises:
        _DuplicateKey: naming the key.
    """
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} given twice")
        out[key] = value
    return out


def _params(values: tuple[str, ...], policies: list[str]) -> dict[str, dict]:
    """``NAME=JSON`` options as {policy: params}; each checked by building the policy."""
    import json

    from malleable.policies.registry import get_policy

    out: dict[str, dict] = {}
    for v in values:
        name, sep, text = v.partition("=")
        name = name.strip()
        if not sep:
            raise _fail(f"--policy-params {v[:80]!r}: expected NAME=JSON for a policy of --policy")
        if name not in policies:
            raise _fail(f"--policy-params {v[:80]!r}: {name!r} is not among --policy "
                        f"({', '.join(policies)}); its parameters would be unused")
        if name in out:
            raise _fail(f"--policy-params {v[:80]!r}: parameters of {name!r} given twice (give "
                        f"them in one JSON object)")
        try:
            params = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise _fail(f"--policy-params {v[:80]!r}: {exc}") from None
        except ValueError as exc:
            raise _fail(f"--policy-params {v[:80]!r}: not JSON ({exc})") from None
        except RecursionError:
            raise _fail(f"--policy-params {v[:80]!r}: JSON nested too deeply to read "
                        f"(more than about {sys.getrecursionlimit()} levels)") from None
        if not isinstance(params, dict):
            raise _fail(f"--policy-params {v[:80]!r}: expected a JSON object")
        try:
            get_policy(name, **params)
        except (TypeError, ValueError) as exc:
            raise _fail(f"--policy-params {name}: {exc}") from None
        out[name] = params
    return out


def _read_config(path: str) -> dict:
    """The TOML of ``--config``, checked as the daemon checks it, and its [policy]
    name and params checked by building the policy."""
    from malleable.config import ConfigError, parse_config, read_config_file
    from malleable.policies.registry import get_policy

    try:
        data = read_config_file(path)
        config = parse_config(data, source=path)
    except ConfigError as exc:
        message = str(exc)
        raise _fail(f"--config {message if path in message else f'{path}: {message}'}") from None
    try:
        get_policy(config.policy.name, **dict(config.policy.params))
    except (TypeError, ValueError) as exc:
        raise _fail(f"--config {path}: [policy] name = {config.policy.name!r}, params = "
                    f"{dict(config.policy.params)}: {exc}") from None
    return data


def _check_config_params(config: dict, path: str | None, policies: list[str]) -> None:
    """--config's [policy] params belong to its [policy] name (`sweep.RunSpec.daemon_config`
    gives them to that policy's runs only): refuse them if no run is of that policy."""
    from malleable.sim.sweep import config_params_apply

    section = config.get("policy", {})
    if not section.get("params"):
        return
    if not any(config_params_apply(config, p) for p in policies):
        raise _fail(f"--config {path}: [policy] params {dict(section['params'])} are those of "
                    f"policy {section.get('name', 'default')!r}, which is not among --policy "
                    f"({', '.join(policies)}); they would be unused (give them with "
                    f"--policy-params NAME=JSON)")


def _validate(specs) -> list[int]:
    """Load every distinct (workload, seed) once and check the daemon's settings; returns
    each run's job count. Bad input raises the one-line exit 2."""
    from malleable.config import ConfigError
    from malleable.sim.traces import TraceError

    sizes: dict[tuple, int] = {}
    noted: set[tuple[str, str]] = set()   # (workload, what was noted)
    out = []
    for s in specs:
        key = (s.workload, s.seed if s.fmt in ("philly", "gavel", "auto") else 0)
        if key not in sizes:
            left_out: list[str] = []
            try:
                jobs = s.load(left_out)
            except TraceError as exc:
                raise _fail(f"--workload {exc}") from None
            except ValueError as exc:
                raise _fail(f"--workload {s.workload}: {exc}") from None
            if not jobs:
                why = "; ".join(n for n in left_out if "left out" in n)
                raise _fail(f"--workload {s.workload}: no job to simulate ("
                            + (f"the loader's filters left none: {why}" if why else
                               "the trace has none, or none is left after the loader's "
                               "filters") + ")")
            for note in left_out:
                if (s.workload, note) not in noted:
                    noted.add((s.workload, note))
                    click.echo(f"malleable simulate: note: --workload {s.workload}: {note}",
                               err=True)
            sizes[key] = len(jobs)
            total = s.nodes * s.gpus_per_node
            big = sum(1 for j in jobs if j.gpus > total)
            if big and (s.workload, "big") not in noted:
                noted.add((s.workload, "big"))
                click.echo(f"malleable simulate: note: --workload {s.workload}: {big} job(s) "
                           f"ask for more GPUs than the cluster's {total}; they run on "
                           f"{total} (jobs.csv keeps their request)", err=True)
            cpu = sum(1 for j in jobs if j.gpus == 0)
            if cpu and (s.workload, "cpu") not in noted:
                noted.add((s.workload, "cpu"))
                click.echo(f"malleable simulate: note: --workload {s.workload}: {cpu} of "
                           f"{len(jobs)} job(s) request 0 GPUs (CPU-only); they are "
                           f"simulated as rigid jobs that hold no GPU (the simulated cluster "
                           f"has GPUs only), start on arrival and run for their recorded time; "
                           f"they count in the job counts, JCT, wait and makespan metrics, not "
                           f"in the fairness metrics (ftf_rho_*: they share no GPU), and add "
                           f"nothing to gpu_utilization", err=True)
            late = sum(1 for j in jobs if j.arrival_s > s.max_time_s)
            if late and (s.workload, "late") not in noted:
                noted.add((s.workload, "late"))
                click.echo(f"malleable simulate: note: --workload {s.workload}: {late} job(s) "
                           f"arrive after --max-time ({s.max_time_s / 3600:g} h): they are "
                           f"never submitted and count as unfinished", err=True)
        try:
            s.daemon_config()
            s.options()
        except (ConfigError, ValueError) as exc:
            raise _fail(str(exc)) from None
        out.append(sizes[key])
    return out


def _check_out(out_dir: str) -> None:
    """Create ``--out`` (and its parents) and check that files can be written there,
    before any run: a run's results are written when it ends.

    Raises:
        click.exceptions.Exit: (exit 2) with a message naming ``--out`` and why.
    """
    import tempfile

    if not out_dir.strip():
        raise _fail("--out '': give a directory")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except FileExistsError:
        raise _fail(f"--out {out_dir}: exists and is not a directory") from None
    except OSError as exc:
        raise _fail(f"--out {out_dir}: cannot write there ({exc.strerror or exc})") from None


def _check_run_dirs(specs: Sequence, out_dir: str) -> None:
    """Check, before any run, that every folder and file a sweep writes can be made and
    written: each run's folder (`sweep.RunSpec.run_dir`:
    ``<out>/<workload>/<policy>/seed<N>``) with its summary.json, jobs.csv, timing.json
    and plots/, and the comparison's files. A file or folder in the way, or one the user
    may not write, used to fail that run when it ended, and the sweep with it (exit 1).

    Raises:
        click.exceptions.Exit: (exit 2) naming the run (or the comparison) and the path.
    """
    from malleable.sim import sweep

    eff = os.access in os.supports_effective_ids

    def writable(p: Path) -> bool:
        return os.access(p, os.W_OK | os.X_OK if p.is_dir() else os.W_OK, effective_ids=eff)

    def check(what: str, folder: Path, files: Sequence[str]) -> None:
        p = next((q for q in (folder, *folder.parents) if q.exists() or q.is_symlink()),
                 folder)
        if not p.is_dir():
            raise _fail(f"--out {out_dir}: {what}: {p} exists and is not a directory (move "
                        "it, or give another --out)")
        if not writable(p):
            raise _fail(f"--out {out_dir}: {what}: cannot write in {p} (not writable by "
                        "this user)")
        for name in files:
            f = folder / name
            if f.is_dir() and not name.endswith("/"):
                raise _fail(f"--out {out_dir}: {what}: {f} is a directory where a file goes "
                            "(move it, or give another --out)")
            if name.endswith("/") and (f.exists() or f.is_symlink()) and not f.is_dir():
                raise _fail(f"--out {out_dir}: {what}: {f} exists and is not a directory "
                            "(move it, or give another --out)")
            if f.exists() and not writable(f):
                raise _fail(f"--out {out_dir}: {what}: cannot write {f} (not writable by "
                            "this user)")

    plots = [f"plots/{n}" for n in sweep.PLOT_FILES]
    for spec in specs:
        check(f"run {spec.run_id}", spec.run_dir,
              [sweep.SUMMARY, "jobs.csv", "timing.json", "plots/", *plots])
    out = Path(out_dir)
    check("the comparison", out, ["comparison.json", "jct_cdf.png"])
    for name in sorted({spec.name for spec in specs}):
        check("the comparison", out / name, ["jct_cdf.png"])


def _common_args(policy_params, nodes, gpn, interval, restart_cost, fmt, load_scale, window_days, map_models,
                 job_setup, oracle_work, config_path, max_time_h, no_plots) -> list[str]:
    args = [a for pp in policy_params for a in ("--policy-params", pp)]
    args += ["--nodes", str(nodes), "--gpus-per-node", str(gpn), "--format", fmt,
             "--load-scale", repr(load_scale), "--job-setup", job_setup,
             "--max-time", repr(max_time_h)]
    if interval is not None:
        args += ["--interval", repr(interval)]
    if restart_cost is not None:
        args += ["--restart-cost", repr(restart_cost)]
    if window_days is not None:
        args += ["--window", repr(window_days)]
    if map_models:
        args.append("--map-models")
    if oracle_work is not None:
        args.append("--oracle-work" if oracle_work else "--no-oracle-work")
    if config_path is not None:
        args += ["--config", str(Path(config_path).resolve())]
    if no_plots:
        args.append("--no-plots")
    return args
