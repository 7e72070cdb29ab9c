"""A fake of the pyslurm 25.11 API surface, over a small in-memory slurmctld.

Why a fake: pyslurm 25.11 links libslurm 25.11 and does not build against this
machine's Slurm 22.05 (DESIGN.md section 6), so the pyslurm backend cannot talk
to the real harness here. This module reproduces the documented pyslurm 25.11
surface the backend uses, with the same names, arguments and return shapes:

* ``pyslurm.__version__`` ("25.11.0": Slurm major.minor + pyslurm patch), ``version()``;
* ``pyslurm.RPCError`` (``errno``, ``msg``; ``str()`` is the message);
* ``pyslurm.Jobs.load()`` -> a mapping job id -> ``Job`` (``.values()``);
* ``pyslurm.Job(id)``, ``Job.load(id)`` (RPCError "Invalid job id specified"),
  ``Job.modify(JobSubmitDescription)``, ``hold(mode=None)``, ``release()``,
  ``requeue(hold=False)``, ``send_signal(signal, steps="children"|"batch"|"all")``,
  ``cancel()``; properties ``id, name, user_id, user_name, account, partition,
  state, state_reason, priority, allocated_nodes, num_nodes, gres_per_node,
  submit_time, eligible_time, start_time, end_time, time_limit, requeue_count,
  is_requeueable, is_batch_job, comment, array_id, array_task_id,
  heterogeneous_id, heterogeneous_offset`` and ``get_resource_layout_per_node()``;
* ``pyslurm.JobSubmitDescription(**attrs)`` (``nodes`` as int, "min-max" or
  dict; ``gres_per_node`` as "gpu:2" or dict; ``begin_time`` "now[+N]";
  ``priority`` 0 = held) and ``.submit()`` -> job id;
* ``pyslurm.Nodes.load()`` -> mapping name -> ``Node`` (``name, state, partitions,
  configured_gres, allocated_gres``).

The controller behind it follows Slurm's rules as seen on the harness: FIFO
scheduling of whole nodes with free GPUs, shrinking a running job releases
nodes, a running job's GRES cannot change ("Job is no longer pending
execution"), requeue of a job that is not requeueable is "Requested operation
is presently disabled", a requeued job waits for its begin time until
``begin_time="now"``, and ``down = True`` makes every call fail with "Unable to
contact slurm controller (connect failure)".
"""

from __future__ import annotations

import itertools
import time
import types
from dataclasses import dataclass, field

INFINITE = 0xFFFFFFFF
VERSION = "25.11.0"


class RPCError(Exception):
    """pyslurm.RPCError: ``errno`` and ``msg`` as pyslurm sets them."""

    def __init__(self, errno: int = 1, msg: str = "Unspecified error"):
        super().__init__(msg)
        self.errno = errno
        self.msg = msg


@dataclass
class _FakeJob:
    id: int
    name: str
    nodes_req: int
    gpus_per_node: int
    requeueable: bool
    comment: str
    priority: int
    submit_time: int
    state: str = "PENDING"
    reason: str = "None"
    alloc: list[str] = field(default_factory=list)
    begin: float = 0.0
    start_time: int | None = None
    end_time: int | None = None
    restarts: int = 0
    signals: list[tuple[str, str]] = field(default_factory=list)


class FakeSlurmctld:
    """The in-memory controller: 4 nodes x 4 GPUs in partition "gpu" by default."""

    def __init__(self, nodes: int = 4, gpus_per_node: int = 4):
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.gpus_per_node = gpus_per_node
        self.jobs: dict[int, _FakeJob] = {}
        self.ids = itertools.count(1)
        self.down = False
        self.calls = 0

    # -- helpers used by the API classes
    def rpc(self) -> None:
        self.calls += 1
        if self.down:
            raise RPCError(1001, "Unable to contact slurm controller (connect failure)")
        self.schedule()  # slurmctld schedules on its own; here, whenever it is asked

    def get(self, job_id: int) -> _FakeJob:
        if job_id not in self.jobs:
            raise RPCError(2017, "Invalid job id specified")
        return self.jobs[job_id]

    def used(self) -> dict[str, int]:
        used = dict.fromkeys(self.node_names, 0)
        for j in self.jobs.values():
            for n in j.alloc:
                used[n] += j.gpus_per_node
        return used

    def schedule(self) -> None:
        now = time.time()
        for j in sorted(self.jobs.values(), key=lambda j: j.id):
            if j.state != "PENDING" or j.priority == 0:
                continue
            if j.begin > now:
                j.reason = "BeginTime"
                continue
            used = self.used()
            free = [n for n in self.node_names if self.gpus_per_node - used[n] >= j.gpus_per_node]
            if len(free) < j.nodes_req:
                j.reason = "Resources"
                continue
            j.alloc = free[:j.nodes_req]
            j.state, j.reason, j.start_time = "RUNNING", "None", int(now)

    def finish(self, j: _FakeJob, state: str) -> None:
        j.state, j.alloc, j.end_time = state, [], int(time.time())


def _nodes_spec(value) -> int:
    if isinstance(value, dict):
        return int(value["min"])
    if isinstance(value, str):
        return int(value.split("-")[0])
    return int(value)


def _gres_spec(value) -> int:
    if isinstance(value, dict):
        return sum(int(v) for k, v in value.items() if k.split(":")[0] == "gpu")
    name, *rest = str(value).replace("gres:", "").replace("gres/", "").split(":")
    if name != "gpu":
        raise RPCError(2072, "Invalid generic resource (gres) specification")
    return int(rest[-1]) if rest else 1


def make_pyslurm(ctld: FakeSlurmctld | None = None) -> types.ModuleType:
    """A module object with the pyslurm 25.11 surface, bound to ``ctld``."""
    ctld = ctld or FakeSlurmctld()

    class JobSubmitDescription:
        _ALLOWED = {"script", "nodes", "gres_per_node", "is_requeueable", "comment", "name",
                    "partitions", "standard_output", "working_directory",
                    "log_files_open_mode", "environment", "priority", "begin_time"}

        def __init__(self, **kwargs):
            for key in kwargs:
                if key not in self._ALLOWED:
                    raise AttributeError(f"JobSubmitDescription has no attribute {key!r}")
            self.__dict__.update(kwargs)

        def submit(self) -> int:
            ctld.rpc()
            j = _FakeJob(id=next(ctld.ids), name=getattr(self, "name", "script"),
                         nodes_req=_nodes_spec(getattr(self, "nodes", 1)),
                         gpus_per_node=_gres_spec(getattr(self, "gres_per_node", "gpu:0")),
                         requeueable=getattr(self, "is_requeueable", True),
                         comment=getattr(self, "comment", ""),
                         priority=0 if getattr(self, "priority", None) == 0 else 1000,
                         submit_time=int(time.time()))
            if j.priority == 0:
                j.reason = "JobHeldUser"
            ctld.jobs[j.id] = j
            ctld.schedule()
            return j.id

    class Job:
        def __init__(self, job_id: int):
            self._id = int(job_id)

        def __repr__(self):
            return f"pyslurm.Job({self._id})"

        @staticmethod
        def load(job_id: int) -> Job:
            ctld.rpc()
            ctld.get(int(job_id))
            return Job(job_id)

        @property
        def _j(self) -> _FakeJob:
            return ctld.get(self._id)

        # -- properties (pyslurm names)
        id = property(lambda self: self._id)
        name = property(lambda self: self._j.name)
        user_id = property(lambda self: 1001)
        user_name = property(lambda self: "alice")
        account = property(lambda self: "ml")
        partition = property(lambda self: "gpu")
        state = property(lambda self: self._j.state)
        state_reason = property(lambda self: self._j.reason)
        priority = property(lambda self: self._j.priority)
        allocated_nodes = property(lambda self: ",".join(self._j.alloc) or None)
        num_nodes = property(lambda self: len(self._j.alloc) or self._j.nodes_req)
        gres_per_node = property(lambda self: {"gpu": self._j.gpus_per_node}
                                 if self._j.gpus_per_node else {})
        submit_time = property(lambda self: self._j.submit_time)
        eligible_time = property(lambda self: None if self._j.priority == 0
                                 else int(max(self._j.begin, self._j.submit_time)))
        start_time = property(lambda self: self._j.start_time)
        end_time = property(lambda self: self._j.end_time)
        time_limit = property(lambda self: None)
        requeue_count = property(lambda self: self._j.restarts)
        is_requeueable = property(lambda self: self._j.requeueable)
        is_batch_job = property(lambda self: True)
        comment = property(lambda self: self._j.comment)
        array_id = property(lambda self: None)
        array_task_id = property(lambda self: None)
        heterogeneous_id = property(lambda self: None)
        heterogeneous_offset = property(lambda self: None)

        def get_resource_layout_per_node(self) -> dict:
            g = self._j.gpus_per_node
            return {n: {"cpu_ids": "0", "memory": 0,
                        "gres": {"gpu": {"count": str(g), "indexes": f"0-{g - 1}"}} if g else {}}
                    for n in self._j.alloc}

        # -- changes
        def modify(self, changes: JobSubmitDescription) -> None:
            ctld.rpc()
            j = self._j
            attrs = changes.__dict__
            if j.state != "PENDING":
                if j.state != "RUNNING" or set(attrs) - {"nodes", "priority"}:
                    raise RPCError(2017, "Job is no longer pending execution")
                if "priority" in attrs:  # Slurm accepts (and ignores) a hold of a running job
                    j.priority = 0 if attrs["priority"] == 0 else 1000
                if "nodes" in attrs:
                    n = _nodes_spec(attrs["nodes"])
                    if n >= len(j.alloc):
                        raise RPCError(2015, "Requested node configuration is not available")
                    j.alloc = j.alloc[:n]
                return
            if "nodes" in attrs:
                j.nodes_req = _nodes_spec(attrs["nodes"])
            if "gres_per_node" in attrs:
                j.gpus_per_node = _gres_spec(attrs["gres_per_node"])
            if "begin_time" in attrs:
                spec = str(attrs["begin_time"])
                j.begin = time.time() + (int(spec[4:]) if spec.startswith("now+") else 0)
            if attrs.get("priority") == 0:
                j.priority, j.reason = 0, "JobHeldAdmin"
            elif attrs.get("priority") == INFINITE:
                j.priority, j.reason = 1000, "None"
            ctld.schedule()

        def hold(self, mode=None) -> None:
            self.modify(JobSubmitDescription(priority=0))
            if mode == "user" and self._j.state == "PENDING":
                self._j.reason = "JobHeldUser"

        def release(self) -> None:
            self.modify(JobSubmitDescription(priority=INFINITE))

        def requeue(self, hold: bool = False) -> None:
            ctld.rpc()
            j = self._j
            if not j.requeueable:
                raise RPCError(2014, "Requested operation is presently disabled")
            if j.state != "RUNNING":
                raise RPCError(2017, "Job is pending execution")
            j.alloc, j.state, j.restarts = [], "PENDING", j.restarts + 1
            j.submit_time, j.start_time, j.begin = int(time.time()), None, time.time() + 60
            if hold:
                j.priority, j.reason = 0, "job requeued in held state"
            ctld.schedule()

        def send_signal(self, signal, steps: str = "children", hurry: bool = False) -> None:
            ctld.rpc()
            j = self._j
            if j.state != "RUNNING":
                raise RPCError(2017, "Job can not be altered now, try again later"
                               if j.state == "PENDING"
                               else "Job/step already completing or completed")
            j.signals.append((str(signal), steps))

        def cancel(self) -> None:
            ctld.rpc()
            j = self._j
            if j.state in ("PENDING", "RUNNING"):
                ctld.finish(j, "CANCELLED")
                ctld.schedule()

    class Jobs(dict):
        @staticmethod
        def load(preload_passwd_info: bool = False, frozen: bool = False) -> Jobs:
            ctld.rpc()
            return Jobs({i: Job(i) for i in ctld.jobs})

    class Node:
        def __init__(self, name: str, used: int):
            self.name = name
            self.partitions = ["gpu"]
            self.configured_gres = {"gpu": ctld.gpus_per_node}
            self.allocated_gres = {"gpu": used}
            self.state = ("IDLE" if used == 0 else
                          "ALLOCATED" if used >= ctld.gpus_per_node else "MIXED")

    class Nodes(dict):
        @staticmethod
        def load() -> Nodes:
            ctld.rpc()
            used = ctld.used()
            return Nodes({n: Node(n, used[n]) for n in ctld.node_names})

    mod = types.ModuleType("pyslurm")
    mod.__version__ = VERSION
    mod.version = lambda: VERSION
    mod.RPCError = RPCError
    mod.Job, mod.Jobs, mod.JobSubmitDescription = Job, Jobs, JobSubmitDescription
    mod.Node, mod.Nodes = Node, Nodes
    mod.ctld = ctld
    return mod
