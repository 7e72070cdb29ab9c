"""A sweep of simulated runs: one per (workload, policy, seed), in parallel processes.

`RunSpec` says everything one run needs (it is pickled to a worker process);
`run_one` runs it and writes its directory::

    <out>/<workload>/<policy>/seed<N>/summary.json   metrics and counters (deterministic)
                                      jobs.csv       one row per job
                                      timing.json    wall time of the run and its cycles
                                      plots/jct_cdf.png, gpus_per_job.png, utilization.png

`run_sweep` runs many with `concurrent.futures.ProcessPoolExecutor`, reporting
progress (jobs ended over all runs) to a callback; `collect` reads the run folders
found under ``<out>`` (skipping, with a note, one that is not what `write_run`
writes: `read_run`); `write_comparison` writes ``<out>/comparison.json`` (per
run, the mean per policy over workloads and seeds, and the settings in which the
runs differ: `mixed_settings`) and ``<out>/jct_cdf.png`` (one curve per policy,
all runs' jobs), plus one CDF per workload. `replaced_runs` says which run
folders a sweep would overwrite that hold a run of other settings.
`write_slurm_array` writes an sbatch job-array script that runs the same sweep on
a cluster, one array task per run, and a second script that builds the comparison
once the array has finished.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from malleable.config import Config, parse_config
from malleable.sim.jobsetup import setup_for
from malleable.sim.loop import DEFAULT_MAX_TIME_S, SimOptions, SimResult, run_simulation
from malleable.sim.metrics import write_jobs_csv, write_summary
from malleable.sim.traces import TraceError
from malleable.sim.workloads import detect_format, load_workload

SUMMARY = "summary.json"
#: How `collect`'s note on a skipped run folder ends.
SKIPPED = ": run folder skipped (not compared)"


@dataclass(frozen=True)
class RunSpec:
    """One simulated run (picklable).

    Attributes:
        workload: path of the trace file; name: its short name (output folder).
        fmt: trace format or "auto".
        policy: policy name; seed: the run's seed.
        params: the policy's parameters (``policy.params``; None: the config's).
        out_dir: the sweep's output root.
        nodes, gpus_per_node: the cluster.
        interval_s: the daemon's decide interval (``daemon.decide_interval_s``), s;
            None: the one in ``config`` (the daemon's default, 60 s, if none).
        restart_cost_s: every job's restart cost (None: per model).
        load_scale: arrivals divided by this.
        job_setup: `malleable.sim.jobsetup.setup_for` name; oracle_work overrides it.
        window_days: keep the busiest fitting window of that many days (None: all).
        gpu_time_classes: map SWF/sacct GPU jobs to models.
        config: the daemon's settings as a TOML-like dict (sections and keys of
            `malleable.config.Config`); policy name (and ``interval_s`` if given) set
            from above.
        max_time_s: stop simulating at this virtual time.
        plots: write the per-run plots.
    """

    workload: str
    name: str
    policy: str
    seed: int
    out_dir: str
    fmt: str = "auto"
    params: dict | None = None
    nodes: int = 16
    gpus_per_node: int = 4
    interval_s: float | None = None
    restart_cost_s: float | None = None
    load_scale: float = 1.0
    job_setup: str = "auto"
    oracle_work: bool | None = None
    window_days: float | None = None
    gpu_time_classes: bool = False
    config: dict = field(default_factory=dict)
    max_time_s: float = DEFAULT_MAX_TIME_S
    plots: bool = True

    @property
    def run_id(self) -> str:
        """``<workload>/<policy>/seed<N>``: the run's folder under ``--out``."""
        return run_id(self.name, self.policy, self.seed)

    @property
    def run_dir(self) -> Path:
        """``<out>/<workload>/<policy>/seed<N>``."""
        return Path(self.out_dir) / self.run_id

    def daemon_config(self) -> Config:
        """The daemon's `Config` for this run.

        ``config``'s [policy] params are kept only for a run of its [policy] name
        (default "default"): they are that policy's parameters.

        Raises:
            malleable.config.ConfigError: a bad key or value in ``config``.
            ValueError: an unknown policy name.
        """
        data = {k: dict(v) for k, v in self.config.items()}
        section = data.setdefault("policy", {})
        if not config_params_apply(self.config, self.policy):
            section.pop("params", None)
        section["name"] = self.policy
        if self.params is not None:
            section["params"] = dict(self.params)
        if self.interval_s is not None:
            data.setdefault("daemon", {})["decide_interval_s"] = float(self.interval_s)
        return parse_config(data, source="simulate")

    def options(self) -> SimOptions:
        """The simulation's `SimOptions`.

        Raises:
            ValueError: a bad option.
        """
        return SimOptions(nodes=self.nodes, gpus_per_node=self.gpus_per_node, seed=self.seed,
                          restart_cost_s=self.restart_cost_s,
                          setup=setup_for(self.policy, self.job_setup, self.oracle_work),
                          max_time_s=self.max_time_s)

    def load(self, notes: list[str] | None = None):
        """The run's trace (`malleable.sim.workloads.load_workload`; ``notes`` gets its
        notes on rows left out).

        Raises:
            TraceError, ValueError: as `load_workload`.
        """
        return load_workload(self.workload, self.fmt, seed=self.seed,
                             load_scale=self.load_scale, window_days=self.window_days,
                             capacity_gpus=self.nodes * self.gpus_per_node,
                             gpus_per_node=self.gpus_per_node,
                             gpu_time_classes=self.gpu_time_classes, notes=notes)

    def trace_format(self) -> str:
        """The trace format the run reads: ``fmt``, or the detected one for "auto"
        ("auto" when the file cannot be read now, e.g. a summary written elsewhere)."""
        if self.fmt != "auto":
            return self.fmt
        try:
            return detect_format(self.workload)
        except TraceError:
            return "auto"

    def metadata(self) -> dict:
        """What the run was (goes into summary.json; no paths, so it is portable: the
        trace file is identified by its SHA-256, ``workload_sha256``)."""
        config = self.daemon_config()
        return {"workload": self.name, "workload_sha256": trace_sha256(self.workload),
                "policy": self.policy, "seed": self.seed,
                "policy_params": dict(config.policy.params),
                "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "interval_s": float(config.daemon.decide_interval_s),
                "restart_cost_s": self.restart_cost_s,
                "load_scale": float(self.load_scale), "job_setup": self.job_setup,
                "window_days": self.window_days, "format": self.trace_format(),
                "map_models": bool(self.gpu_time_classes), "oracle_work": self.oracle_work,
                "max_time_s": float(self.max_time_s),
                # The daemon settings that change decisions (from --config or defaults).
                "settings": {
                    "min_gain": float(config.policy.min_gain),
                    "cooldown_s": float(config.policy.cooldown_s),
                    "min_run_restarts": float(config.policy.min_run_restarts),
                    "default_restart_cost_s": float(config.policy.default_restart_cost_s),
                    "queue_depth": int(config.policy.queue_depth),
                    "poll_interval_s": float(config.daemon.poll_interval_s),
                    "ingest_interval_s": float(config.daemon.ingest_interval_s),
                    "max_concurrent_requeues": int(config.daemon.max_concurrent_requeues),
                    "requeue_backoff_s": float(config.daemon.requeue_backoff_s)}}


def config_params_apply(config: dict, policy: str) -> bool:
    """Whether a daemon TOML's [policy] params are ``policy``'s: they are those of its
    [policy] name (default "default", aliases resolved), and another policy's run drops
    them (`RunSpec.daemon_config`).

    Raises:
        ValueError: an unknown policy name.
    """
    from malleable.policies.registry import policy_class

    owner = str(config.get("policy", {}).get("name", "default"))
    return policy_class(owner) is policy_class(policy)


def run_one(spec: RunSpec, report: Callable[[float, int, int], None] | None = None) -> dict:
    """Run ``spec`` and write its directory (see the module docstring).

    Returns:
        ``{"spec": ..., "summary": ..., "jcts": [...], "wall_s": ..., "sim_s": ...}``.

    Raises:
        TraceError, ValueError, ConfigError: bad input. OSError: outputs not writable.
    """
    jobs = spec.load()
    config = spec.daemon_config()
    result = run_simulation(jobs, config, spec.options(), progress=report)
    write_run(spec, result)
    return {"spec": dataclasses.asdict(spec), "summary": _run_summary(spec, result),
            "jcts": [o.jct_s for o in result.outcomes if o.jct_s is not None],
            "wall_s": result.wall_s, "sim_s": result.sim_s}


def _run_summary(spec: RunSpec, result: SimResult) -> dict:
    return {**spec.metadata(), **result.summary}


PLOT_FILES = ("jct_cdf.png", "gpus_per_job.png", "utilization.png")   # in <run>/plots/


def write_run(spec: RunSpec, result: SimResult) -> Path:
    """Write summary.json, jobs.csv, timing.json and the plots of one run (replacing
    those of an earlier run in its folder: a plot this run does not draw is removed)."""
    d = spec.run_dir
    d.mkdir(parents=True, exist_ok=True)
    total = spec.nodes * spec.gpus_per_node
    write_summary(_run_summary(spec, result), d / SUMMARY)
    write_jobs_csv(result.outcomes, total, d / "jobs.csv")
    c = result.cycles
    timing = {"wall_s": round(result.wall_s, 3), "sim_s": round(result.sim_s, 3),
              "cycles": {"poll": c.polls, "ingest": c.ingests, "decide": c.decides,
                         "housekeeping": c.housekeeping, "skipped_poll": c.skipped_polls,
                         "skipped_ingest": c.skipped_ingests},
              "cycle_wall_s": {k: round(v, 3) for k, v in sorted(c.wall_s.items())}}
    (d / "timing.json").write_text(json.dumps(timing, indent=2, sort_keys=True) + "\n",
                                   encoding="utf-8")
    pd = d / "plots"
    for name in PLOT_FILES:   # an earlier run's plots in this folder are not this run's
        (pd / name).unlink(missing_ok=True)
    if spec.plots:
        from malleable.sim import plots

        pd.mkdir(exist_ok=True)
        jcts = [o.jct_s for o in result.outcomes if o.jct_s is not None]
        if jcts:
            plots.plot_jct_cdf({spec.policy: jcts}, pd / "jct_cdf.png",
                               title=f"JCT: {spec.name}, {spec.policy}, seed {spec.seed}")
        if result.allocation_log:
            plots.plot_gpus_per_job(result.allocation_log, pd / "gpus_per_job.png",
                                    total_gpus=total,
                                    title=f"GPUs per job: {spec.name}, {spec.policy}")
        t, u = result.timeline
        if len(t):
            plots.plot_utilization(t, u, total, pd / "utilization.png",
                                   title=f"GPU allocation: {spec.name}, {spec.policy}")
    return d


# ----------------------------------------------------------------------------- parallel

_QUEUE = None


def _init_worker(queue) -> None:
    global _QUEUE
    _QUEUE = queue
    import logging

    logging.getLogger("malleable").setLevel(logging.ERROR)


def _worker(index: int, spec: RunSpec) -> dict:
    queue = _QUEUE
    last = [0.0]

    def report(now: float, ended: int, total: int) -> None:
        t = time.monotonic()
        if queue is not None and (t - last[0] > 0.5 or ended == total):
            last[0] = t
            queue.put((index, ended, total, now))

    return run_one(spec, report)


def default_workers(runs: int) -> int:
    """Worker processes for a sweep of ``runs`` runs when none is asked for: one per CPU
    core this process may use (its affinity mask, as a Slurm allocation sets it), at
    most one per run, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, runs))


def run_sweep(specs: Sequence[RunSpec], *, jobs: int = 1,
              progress: Callable[[int, int, int, float], None] | None = None) -> list[dict]:
    """Run every spec, ``jobs`` at a time in worker processes (1: in this process).

    Args:
        specs: the runs.
        jobs: parallel worker processes.
        progress: called with (run index, jobs ended, jobs in the run, virtual s) as
            runs advance.

    Returns:
        `run_one`'s result of each spec, in the order given.

    Raises:
        Whatever a run raised (the first failure, after the others were cancelled).
    """
    if jobs <= 1 or len(specs) <= 1:
        out = []
        for i, s in enumerate(specs):
            def report(now: float, ended: int, total: int, i: int = i) -> None:
                if progress is not None:
                    progress(i, ended, total, now)
            out.append(run_one(s, report))
        return out
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    try:
        queue = manager.Queue()
        results: dict[int, dict] = {}
        with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=ctx,
                                 initializer=_init_worker, initargs=(queue,)) as pool:
            futures = {pool.submit(_worker, i, s): i for i, s in enumerate(specs)}
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                    _drain(queue, progress)
                    for f in done:
                        results[futures[f]] = f.result()
            except BaseException:
                for f in pending:
                    f.cancel()
                raise
            _drain(queue, progress)
        return [results[i] for i in range(len(specs))]
    finally:
        manager.shutdown()


def _drain(queue, progress) -> None:
    while True:
        try:
            item = queue.get_nowait()
        except Exception:  # queue.Empty through the manager's proxy
            return
        if progress is not None:
            progress(*item)


# ----------------------------------------------------------------------------- comparison


def collect(out_dir: str | Path, notes: list[str] | None = None) -> list[dict]:
    """Every valid run under ``out_dir``: its summary.json, the JCTs of its jobs.csv and
    the wall time of its timing.json (None if absent).

    A run folder whose summary.json or jobs.csv is unreadable or not what `write_run`
    writes (`read_run` says what is checked) is skipped, and a bad timing.json is
    ignored (wall time None); each with a one-line note naming the file and what is
    wrong, appended to ``notes`` (logged as a warning when ``notes`` is None).
    """
    import logging

    def note(text: str) -> None:
        if notes is None:
            logging.getLogger(__name__).warning("%s", text)
        else:
            notes.append(text)

    runs = []
    for path in sorted(Path(out_dir).glob(f"*/*/seed*/{SUMMARY}")):
        try:
            run = read_run(path)
        except RunFolderError as exc:
            note(f"{exc}{SKIPPED}")
            continue
        timing = path.parent / "timing.json"
        if timing.exists():
            try:
                wall = _read_json(timing)
                wall = wall.get("wall_s") if isinstance(wall, dict) else None
                if not _number(wall):
                    raise RunFolderError(timing, "no wall_s number")
                run["wall_s"] = float(wall)
            except RunFolderError as exc:
                note(f"{exc}: wall time unknown (the run is compared)")
        runs.append(run)
    return runs


class RunFolderError(ValueError):
    """A run folder's file is unreadable or not what `write_run` writes; the message
    names the file (and line), the field and value where there is one, and what is
    wrong.

    Attributes: path (with ``:line`` where there is one), problem (the rest).
    """

    def __init__(self, path: str | Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


def _read_json(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RunFolderError(path, "not UTF-8 text") from None
    except OSError as exc:
        raise RunFolderError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:   # also a number too long, nesting too deep
        msg = f"{exc.msg} at line {exc.lineno} column {exc.colno}" \
            if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise RunFolderError(path, f"not valid JSON ({msg})") from None


def _number(v: object) -> bool:
    """A finite JSON number (not a boolean)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_summary(summary: object, path: Path) -> dict:
    """``summary`` (summary.json at ``path``, in ``<workload>/<policy>/seed<N>/``) if it
    has what the comparison reads: ``workload`` and ``policy`` non-empty strings naming
    its folders, ``seed`` an integer >= 0 naming its folder, ``jobs`` and
    ``jobs_finished`` integers >= 0 (finished <= jobs), ``all_finished`` a boolean,
    each compared metric absent, null or a finite number, and no NaN or infinity in
    the settings compared between runs (`RUN_SETTINGS`, ``policy_params``).

    Raises:
        RunFolderError: naming the file, the field and its value.
    """
    if not isinstance(summary, dict):
        raise RunFolderError(path, f"expected a JSON object, got {type(summary).__name__}")

    def bad(key: str, problem: str) -> RunFolderError:
        shown = json.dumps(summary[key]) if key in summary else "missing"
        return RunFolderError(path, f"field {key}={shown[:60]}: {problem}")

    for key in ("workload", "policy"):
        if not isinstance(summary.get(key), str) or not summary[key]:
            raise bad(key, "expected a non-empty string")
    for key in ("seed", "jobs", "jobs_finished"):
        if not _count(summary.get(key)):
            raise bad(key, "expected an integer >= 0")
    if summary["jobs_finished"] > summary["jobs"]:
        raise bad("jobs_finished", f"more than jobs ({summary['jobs']})")
    if not isinstance(summary.get("all_finished"), bool):
        raise bad("all_finished", "expected true or false")
    for key in _COMPARED:
        v = summary.get(key)
        if v is not None and not _number(v):
            raise bad(key, "expected a finite number or null")
    for key in (*RUN_SETTINGS, "policy_params"):   # compared between runs (mixed_settings)
        try:
            json.dumps(summary.get(key), allow_nan=False)
        except ValueError:
            raise bad(key, "holds a number that is not finite") from None
    folder = (path.parent.parent.parent.name, path.parent.parent.name, path.parent.name)
    said = (summary["workload"], summary["policy"], f"seed{summary['seed']}")
    if folder != said:
        raise RunFolderError(path, f"it is the run {'/'.join(said)}, not that of its "
                             f"folder {'/'.join(folder)} (a copied or renamed run folder)")
    return summary


def read_run(path: str | Path) -> dict:
    """One run folder from its summary.json ``path``: ``{"summary", "jcts", "wall_s"}``
    (wall_s None: `collect` reads timing.json). The summary is checked
    (`check_summary`); jobs.csv, if present, must have a ``jct_s`` column whose
    cells are empty (unfinished) or finite numbers.

    Raises:
        RunFolderError: naming the file and what is wrong.
    """
    import csv

    path = Path(path)
    summary = check_summary(_read_json(path), path)
    jcts: list[float] = []
    jobs_csv = path.parent / "jobs.csv"
    if jobs_csv.exists():
        try:
            with jobs_csv.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if "jct_s" not in (reader.fieldnames or []):
                    raise RunFolderError(f"{jobs_csv}:1", "no jct_s column")
                for row in reader:
                    raw = row.get("jct_s")
                    if raw == "":
                        continue
                    try:
                        v = float(raw)  # type: ignore[arg-type]
                        if not math.isfinite(v):
                            raise ValueError
                    except (TypeError, ValueError):
                        raise RunFolderError(f"{jobs_csv}:{reader.line_num}",
                                             f"field jct_s={raw!r}: not a finite number") from None
                    jcts.append(v)
        except UnicodeDecodeError:
            raise RunFolderError(jobs_csv, "not UTF-8 text") from None
        except csv.Error as exc:
            raise RunFolderError(jobs_csv, f"not a CSV file ({exc})") from None
        except OSError as exc:
            raise RunFolderError(jobs_csv, f"cannot read ({exc.strerror or exc})") from None
    return {"summary": summary, "jcts": jcts, "wall_s": None}


#: What a run was (summary.json, `RunSpec.metadata`) that must be the same for runs
#: compared together: the cluster, the decide interval, the restart cost, the load, the
#: job setup and window, the trace format, --map-models, --oracle-work, --max-time, and
#: every daemon setting under ``settings``. A policy's
#: ``policy_params`` must be the same over that policy's runs.
RUN_SETTINGS = ("nodes", "gpus_per_node", "interval_s", "restart_cost_s", "load_scale",
                "job_setup", "window_days", "format", "map_models", "oracle_work",
                "max_time_s", "settings")

_UNRECORDED = "(not recorded)"


def run_settings(summary: dict) -> dict[str, str]:
    """A run's `RUN_SETTINGS` and ``policy_params`` from its summary, each as its JSON
    text (``settings`` one entry per daemon setting, ``settings.<name>``); a setting the
    summary lacks is ``"(not recorded)"``."""
    out = {}
    for key in (*RUN_SETTINGS, "policy_params"):
        v = summary.get(key, _UNRECORDED)
        if key == "settings" and isinstance(v, dict):
            out.update({f"settings.{k}": json.dumps(x, sort_keys=True) for k, x in v.items()})
        else:
            out[key] = v if v is _UNRECORDED else json.dumps(v, sort_keys=True)
    return out


def trace_sha256(path: str | Path) -> str | None:
    """The SHA-256 (hex) of a trace file's bytes, None if it cannot be read now. Cached
    by path, size and modification time (a sweep asks once per run)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def mixed_traces(runs: Sequence[dict]) -> list[str]:
    """Warnings for runs compared under one workload name that read different trace files
    (``workload_sha256`` of their summaries; runs that did not record it are left out):
    one line per such workload, naming each file's runs."""
    by_name: dict[str, dict[str, list[str]]] = {}
    for r in runs:
        s = r["summary"]
        sha = s.get("workload_sha256")
        if isinstance(sha, str):
            by_name.setdefault(s["workload"], {}).setdefault(sha, []).append(_run_id(s))
    out = []
    for name, shas in sorted(by_name.items()):
        if len(shas) > 1:
            files = "; ".join(f"sha256 {sha[:12]} in {_some(sorted(ids))}"
                              for sha, ids in sorted(shas.items(), key=lambda kv: kv[0]))
            out.append(f"comparison.json mixes runs of workload {name!r} made from different "
                       f"trace files (same name, other contents): {files}")
    return out


def run_id(workload: str, policy: str, seed: int) -> str:
    """``<workload>/<policy>/seed<N>``: a run's folder under ``--out`` (`RunSpec.run_dir`)
    and its name in notes."""
    return f"{workload}/{policy}/seed{seed}"


def _run_id(summary: dict) -> str:
    return run_id(summary["workload"], summary["policy"], summary["seed"])


def mixed_settings(runs: Sequence[dict]) -> list[dict]:
    """The settings (`run_settings`) in which runs compared together differ: one entry
    per setting, ``{"setting", "policy" (None, or the policy whose runs differ in
    policy_params), "values": [{"value": the setting's value or "(not recorded)",
    "runs": [<workload>/<policy>/seed<N>, ...]}, ...]}`` (the most common value first),
    sorted by setting; [] when every run agrees."""
    groups: dict[tuple[str, str | None], dict[str, list[str]]] = {}
    per = [(r["summary"], run_settings(r["summary"])) for r in runs]
    keys = sorted({k for _, s in per for k in s})
    for s, settings in per:
        for k in keys:
            pol = s["policy"] if k == "policy_params" else None
            groups.setdefault((k, pol), {}).setdefault(settings.get(k, _UNRECORDED),
                                                      []).append(_run_id(s))
    out = []
    for (k, pol), values in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if len(values) > 1:
            out.append({"setting": k, "policy": pol,
                        "values": [{"value": v if v == _UNRECORDED else json.loads(v),
                                    "runs": sorted(ids)}
                                   for v, ids in sorted(values.items(),
                                                        key=lambda kv: (-len(kv[1]), kv[0]))]})
    return out


def _some(ids: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _text(value: object) -> str:
    return value if value == _UNRECORDED else json.dumps(value, sort_keys=True)


def mixed_settings_notes(mixed: Sequence[dict]) -> list[str]:
    """One line per `mixed_settings` entry, naming the setting and its values."""
    lines = []
    for m in mixed:
        whose = f"runs of policy {m['policy']}" if m["policy"] else "runs"
        vals = "; ".join(f"{_text(v['value'])} ({len(v['runs'])} run(s): {_some(v['runs'])})"
                         for v in m["values"])
        lines.append(f"comparison.json mixes {whose} made with different {m['setting']}: "
                     f"{vals}")
    return lines


def replaced_runs(specs: Sequence[RunSpec]) -> list[str]:
    """Notes on the run folders that ``specs`` will overwrite which hold a run made with
    other settings (`run_settings`) or an unusable one: one line per kind of
    difference, naming the folders (at most 3, then how many more).

    Raises:
        malleable.config.ConfigError, ValueError: as `RunSpec.metadata`.
    """
    found: dict[str, list[str]] = {}
    for spec in specs:
        path = spec.run_dir / SUMMARY
        if not path.exists():
            continue
        rid = spec.run_id
        try:
            summary = check_summary(_read_json(path), path)
        except RunFolderError as exc:
            found.setdefault(f"whose {SUMMARY} is unusable ({exc.problem})", []).append(rid)
            continue
        meta = spec.metadata()
        old, new = run_settings(summary), run_settings(meta)
        diff = [f"{k}={old.get(k, _UNRECORDED)} (now {v})" for k, v in sorted(new.items())
                if old.get(k, _UNRECORDED) != v]
        old_sha = summary.get("workload_sha256")
        if isinstance(old_sha, str) and meta["workload_sha256"] not in (None, old_sha):
            diff.append("another trace file of the same name")
        if diff:
            found.setdefault(f"made with other settings: {', '.join(diff)}", []).append(rid)
    return [f"--out {specs[0].out_dir}: this sweep replaces {_some(ids)} ({len(ids)} run "
            f"folder(s)), {what}" for what, ids in found.items()]


_COMPARED = ("avg_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization",
             "restarts_per_job", "ftf_rho_avg")


def write_comparison(runs: Sequence[dict], out_dir: str | Path,
                     skipped: Sequence[str] = ()) -> Path:
    """``comparison.json`` and the JCT CDF plots (see the module docstring).

    ``runs`` as `collect` returns them (checked by `read_run`). comparison.json also
    has ``mixed_settings`` (`mixed_settings`) and ``warnings``: one line per mixed
    setting (`mixed_settings_notes`), per workload made from different trace files
    (`mixed_traces`), and ``skipped``, `collect`'s notes on run folders it skipped.

    Returns:
        The path of comparison.json.
    """
    from malleable.sim import plots

    out = Path(out_dir)
    per_run = []
    by_policy: dict[str, list[dict]] = {}
    jcts_all: dict[str, list[float]] = {}
    jcts_wl: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        s = r["summary"]
        row = {k: s.get(k) for k in ("workload", "policy", "seed", "jobs", "jobs_finished",
                                     "all_finished", *_COMPARED)}
        per_run.append(row)
        by_policy.setdefault(s["policy"], []).append(row)
        jcts_all.setdefault(s["policy"], []).extend(r["jcts"])
        jcts_wl.setdefault(s["workload"], {}).setdefault(s["policy"], []).extend(r["jcts"])
    per_run.sort(key=lambda r: (r["workload"], r["policy"], r["seed"]))
    means = {}
    for pol, rows in sorted(by_policy.items()):
        means[pol] = {"runs": len(rows),
                      "incomplete_runs": sum(1 for r in rows if r.get("all_finished") is False)}
        for k in _COMPARED:
            vals = [float(r[k]) for r in rows if r.get(k) is not None]
            means[pol][f"mean_{k}"] = round(sum(vals) / len(vals), 3) if vals else None
    mixed = mixed_settings(runs)
    doc = {"runs": per_run, "by_policy": means,
           "mixed_settings": mixed,
           "warnings": mixed_settings_notes(mixed) + mixed_traces(runs) + list(skipped),
           "note": "mean_* are means over runs (workloads x seeds) of each run's metric "
                   "(null: no run has it); a run that stopped at --max-time "
                   "(incomplete_runs, all_finished false) has metrics over its finished "
                   "jobs only; mixed_settings lists the settings (cluster, interval, "
                   "restart cost, daemon settings, a policy's params) in which the runs "
                   "compared differ, with the runs of each value ([]: none)"}
    path = out / "comparison.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if any(jcts_all.values()):
        plots.plot_jct_cdf(jcts_all, out / "jct_cdf.png", title="JCT, all workloads")
    for wl, d in sorted(jcts_wl.items()):
        if any(d.values()):
            plots.plot_jct_cdf(d, out / wl / "jct_cdf.png", title=f"JCT, {wl}")
    return path


# ----------------------------------------------------------------------------- Slurm array


def write_slurm_array(workloads: Sequence[str], policies: Sequence[str], seeds: Sequence[int],
                      common_args: Sequence[str], out_dir: str | Path, *,
                      python: str | None = None) -> tuple[Path, Path]:
    """An sbatch job-array script running the sweep, one task per (workload, policy, seed).

    Task ``i`` runs ``malleable simulate`` with workload ``i // (P*S)``, policy
    ``(i // S) % P`` and seed ``i % S`` and the ``common_args`` (cluster, interval,
    ...), writing its run directory under ``out_dir`` without a comparison; the
    second script builds the comparison (``--compare-only``). Every value is
    shell-quoted, and a task passes its trace with ``--workload-path``, which takes
    the path whole (``--workload`` would split one with a comma into two).

    Returns:
        ``(array script, comparison script)`` paths.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = python or sys.executable
    n = len(workloads) * len(policies) * len(seeds)
    q = shlex.quote

    def arr(values) -> str:
        return " ".join(q(str(v)) for v in values)

    common = " ".join(q(a) for a in common_args)
    # In --output Slurm replaces %j, %A, ... ("%%" is a "%"): a "%" of the folder stays one.
    slurm_path = str(out).replace("%", "%%")
    array = out / "simulate-array.sbatch"
    array.write_text(f"""#!/bin/bash
# One simulated run per array task: {len(workloads)} workload(s) x {len(policies)} policy(ies)
# x {len(seeds)} seed(s) = {n} tasks. Written by `malleable simulate --slurm-array`.
#SBATCH --job-name=malleable-simulate
#SBATCH --array=0-{n - 1}
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --output={q(slurm_path)}/slurm-%A_%a.out
set -euo pipefail
WORKLOADS=({arr(workloads)})
POLICIES=({arr(policies)})
SEEDS=({arr(seeds)})
i=${{SLURM_ARRAY_TASK_ID:?run me with sbatch}}
P=${{#POLICIES[@]}}; S=${{#SEEDS[@]}}
w=$(( i / (P * S) )); p=$(( (i / S) % P )); s=$(( i % S ))
exec {q(py)} -m malleable simulate --workload-path "${{WORKLOADS[$w]}}" --policy "${{POLICIES[$p]}}" \\
    --seed "${{SEEDS[$s]}}" --sweep-policies {q(",".join(policies))} --jobs 1 --no-comparison \\
    --no-progress --out {q(str(out))} {common}
""", encoding="utf-8")
    compare = out / "simulate-compare.sbatch"
    compare.write_text(f"""#!/bin/bash
# Builds comparison.json and the JCT CDF plots once every array task has finished.
#SBATCH --job-name=malleable-compare
#SBATCH --ntasks=1
#SBATCH --output={q(slurm_path)}/slurm-compare-%j.out
set -euo pipefail
exec {q(py)} -m malleable simulate --compare-only --out {q(str(out))}
""", encoding="utf-8")
    for p in (array, compare):
        os.chmod(p, 0o755)
    return array, compare


def submit_hint(array: Path, compare: Path) -> str:
    """How to submit the two scripts (printed by the command)."""
    return (f"jid=$(sbatch --parsable {shlex.quote(str(array))}) && "
            f"sbatch --dependency=afterany:${{jid%%;*}} {shlex.quote(str(compare))}")

