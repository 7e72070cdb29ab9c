"""The JSON schemas of the admin commands' ``--json`` output (JSON Schema 2020-12).

Every document has a ``schema`` key, ``"malleable.<name>/<version>"``. The
version is bumped when a key is removed or renamed or changes its type or
meaning; new keys may be added within a version, so consumers must ignore
keys they do not know. (The schemas below list every key the current
version emits, with ``additionalProperties: false``, so that the tests catch
an undocumented key.) docs/cli-json.md is rendered from these dicts by
`markdown` (``python -m malleable.ops.docgen``); a test checks that the file
is current and that every command's output validates.
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------- building blocks


def _t(types: str | list[str], desc: str, **kw: Any) -> dict:
    return {"type": types, "description": desc, **kw}


def _null(types: str, desc: str, **kw: Any) -> dict:
    return _t([types, "null"], desc, **kw)


def _time(desc: str, nullable: bool = True) -> dict:
    t: Any = ["string", "null"] if nullable else "string"
    return {"type": t, "format": "date-time", "description": desc + " (ISO 8601, UTC)"}


def _obj(desc: str, props: dict[str, dict], *, nullable: bool = False) -> dict:
    return {"type": ["object", "null"] if nullable else "object", "description": desc,
            "properties": props, "required": list(props), "additionalProperties": False}


def _arr(desc: str, items: dict) -> dict:
    return {"type": "array", "description": desc, "items": items}


def _ref(name: str, desc: str, *, nullable: bool = False) -> dict:
    if nullable:
        return {"description": desc, "anyOf": [{"$ref": f"#/$defs/{name}"}, {"type": "null"}]}
    return {"description": desc, "$ref": f"#/$defs/{name}"}


def _free(desc: str, nullable: bool = False) -> dict:
    return {"type": ["object", "null"] if nullable else "object", "description": desc}


def _schema(name: str, title: str, desc: str, props: dict[str, dict], defs: dict | None = None
            ) -> dict:
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": name,
           "title": title, "description": desc, "type": "object",
           "properties": {"schema": {"const": name, "description": "this document's schema"},
                          **props},
           "required": ["schema", *props], "additionalProperties": False}
    if defs:
        out["$defs"] = defs
    return out


# ---------------------------------------------------------------- shared objects

ACTION = _obj("an action: a change the daemon makes to one job, recorded before it runs", {
    "id": _t("integer", "the action's id"),
    "job_id": _null("string", "the Slurm job id"),
    "decision_id": _null("integer", "the decision that asked for it (null: e.g. a release "
                                    "when paused or stopping)"),
    "kind": _t("string", "hold, admit (resize a pending job and release it), shrink (in place) "
                         "or requeue (checkpoint-requeue at a new size)"),
    "state": _t("string", "the step of its state machine (hold, resize, release, shrink, "
                          "signal, wait_checkpoint, requeue_hold, start_now, observe) or how "
                          "it ended (done, abandoned, failed)"),
    "finished": _t("boolean", "it reached a terminal step (done, abandoned, failed)"),
    "from_gpus": _null("integer", "GPUs before"),
    "to_gpus": _t("integer", "GPUs after (0: held, not running)"),
    "from_nodes": _null("integer", "nodes before"),
    "to_nodes": _null("integer", "nodes after"),
    "attempts": _t("integer", "Slurm calls tried for the current step"),
    "created_at": _time("when it was recorded", nullable=False),
    "updated_at": _time("its last change", nullable=False),
    "finished_at": _time("when it ended (null: in flight)"),
    "next_attempt_at": _time("not retried before this time (back-off)"),
    "signalled_at": _time("when the checkpoint signal was sent (requeue)"),
    "last_error": _null("string", "Slurm's last refusal, if any"),
    "note": _null("string", "what the daemon noted (e.g. why it was abandoned)"),
})

POLICY = _obj("the active policy", {
    "name": _t("string", "policy name as set (see `malleable policy list`)"),
    "resolved": _t("string", "the policy `default` stands for, else the name"),
    "params": _free("its parameters as set (others take the policy's defaults)"),
    "source": _t("string", "`operator`: set with `malleable policy set` (stored in the "
                           "database); `config`: `[policy]` of the configuration",
                 enum=["operator", "config"]),
})

SAMPLE = _obj("one stored progress line", {
    "time": _time("when the job wrote it", nullable=False),
    "step": _t("integer", "optimizer steps done"),
    "samples": _t("integer", "training samples processed in total"),
    "gpus": _t("integer", "GPUs the job ran on"),
    "nodes": _null("integer", "nodes it ran on"),
    "batch_size": _t("integer", "global batch size"),
    "metric": _null("number", "the job's metric, if it logs one"),
    "restart": _null("integer", "the run (Slurm restart count) it belongs to"),
}, nullable=True)

# ---------------------------------------------------------------- documents

STATUS = _schema("malleable.status/1", "malleable status",
                 "The daemon's health, policy and the malleable jobs.", {
    "generated_at": _time("when the command ran", nullable=False),
    "database": _t("string", "the database read (path, or URL without password)"),
    "daemon": _obj("the daemon's health, from its lease", {
        "health": _t("string", "`healthy`: a holder whose heartbeat is within the lease "
                               "timeout; `stale`: a holder whose heartbeat is older (dead or "
                               "hung) or whose process on this host is gone; `absent`: no "
                               "holder (no daemon running)",
                     enum=["healthy", "stale", "absent"]),
        "holder": _null("string", "the daemon holding the lease, \"host:pid\""),
        "holder_gone": _t("boolean", "the holder names this host and a process that no "
                          "longer exists (health is then `stale`)"),
        "acquired_at": _time("when it took the lease"),
        "heartbeat_at": _time("its last heartbeat"),
        "heartbeat_age_s": _null("number", "seconds since the last heartbeat"),
        "lease_timeout_s": _t("number", "the lease timeout applied, seconds: the larger of "
                              "`[daemon] lease_timeout_s` and the holder's own"),
    }),
    "policy": _ref("policy", "the active policy"),
    "policy_problem": _null("string", "why the active policy is unusable, as `policy show` "
                            "says (one set by an operator: the daemon falls back to "
                            "`static`; one from the configuration: a daemon does not "
                            "start with it)"),
    "paused": _t("boolean", "an operator paused the daemon (`malleable pause`)"),
    "paused_by": _null("string", "who paused it: user, uid, host and time (null: not "
                                 "paused, or a store older than this record)"),
    "last_decision": _obj("the latest decision (policy run)", {
        "id": _t("integer", "decision id"),
        "time": _time("when it ran", nullable=False),
        "age_s": _null("number", "seconds ago"),
        "policy": _t("string", "the policy that ran"),
        "params": _free("its parameters"),
        "objective": _null("number", "the policy's objective value"),
        "duration_s": _null("number", "run time of the policy, seconds"),
        "dry_run": _t("boolean", "the daemon ran in dry-run mode (changed nothing)"),
    }, nullable=True),
    "last_poll": _time("the latest poll of Slurm (newest `last_seen` of any job)"),
    "last_poll_age_s": _null("number", "seconds ago"),
    "polls_stale": _t("boolean", "a healthy daemon has not polled Slurm successfully for "
                      "over `polls_stale_after_s` (`status --check` exits 1)"),
    "polls_stale_after_s": _t("number", "3 poll intervals plus one poll's Slurm retries "
                              "(`command_timeout_s` x (`max_retries` + 1)), seconds"),
    "gpus_per_node": _t("integer", "g used for goodput at a GPU count"),
    "gpus_per_node_source": _t("string", "where g came from", enum=["option", "slurm.conf",
                                                                     "store"]),
    "gpus": _obj("GPUs of malleable jobs", {
        "held": _t("integer", "GPUs held by running malleable jobs"),
        "target": _null("integer", "GPUs the latest decision targets in total"),
    }),
    "jobs": _arr("the malleable jobs not finished (with `--all`: every malleable job), by "
                 "arrival", _obj("one malleable job", {
        "job_id": _t("string", "Slurm job id"),
        "name": _t("string", "job name"),
        "user": _t("string", "owner"),
        "state": _t("string", "Slurm state (PENDING, RUNNING, COMPLETED, ...), or VANISHED: Slurm stopped "
                    "listing it before a poll saw how it ended"),
        "reason": _null("string", "Slurm's pending or hold reason"),
        "held": _t("boolean", "held in Slurm"),
        "gpus": _t("integer", "GPUs it runs on now (0 unless RUNNING)"),
        "requested_gpus": _null("integer", "GPUs a PENDING job asks for"),
        "target_gpus": _null("integer", "the latest decision's target (null: not in it)"),
        "target_reason": _null("string", "the policy's reason for the target"),
        "throughput": _null("number", "training samples per second over its latest "
                                      "progress lines of the current run (RUNNING only)"),
        "remaining_work": _null("number", "remaining work of its latest estimate, samples "
                                          "at the initial batch size m0"),
        "goodput_at_target": _null("number", "fitted goodput at the target's GPU count "
                                             "(else at its current count), samples at m0 "
                                             "per second"),
        "eta_s": _null("number", "estimated seconds to finish: wait_s (if any) + "
                                 "remaining_work / goodput_at_target"),
        "wait_s": _null("number", "a PENDING job's seconds to Slurm's expected start "
                                  "(null: not pending, held, or no expected start: none, "
                                  "or backfill's a-year-ahead placeholder)"),
        "goodput_basis": _null("string", "what goodput_at_target rests on: fit (the job's "
                                         "own throughput), finished_jobs (none measured "
                                         "yet: the prior from finished jobs like it: same "
                                         "model, else same name and user) "
                                         "or default (none measured, no such prior: the "
                                         "cluster's default, a guess)"),
        "remaining_basis": _null("string", "what remaining_work rests on: target (declared "
                                           "steps, samples or epochs), curve (learning curve "
                                           "to a target metric), history (finished jobs' "
                                           "sizes; grows while the job runs) or default"),
        "estimate_time": _time("when the latest estimate was made (the daemon stores a "
                               "job's estimate when it changes, so it can be older than the "
                               "last decision)"),
        "last_action": _ref("action", "its newest action", nullable=True),
    })),
}, {"action": ACTION, "policy": POLICY})

JOB = _schema("malleable.job/1", "malleable job show",
              "Everything the state store holds about one job.", {
    "generated_at": _time("when the command ran", nullable=False),
    "job": _obj("the job as last polled", {
        "job_id": _t("string", "Slurm job id"),
        "name": _t("string", "job name"), "user": _t("string", "owner"),
        "uid": _null("integer", "owner's uid"), "account": _t("string", "Slurm account"),
        "partition": _t("string", "partition(s)"),
        "malleable": _t("boolean", "it has a valid malleable spec"),
        "state": _t("string", "Slurm state"),
        "reason": _null("string", "Slurm's pending or hold reason"),
        "held": _t("boolean", "held in Slurm"),
        "gpus": _t("integer", "GPUs allocated (running) or requested (pending)"),
        "nodes": _t("integer", "nodes allocated or requested"),
        "gpus_per_node": _t("integer", "GPUs per node"),
        "arrival_time": _time("first submit (Slurm resets its submit time on requeue)"),
        "submit_time": _time("Slurm's submit time"),
        "start_time": _time("latest start; for a PENDING job, Slurm's expected start"),
        "end_time": _time("end"),
        "restart_count": _t("integer", "Slurm's restart count (requeues)"),
        "attained_gpu_s": _null("number", "attained service, GPU-seconds"),
        "first_seen": _time("first poll that saw it", nullable=False),
        "last_seen": _time("latest poll that saw it", nullable=False),
    }),
    "spec": _obj("its malleable spec (docs/job-author-guide.md)", {
        "text": _null("string", "the spec as the job gave it (its comment)"),
        "parsed": _free("the parsed spec (field -> value)", nullable=True),
        "error": _null("string", "why the spec is invalid (the job is then rigid)"),
    }),
    "sizes": _arr("its sizes over time (first seen, then every change)", _obj("a size", {
        "time": _time("when seen", nullable=False), "gpus": _t("integer", "GPUs"),
        "nodes": _null("integer", "nodes")})),
    "events": _arr("its events, oldest first", _obj("an event", {
        "time": _time("when", nullable=False),
        "kind": _t("string", "new, state, size, restart, no_checkpoint, or an event the job "
                             "logged (started, checkpointed, finished)"),
        "old_state": _null("string", "state before (kind state)"),
        "new_state": _null("string", "state after"),
        "old_gpus": _null("integer", "GPUs before (kind size)"),
        "new_gpus": _null("integer", "GPUs after"),
        "old_nodes": _null("integer", "nodes before"),
        "new_nodes": _null("integer", "nodes after"),
        "detail": _null("string", "more, e.g. the job's event line"),
    })),
    "actions": _arr("its actions, oldest first", _ref("action", "an action")),
    "targets": _arr("what the latest decisions (at most 20, newest first) targeted for it",
                    _obj("a target", {
        "decision_id": _t("integer", "decision id"),
        "time": _time("decision time", nullable=False),
        "policy": _t("string", "policy that decided"),
        "dry_run": _t("boolean", "the decision was not applied (dry run)"),
        "gpus": _t("integer", "target GPUs (0: not running)"),
        "batch_size": _null("integer", "the policy's global batch size at the target (the "
                                       "spec's initial batch for a job that logs no gradient "
                                       "statistics: its plan file then advises none)"),
        "reason": _t("string", "the policy's reason")})),
    "progress": _obj("its progress lines", {
        "lines_stored": _t("integer", "progress samples stored (after retention)"),
        "lines_accepted": _t("integer", "lines ingestion accepted in total"),
        "rejected": {"type": "object", "additionalProperties": {"type": "integer"},
                     "description": "rejected lines by reason (docs/progress-format.md)"},
        "file": _null("string", "its progress file"),
        "expected_file": _null("string", "where the daemon reads a malleable job's lines, "
                                         "while no file was read (null once one was)"),
        "first": _ref("sample", "its first stored line"),
        "last": _ref("sample", "its latest stored line"),
        "throughput": _obj("samples per second over its latest lines of the latest run", {
            "samples_per_s": _null("number", "samples per second"),
            "window_s": _null("number", "seconds covered"),
            "lines": _t("integer", "lines used"),
            "restart": _null("integer", "the run"),
            "gpus": _t("integer", "GPUs at the last line")}, nullable=True),
        "runs": _arr("per run (restart count)", _obj("a run", {
            "restart": _null("integer", "restart count"),
            "lines": _t("integer", "lines stored"),
            "min_gpus": _t("integer", "fewest GPUs in the run"),
            "max_gpus": _t("integer", "most GPUs in the run"),
            "first": _time("first line"), "last": _time("last line"),
            "throughput": _null("number", "samples per second over the run")})),
    }),
    "estimate": _obj("its latest estimate", {
        "time": _time("when it was made (the daemon stores a job's estimate when it "
                      "changes, so it can be older than the last decision)", nullable=False),
        "model": _t("string", "throughput model (pollux)"),
        "remaining_work": _null("number", "remaining work, samples at m0"),
        "remaining_work_sd": _null("number", "its standard deviation"),
        "p": _null("number", "speedup exponent of a k^p fit"),
        "phi": _null("number", "gradient noise scale"),
        "m0": _null("number", "initial batch size"),
        "progress": _null("number", "attained work, samples at m0"),
        "flags": _arr("which parts came from priors or fallbacks (EstimateFlags names)",
                      {"type": "string"}),
        "eta_s": _null("number", "wait_s (if any) + remaining_work over the goodput at "
                                 "eta_gpus, seconds"),
        "wait_s": _null("number", "a PENDING job's seconds to Slurm's expected start "
                                  "(null: not pending, held, or no expected start: none, "
                                  "or backfill's a-year-ahead placeholder)"),
        "eta_gpus": _null("integer", "the GPU count of eta_s: the latest target, else the "
                                     "current count"),
    }, nullable=True),
    "curve": _obj("the fitted speedup curve from the latest estimate", {
        "gpus_per_node": _t("integer", "g used for node counts"),
        "gpus_per_node_source": _t("string", "where g came from",
                                   enum=["option", "slurm.conf", "store"]),
        "goodput_1": _null("number", "goodput at 1 GPU (the model's value)"),
        "points": _arr("one per GPU count the job may use (and its target/current count)",
                       _obj("a point", {
            "gpus": _t("integer", "GPUs k"), "nodes": _t("integer", "nodes at k"),
            "goodput": _null("number", "goodput at k, samples at m0 per second"),
            "speedup": _null("number", "goodput(k) / goodput(1)"),
            "batch_size": _t("integer", "goodput-optimal global batch size at k")})),
    }, nullable=True),
    "plot": _null("string", "the image written by --plot (absolute path)"),
}, {"action": ACTION, "sample": SAMPLE})

PLAN = _schema("malleable.plan/1", "malleable plan",
               "What the active policy would do now (dry run on a scratch copy).", {
    "generated_at": _time("the planning time", nullable=False),
    "database": _t("string", "the database copied"),
    "recorded": _t("boolean", "always false: nothing was written to the database"),
    "policy": _ref("policy", "the policy that planned"),
    "paused": _t("boolean", "the daemon is paused (it would not start the actions)"),
    "objective": _null("number", "the policy's objective value"),
    "capacity": _obj("GPUs malleable jobs may use", {
        "gpus_per_node": _t("integer", "g"),
        "free_gpus": _t("integer", "GPUs not held by rigid or unmanaged jobs"),
        "nodes": _t("integer", "usable GPU nodes of the managed partitions")}),
    "slurm_rpcs": _t("integer", "Slurm commands the plan ran: one poll of the jobs and the "
                                  "node list (3 with the command-line backend: squeue, "
                                  "scontrol show node, scontrol show partition)"),
    "jobs": _arr("the managed malleable jobs in the policy's order", _obj("a job", {
        "job_id": _t("string", "Slurm job id"), "name": _t("string", "job name"),
        "state": _t("string", "Slurm state now"),
        "gpus": _t("integer", "GPUs it runs on (0 unless RUNNING)"),
        "requested_gpus": _null("integer", "GPUs a pending job asks for"),
        "target_gpus": _t("integer", "the policy's target (0: not running)"),
        "batch_size": _null("integer", "the policy's global batch size at the target (the "
                                       "spec's initial batch for a job that logs no gradient "
                                       "statistics: its plan file then advises none)"),
        "reason": _t("string", "the policy's reason")})),
    "actions": _arr("the actions the daemon would start, in order", _obj("an action", {
        "job_id": _t("string", "Slurm job id"),
        "kind": _t("string", "hold, admit, shrink or requeue"),
        "from_gpus": _t("integer", "GPUs now"), "to_gpus": _t("integer", "GPUs after"),
        "to_nodes": _null("integer", "nodes after (null: held)"),
        "to_gpus_per_node": _null("integer", "GPUs per node after"),
        "batch_size": _null("integer", "recommended batch size after"),
        "reason": _t("string", "why")})),
    "skipped": _arr("differences left alone this cycle", _obj("a skipped job", {
        "job_id": _t("string", "Slurm job id"), "reason": _t("string", "why")})),
    "excluded": _arr("malleable jobs not allocated", _obj("an excluded job", {
        "job_id": _t("string", "Slurm job id"), "reason": _t("string", "why")})),
    "warnings": _arr("warnings of the run (e.g. unreadable progress files)",
                     {"type": "string"}),
}, {"policy": POLICY})

ACTIONS = _schema("malleable.actions/1", "malleable actions", "The action log, oldest first.", {
    "generated_at": _time("when the command ran", nullable=False),
    "filters": _obj("the filters applied", {
        "job": _null("string", "--job"), "since": _time("--since, as a time"),
        "limit": _t("integer", "--limit")}),
    "actions": _arr("the newest `limit` matching actions, oldest first",
                    _ref("action", "an action")),
}, {"action": ACTION})

PAUSE = _schema("malleable.pause/1", "malleable pause / resume",
                "The pause state after `pause` or `resume`.", {
    "paused": _t("boolean", "paused now"),
    "changed": _t("boolean", "the command changed it (false: it already was)"),
    "time": _time("when", nullable=False),
    "by": _t("string", "who ran it: user, uid, the sudo user (root under sudo) and groups"),
    "uid": _t("integer", "effective uid"),
    "database": _t("string", "the database changed"),
    "daemon_health": _t("string", "the daemon's health now (healthy, stale, absent): "
                                  "the change takes effect when a healthy daemon polls"),
})

POLICY_SHOW = _schema("malleable.policy/1", "malleable policy show / set",
                      "The active policy (after `set`: the one just set).", {
    **POLICY["properties"],
    "effective_params": _free("every parameter's value in effect, defaults filled in (null "
                              "when the stored policy is unusable)", nullable=True),
    "problem": _null("string", "why the active policy is unusable (set by an operator: "
                               "the daemon then uses `static`; from the configuration: a "
                               "daemon does not start with it)"),
    "set_at": _time("when an operator set it"),
    "set_by": _null("string", "who set it (`policy set`): user, uid and host; null for the "
                              "configuration's policy or a store older than this record"),
    "config": _obj("`[policy]` of the configuration", {
        "name": _t("string", "configured name"), "params": _free("configured parameters"),
        "source": _t("string", "the configuration file")}),
    "hysteresis": _obj("`[policy]` hysteresis settings", {
        "min_gain": _t("number", "min_gain"), "cooldown_s": _t("number", "cooldown_s"),
        "min_run_restarts": _t("number", "min_run_restarts")}),
    "database": _t("string", "the database read"),
    "changed": _null("boolean", "`set` only: it changed the active policy"),
    "by": _null("string", "`set` only: who ran it"),
})

POLICY_LIST = _schema("malleable.policy-list/1", "malleable policy list",
                      "The registered policies and their parameters.", {
    "default": _t("string", "the policy `default` stands for"),
    "active": _t("string", "the configured policy name (`[policy] name`)"),
    "policies": _arr("by name", _obj("a policy", {
        "name": _t("string", "name to use in `[policy] name` or `policy set`"),
        "alias_of": _null("string", "for `default`: the policy it stands for"),
        "class": _t("string", "module:Class"),
        "summary": _t("string", "first line of its documentation"),
        "params": _arr("its parameters", _obj("a parameter", {
            "name": _t("string", "name"), "type": _t("string", "Python type"),
            "default": {"description": "default value (any JSON value)"},
            "doc": _t("string", "meaning")}))})),
})

CONFIG = _schema("malleable.config/1", "malleable config show",
                 "The configuration in effect.", {
    "source": _t("string", "the file read (or <defaults>)"),
    "env": _obj("environment variables that apply", {
        "MALLEABLE_CONFIG": _null("string", "configuration file named by the environment"),
        "MALLEABLE_DATABASE_URL": _null("string", "database URL override (password hidden)")}),
    "sections": {"type": "object", "description": "section -> key -> value "
                                                  "(docs/configuration.md); the database "
                                                  "URL's password is hidden",
                 "additionalProperties": {"type": "object"}},
})

CONFIG_DEFAULTS = _schema("malleable.config-defaults/1", "malleable config show --defaults",
                          "Every configuration key's type, default and meaning.", {
    "sections": {"type": "object", "description": "section -> {doc, keys}",
                 "additionalProperties": _obj("a section", {
                     "doc": _t("string", "what the section is for"),
                     "keys": {"type": "object", "description": "key -> its metadata",
                              "additionalProperties": _obj("a key", {
                                  "type": _t("string", "TOML type"),
                                  "default": {"description": "default value"},
                                  "doc": _t("string", "meaning"),
                                  "choices": _null("array", "allowed values, if limited")})}})},
})

SCHEMAS: dict[str, dict] = {s["$id"]: s for s in (STATUS, JOB, PLAN, ACTIONS, PAUSE, POLICY_SHOW,
                                                    POLICY_LIST, CONFIG, CONFIG_DEFAULTS)}
"""Schema name -> JSON Schema."""

COMMAND_OF = {
    "malleable.status/1": "malleable status --json",
    "malleable.job/1": "malleable job show ID --json",
    "malleable.plan/1": "malleable plan --json",
    "malleable.actions/1": "malleable actions --json",
    "malleable.pause/1": "malleable pause --json, malleable resume --json",
    "malleable.policy/1": "malleable policy show --json, malleable policy set ... --json",
    "malleable.policy-list/1": "malleable policy list --json",
    "malleable.config/1": "malleable config show --json",
    "malleable.config-defaults/1": "malleable config show --defaults --json",
}

# ---------------------------------------------------------------- markdown


def _type(node: dict) -> str:
    if "$ref" in node:
        return f"[{node['$ref'].rsplit('/', 1)[-1]}](#{node['$ref'].rsplit('/', 1)[-1]})"
    if "anyOf" in node:
        return " or ".join(_type(x) for x in node["anyOf"])
    if "const" in node:
        return f"`\"{node['const']}\"`"
    t = node.get("type")
    if t is None:
        return "any"
    names = t if isinstance(t, list) else [t]
    words = []
    for n in names:
        if n == "string" and node.get("format") == "date-time":
            words.append("time")
        elif n == "string" and "enum" in node:
            words.append(" \\| ".join(f"`\"{e}\"`" for e in node["enum"]))
        else:
            words.append(n)
    return " or ".join(words)


def _rows(node: dict, path: str) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for key, sub in node.get("properties", {}).items():
        p = f"{path}.{key}" if path else key
        rows.append((p, _type(sub), sub.get("description", "")))
        rows += _children(sub, p)
    return rows


def _children(sub: dict, p: str) -> list[tuple[str, str, str]]:
    if "properties" in sub:
        return _rows(sub, p)
    if sub.get("type") == "array" and isinstance(sub.get("items"), dict):
        items = sub["items"]
        if "properties" in items:
            return _rows(items, f"{p}[]")
        if "$ref" in items:
            return [(f"{p}[]", _type(items), items.get("description", ""))]
    extra = sub.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        return _rows(extra, f"{p}.*")
    return []


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    out = ["| key | type | meaning |", "|---|---|---|"]
    out += [f"| `{k}` | {t} | {_cell(d)} |" for k, t, d in rows]
    return out


HEADER = """# JSON output of the admin commands

<!-- Generated by `python -m malleable.ops.docgen` from malleable/ops/schemas.py;
     do not edit by hand (a test checks it). -->

Every admin command documented below takes `--json` and then prints exactly one
JSON document on stdout (UTF-8), whatever it would have printed as text. (`malleable
db` and `conf snippet` print text only: the schema's revision, and slurm.conf lines.)
Errors are not JSON: one line `malleable CMD: error: MESSAGE` on stderr and the exit
code below.

## Versioning

Each document's `schema` key names its schema and version, e.g.
`"malleable.status/1"`. The version goes up when a key is removed or renamed or
changes its type or meaning; keys may be **added** within a version, so a script
must ignore keys it does not know and should check the `schema` value it expects.
The machine-readable schemas (JSON Schema 2020-12) are in
`malleable/ops/schemas.py` (`SCHEMAS`); the tests validate every command's output
against them.

Conventions: times are ISO 8601 strings in UTC (`"2026-01-02T03:04:05Z"`), durations
and ages are seconds, GPU counts are integers, throughput and goodput are training
samples per second (goodput in samples at the job's initial batch size m0), `null`
means unknown or not applicable.

## Exit codes

| code | meaning |
|---|---|
| 0 | done |
| 1 | the operation failed or was refused: not root and not in the operator group (`pause`, `resume`, `policy set`), Slurm did not answer (`plan`), the daemon is not healthy (`status --check`) |
| 2 | bad input: a usage error, a bad value (unknown policy or parameter, bad `--since`), a job the store does not know, or an unusable configuration or database (missing, unreadable, wrong schema) |
| 130 | interrupted with Ctrl-C (`Aborted!` on stderr), as a shell reports SIGINT |
"""


def markdown() -> str:
    """docs/cli-json.md: the schemas as tables, one section per document."""
    out = [HEADER.rstrip("\n")]
    defs: dict[str, dict] = {}
    for name, s in SCHEMAS.items():
        out += ["", f"## `{name}`", "", f"{s['description']} Printed by "
                f"{', '.join(f'`{c.strip()}`' for c in COMMAND_OF[name].split(','))}.", ""]
        out += _table(_rows(s, ""))
        defs.update(s.get("$defs", {}))
    out += ["", "## Shared objects"]
    for name, d in defs.items():
        out += ["", f"### {name}", "", d["description"] + ".", ""]
        out += _table(_rows(d, ""))
    return "\n".join(out) + "\n"
