"""The `SlurmClient` protocol and the port's error hierarchy.

Everything the daemon (and the simulator's Slurm) must provide. A backend is
any object with these methods; `malleable.slurm.connect` picks one.

RPC accounting: every backend counts the Slurm RPCs (commands or API calls)
it issues in ``rpc_count``, so the daemon can log the cost of each cycle.
One call of `jobs()` is one RPC, whatever the number of jobs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from malleable.slurm.records import ClusterInfo, SignalTarget, SlurmJob, SlurmNode, SubmitRequest


class SlurmError(Exception):
    """Any failure of the Slurm port."""


class SlurmUnavailable(SlurmError):
    """The controller did not answer, or a command timed out (after retries with back-off)."""


class SlurmRejected(SlurmError):
    """Slurm refused a change; ``slurm_message`` is Slurm's own words.

    Examples: "Node count specification invalid", "Job is no longer pending
    execution", "Requested operation is presently disabled" (a job that is not
    requeueable), "Invalid job id specified".
    """

    def __init__(self, message: str, *, job_id: str | None = None, slurm_message: str = ""):
        super().__init__(message)
        self.job_id = job_id
        self.slurm_message = slurm_message or message


class SlurmParseError(SlurmError):
    """Slurm's output could not be understood; the message names the field and the value."""

    def __init__(self, message: str, *, field: str = "", value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


class InvalidJobId(SlurmError, ValueError):
    """A job id that is not of the forms 123, 123_4 or 123+0 (refused before any command runs)."""


class InvalidArgument(SlurmError, ValueError):
    """A signal, node or GPU count the port refuses before any command runs (names the value)."""


@runtime_checkable
class SlurmClient(Protocol):
    """What malleable needs from Slurm. Every method may raise `SlurmUnavailable`;
    changes raise `SlurmRejected` when Slurm refuses them; ids are validated
    first and raise `InvalidJobId`.
    """

    rpc_count: int

    def jobs(self) -> list[SlurmJob]:
        """Every job the controller knows (one RPC)."""

    def job(self, job_id: str) -> SlurmJob | None:
        """One job, or None if the controller does not know it."""

    def nodes(self) -> list[SlurmNode]:
        """Every node."""

    def cluster(self) -> ClusterInfo:
        """Version, GPUs per node, partitions."""

    def submit(self, request: SubmitRequest) -> str:
        """Submit a batch job; returns its job id."""

    def resize_pending(self, job_id: str, nodes: int, gpus_per_node: int) -> None:
        """Set a pending job's size to exactly ``nodes`` x ``gpus_per_node`` GPUs."""

    def shrink_running(self, job_id: str, nodes: int) -> None:
        """Release nodes of a running job in place, keeping ``nodes`` of them."""

    def hold(self, job_id: str) -> None:
        """Hold a pending job (it will not start until released)."""

    def release(self, job_id: str) -> None:
        """Release a held job."""

    def requeue_hold(self, job_id: str) -> None:
        """Requeue a running job and hold it (it returns to PENDING, held)."""

    def start_now(self, job_id: str) -> None:
        """Clear the begin-time delay Slurm sets on a requeued job (StartTime=now)."""

    def signal(self, job_id: str, signal: str, target: SignalTarget = SignalTarget.BATCH) -> None:
        """Send ``signal`` (e.g. "USR1") to the job's batch shell, steps, or both."""

    def cancel(self, job_id: str) -> None:
        """Cancel a job (used by tools and tests; the daemon never cancels a job)."""
