#!/usr/bin/env python3
"""A malleable training-job emulator whose speed follows a real measured profile.

It trains nothing: it sleeps for as long as one iteration of the chosen model
takes on its current placement and batch size, according to the Pollux T4
profiles (``malleable.sim.profiles.load_profile``: measured step times per
placement and per-GPU batch size, gradient statistics and validation metric
per epoch). Everything else is what a real malleable job does
(docs/job-author-guide.md):

* its size comes from Slurm (``Reporter.from_env``: GPUs per node x nodes,
  spread over the nodes as evenly as possible), its global batch size from
  the daemon's plan when it restarts (``Reporter.recommended_batch_size``),
  else the checkpoint's, else ``--batch`` or $MALLEABLE_BATCH_SIZE, else
  Pollux's default for its GPU count; with ``--adaptive-batch`` it tunes the
  batch itself as AdaptDL jobs do (the profile's goodput-optimal batch for its
  placement, at every start and epoch: what the simulator's jobs do in
  Pollux's setup);
* its state (step, samples, statistical-efficiency-weighted progress, batch) is
  in a checkpoint file written atomically (``write_checkpoint``);
* it logs progress lines with the metric and the gradient statistics the
  profile gives at its point of training;
* on the checkpoint signal it saves, writes ``checkpointed`` and waits for the
  requeue; after the requeue it resumes from the checkpoint at its new size;
* it is done at the profile's target progress (Pollux's epoch count), or
  after ``--target-steps`` iterations.

``--speedup F`` divides every sleep by F (emulated seconds per real second);
the progress lines carry real time, so the throughput a reader computes from
them is the profile's throughput times F. The schedule is absolute (sleep until
start + emulated time / F), so a late wake-up does not accumulate.

Run by hand::

    SLURM_JOB_ID=1 SLURM_GPUS_ON_NODE=2 MALLEABLE_SPOOL=/tmp/spool \\
        python examples/emulated_job.py --model cifar10 --checkpoint /tmp/em.ckpt \\
        --speedup 30 --target-steps 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from malleable.progress.reporter import Reporter, read_checkpoint, write_checkpoint
from malleable.sim.profiles import MODELS, load_profile, spread

TICK_REAL_S = 0.05  # how often (real seconds) a sleep wakes up to look at the signal flag


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.environ.get("MALLEABLE_MODEL", "cifar10"),
                   choices=MODELS, help="profile to follow (default cifar10)")
    p.add_argument("--checkpoint", required=True, help="checkpoint file")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="time compression: emulated seconds per real second")
    p.add_argument("--batch", type=int, default=None,
                   help="initial global batch size; the plan's recommendation, then the "
                        "checkpoint's batch come first (default: $MALLEABLE_BATCH_SIZE, else "
                        "Pollux's default for the GPU count)")
    p.add_argument("--adaptive-batch", action="store_true",
                   help="tune the global batch size itself, as AdaptDL does: the profile's "
                        "goodput-optimal batch for its placement at every start and epoch "
                        "(the plan's recommendation is then not used)")
    p.add_argument("--target-steps", type=int, default=None,
                   help="stop after this many iterations (default: the profile's epochs)")
    p.add_argument("--log-every", type=float, default=30.0,
                   help="emulated seconds between progress lines")
    p.add_argument("--save-s", type=float, default=5.0,
                   help="emulated seconds a checkpoint save takes")
    p.add_argument("--checkpoint-every-steps", type=int, default=0,
                   help="also save every N iterations (0: only on the signal)")
    p.add_argument("--slow-save", type=float, default=0.0,
                   help="real seconds to sleep after each 1 KiB of a save (tests of a kill "
                        "during a save)")
    p.add_argument("--wait-after-checkpoint", type=float, default=600.0,
                   help="real seconds to wait for the requeue after a signalled checkpoint")
    args = p.parse_args(argv)
    if args.speedup <= 0 or not math.isfinite(args.speedup):
        p.error(f"--speedup={args.speedup}: expected a positive number")
    return args


class Clock:
    """Emulated time on an absolute real-time schedule, compressed by ``speedup``."""

    def __init__(self, speedup: float):
        self.speedup = speedup
        self.start = time.monotonic()
        self.emulated = 0.0

    def advance(self, seconds: float, interrupt=lambda: False) -> float:
        """Sleep until ``seconds`` more emulated time has passed, or ``interrupt()`` is
        true; returns the emulated seconds that passed."""
        target = self.emulated + seconds
        while True:
            now = (time.monotonic() - self.start) * self.speedup
            if now >= target:
                break
            if interrupt():
                target = max(self.emulated, now)
                break
            time.sleep(min(TICK_REAL_S, (target - now) / self.speedup))
        passed = target - self.emulated
        self.emulated = target
        return passed


def save_state(path: str, state: dict, slow: float) -> None:
    def pause(done: int, total: int) -> None:
        print(f"saving {done}/{total} bytes", flush=True)
        time.sleep(slow)
    payload = json.dumps(state, sort_keys=True).encode()
    if slow:
        payload += b" " * max(0, 8192 - len(payload))   # several chunks to be killed in
    write_checkpoint(path, payload, chunk_size=1024, on_chunk=pause if slow else None)


def load_state(path: str) -> dict | None:
    payload = read_checkpoint(path)
    return None if payload is None else json.loads(payload)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.model)
    rep = Reporter.from_env()   # batch size from MALLEABLE_BATCH_SIZE if set
    gpus = max(1, rep.gpus)
    nodes = min(rep.nodes, gpus)
    placement = spread(gpus, nodes)
    state = load_state(args.checkpoint) or {"model": args.model, "step": 0, "samples": 0,
                                            "progress": 0.0, "batch": None}
    if state["model"] != args.model:
        print(f"checkpoint {args.checkpoint} is of model {state['model']}, not {args.model}",
              file=sys.stderr)
        return 2
    def tuned() -> int:
        """The goodput-optimal batch now (AdaptDL's choice; the simulator's oracle)."""
        return profile.best_batch(placement, state["progress"])

    if args.adaptive_batch:
        batch = tuned()
    else:
        batch = (rep.recommended_batch_size or state["batch"] or args.batch or rep.batch_size
                 or profile.default_batch(gpus))
    batch = max(gpus, int(batch))
    step_s = profile.step_time(placement, batch / gpus)
    epoch = profile.epoch_at(state["progress"])
    target_steps = args.target_steps
    rep.started(state["step"], state["samples"], batch_size=batch)
    print(f"emulating {args.model} on {placement} (restart {rep.restart_count}): batch {batch}, "
          f"{step_s:.4f} s/step, {batch / step_s:.1f} samples/s at speedup 1, from step "
          f"{state['step']}", flush=True)
    clock = Clock(args.speedup)

    def done() -> bool:
        if target_steps is not None:
            return state["step"] >= target_steps
        return state["progress"] >= profile.target_progress

    def save(reason: str) -> None:
        clock.advance(args.save_s)
        state["batch"] = batch
        save_state(args.checkpoint, state, args.slow_save)
        rep.checkpointed(args.checkpoint, step=state["step"], samples=state["samples"])
        print(f"checkpointed at step {state['step']} ({reason})", flush=True)

    next_save = (state["step"] // args.checkpoint_every_steps + 1) * args.checkpoint_every_steps \
        if args.checkpoint_every_steps else None
    while not done():
        if args.adaptive_batch and profile.epoch_at(state["progress"]) != epoch:
            epoch = profile.epoch_at(state["progress"])
            batch = max(gpus, tuned())
            step_s = profile.step_time(placement, batch / gpus)
        steps = max(1, int(args.log_every / step_s))
        if target_steps is not None:
            steps = min(steps, target_steps - state["step"])
        if next_save is not None:
            steps = min(steps, next_save - state["step"])
        passed = clock.advance(steps * step_s, lambda: rep.checkpoint_requested)
        steps = min(steps, int(passed / step_s + 1e-9))
        if steps:
            gain = profile.gain(batch, state["progress"])
            state["step"] += steps
            state["samples"] += steps * batch
            state["progress"] += steps * gain
            sqr, var = profile.grad_stats(state["progress"], batch)
            rep.log(state["step"], state["samples"], metric=profile.metric(state["progress"], batch),
                    batch_size=batch, grad_sqr=sqr, grad_var=var)
        if next_save is not None and state["step"] >= next_save:
            save("periodic")
            next_save += args.checkpoint_every_steps
        if rep.checkpoint_requested and not done():
            save("signal")
            rep.wait_for_requeue(args.wait_after_checkpoint)
    state["batch"] = batch
    save_state(args.checkpoint, state, 0.0)
    rep.finished(step=state["step"], samples=state["samples"])
    print(f"finished at step {state['step']}, progress {state['progress']:.1f} of "
          f"{profile.target_progress:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
