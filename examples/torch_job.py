#!/usr/bin/env python3
"""A real, malleable PyTorch training job (CPU): data-parallel over its "GPUs" with gloo.

What it shows (docs/job-author-guide.md):

* It learns its size from Slurm (``Reporter.from_env``: GPUs per node x nodes) and
  starts one training process per "GPU" on this node (``torch.multiprocessing``,
  gloo backend, ``DistributedDataParallel``). On the harness the GPUs are files,
  so each process trains on the CPU; on a real cluster the same code would pin
  one CUDA device per process and use NCCL. One node per process group keeps it
  simple: a multi-node run would start one launcher per node with ``srun``
  and a TCP rendezvous, which this example does not do.
* The data set is generated deterministically (a fixed random linear "teacher"
  labels Gaussian inputs into 10 classes) and the batch of step ``s`` is drawn
  from a generator seeded with ``s``: the data order survives a restart at any
  size without saving a data loader's state.
* The global batch size stays what the plan recommends (or ``--batch``) and is
  split evenly over the processes.
* Every rank catches the checkpoint signal; the ranks agree once per step
  (all-reduce of the flag) so they checkpoint at the same step. Rank 0 saves
  model and optimizer state atomically (``write_checkpoint``), writes the
  ``checkpointed`` event, and all ranks wait for the requeue. After the
  requeue the job loads that checkpoint and continues: same step count, same
  loss, new number of processes.

Run under Slurm with examples/torch_job.sbatch, or by hand::

    SLURM_JOB_ID=1 SLURM_GPUS_ON_NODE=2 MALLEABLE_SPOOL=/tmp/spool \\
        python examples/torch_job.py --checkpoint /tmp/ck.pt --steps 200
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    from malleable.progress.reporter import Reporter, read_checkpoint, write_checkpoint
except ImportError:  # the reporter is one stdlib-only file: it may sit next to this script
    from reporter import Reporter, read_checkpoint, write_checkpoint  # type: ignore[no-redef]

FEATURES, CLASSES, HIDDEN = 32, 10, 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint file (model + optimizer)")
    p.add_argument("--steps", type=int, default=300, help="target steps (iterations)")
    p.add_argument("--batch", type=int, default=int(os.environ.get("MALLEABLE_BATCH_SIZE", 64)),
                   help="initial global batch size (the plan may recommend another)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--log-every", type=int, default=5, help="progress line every N steps")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="extra seconds per step (to watch a short run)")
    p.add_argument("--wait-after-checkpoint", type=float, default=600.0,
                   help="seconds to wait for the requeue after a checkpoint, then go on")
    p.add_argument("--procs", type=int, default=0,
                   help="training processes (default: the job's GPUs on this node, >= 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of data and initial weights")
    return p.parse_args(argv)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def teacher(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(FEATURES, CLASSES, generator=g)


def global_batch(step: int, size: int, seed: int, w: torch.Tensor):
    """The whole global batch of ``step`` (identical on every rank, at any size)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, FEATURES, generator=g)
    return x, (x @ w).argmax(dim=1)


def save(path: str, model: nn.Module, opt: torch.optim.Optimizer, step: int, samples: int,
         loss: float) -> None:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "samples": samples, "loss": loss}, buf)
    write_checkpoint(path, buf.getvalue())


def load(path: str) -> dict | None:
    payload = read_checkpoint(path)
    if payload is None:
        return None
    return torch.load(io.BytesIO(payload), weights_only=True)


def train(rank: int, world: int, args: argparse.Namespace, store_path: str, batch: int) -> None:
    """One training process (rank of world); rank 0 reports and saves."""
    torch.set_num_threads(1)
    # The launcher blocked the checkpoint signal before forking us: install our own
    # handler, then unblock, so a signal sent while we started is delivered now.
    rep = Reporter.from_env(batch_size=batch)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {rep.signum})
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)
    model = make_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = load(args.checkpoint)
    step = samples = 0
    mean_loss = float("nan")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, samples, mean_loss = state["step"], state["samples"], state["loss"]
    ddp = DistributedDataParallel(model)
    w = teacher(args.seed)
    local = batch // world
    if rank == 0:
        rep.started(step, samples)
        print(f"rank 0: start at step {step} on {world} processes, batch {batch} "
              f"(restart {rep.restart_count}, gpus {rep.gpus})", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    flag = torch.zeros(1)
    while step < args.steps:
        x, y = global_batch(step, batch, args.seed, w)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        step += 1
        samples += batch
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss = float(mean_loss) / world
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            rep.log(step, samples, metric=mean_loss)
        flag[0] = 1.0 if rep.checkpoint_requested else 0.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag[0] > 0 and step < args.steps:
            if rank == 0:
                save(args.checkpoint, model, opt, step, samples, mean_loss)
                rep.checkpointed(args.checkpoint, step=step, samples=samples)
                print(f"rank 0: checkpointed at step {step}, loss {mean_loss:.4f}", flush=True)
            dist.barrier()
            rep.wait_for_requeue(args.wait_after_checkpoint)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        save(args.checkpoint, model, opt, step, samples, mean_loss)
        rep.finished(step=step, samples=samples)
        print(f"rank 0: finished at step {step}, loss {mean_loss:.4f}", flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The launcher does not report; it learns the size and the plan's batch size.
    rep = Reporter.from_env(batch_size=args.batch, install_handler=False)
    world = args.procs or max(1, rep.gpus // rep.nodes)
    batch = rep.recommended_batch_size or args.batch
    batch = max(world, batch - batch % world)   # divisible by the processes
    os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
    store = tempfile.mkdtemp(prefix="torch-job-")
    signum = rep.signum
    # Block the checkpoint signal while the training processes start (they inherit the
    # mask and unblock it once their handler is in place); then forward it to them.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    ctx = mp.start_processes(train, args=(world, args, os.path.join(store, "rdzv"), batch),
                             nprocs=world, join=False, start_method="fork")

    def forward(sig, frame):
        for proc in ctx.processes:
            if proc.is_alive():
                os.kill(proc.pid, sig)

    signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    try:
        while not ctx.join(timeout=1.0):
            pass
        # Done: a checkpoint request now must not kill this process as it exits.
        signal.signal(signum, signal.SIG_IGN)
    finally:
        for name in os.listdir(store):
            os.unlink(os.path.join(store, name))
        os.rmdir(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
