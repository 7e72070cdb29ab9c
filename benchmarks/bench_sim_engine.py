"""Benchmark: malleable's discrete-event engine against SimPy on the simulator's pattern.

The pattern: J jobs, each with one pending timed event (its next progress
report or epoch end) at ``now + U(1, 60)`` s; when it fires, the job schedules
its next one; one event in ten also cancels another job's pending event and
reschedules it (a job reconfigured by a resize or a signal). Run until E events
have fired. Three implementations of the same pattern with the same random
stream:

* ``engine``: `malleable.sim.engine.Engine` (schedule / Event.cancel).
* ``simpy-callbacks``: SimPy 4 Timeout events with callbacks; a cancelled event
  is a flag checked when it fires (SimPy has no cancel for a Timeout).
* ``simpy-processes``: SimPy's idiom, one generator process per job; a
  reconfiguration is ``Process.interrupt()``.

Prints events per second and the ratio to the engine; SimPy is skipped with a
message if it is not installed (it is not a dependency of malleable).

Usage: python benchmarks/bench_sim_engine.py [--jobs J] [--events E] [--repeat R]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from malleable.sim.engine import Engine


def run_engine(jobs: int, events: int, seed: int) -> int:
    rng = random.Random(seed)
    eng = Engine()
    pending: list = [None] * jobs
    fired = 0

    def fire(j: int) -> None:
        nonlocal fired
        fired += 1
        if fired >= events:
            return
        pending[j] = eng.schedule_in(rng.uniform(1, 60), fire, j)
        if rng.random() < 0.1:
            other = rng.randrange(jobs)
            ev = pending[other]
            if ev is not None and not ev.cancelled and other != j:
                ev.cancel()
                pending[other] = eng.schedule_in(rng.uniform(1, 60), fire, other)

    for j in range(jobs):
        pending[j] = eng.schedule(rng.uniform(0, 60), fire, j)
    while fired < events and eng.step():
        pass
    return fired


def run_simpy_callbacks(jobs: int, events: int, seed: int) -> int:
    import simpy

    rng = random.Random(seed)
    env = simpy.Environment()
    token = [0] * jobs
    done = env.event()
    fired = 0

    def arm(j: int, delay: float) -> None:
        token[j] += 1
        mine = token[j]
        ev = env.timeout(delay)
        ev.callbacks.append(lambda _ev: fire(j, mine))

    def fire(j: int, mine: int) -> None:
        nonlocal fired
        if token[j] != mine:
            return  # cancelled
        fired += 1
        if fired >= events:
            if not done.triggered:
                done.succeed()
            return
        arm(j, rng.uniform(1, 60))
        if rng.random() < 0.1:
            other = rng.randrange(jobs)
            if other != j:
                arm(other, rng.uniform(1, 60))

    for j in range(jobs):
        arm(j, rng.uniform(0, 60))
    env.run(until=done)
    return fired


def run_simpy_processes(jobs: int, events: int, seed: int) -> int:
    import simpy

    rng = random.Random(seed)
    env = simpy.Environment()
    procs: list = [None] * jobs
    done = env.event()
    fired = 0

    def job(j: int, first: float):
        nonlocal fired
        delay = first
        while True:
            try:
                yield env.timeout(delay)
            except simpy.Interrupt:
                delay = rng.uniform(1, 60)
                continue
            fired += 1
            if fired >= events:
                if not done.triggered:
                    done.succeed()
                return
            delay = rng.uniform(1, 60)
            if rng.random() < 0.1:
                other = rng.randrange(jobs)
                if other != j and procs[other].is_alive and procs[other].target is not None:
                    procs[other].interrupt()

    for j in range(jobs):
        procs[j] = env.process(job(j, rng.uniform(0, 60)))
    env.run(until=done)
    return fired


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    impls = [("engine", run_engine)]
    try:
        import simpy

        print(f"SimPy {simpy.__version__}")
        impls += [("simpy-callbacks", run_simpy_callbacks),
                  ("simpy-processes", run_simpy_processes)]
    except ImportError:
        print("SimPy is not installed: only the engine is measured (pip install simpy)")
    print(f"jobs={args.jobs} events={args.events} repeat={args.repeat} (best of repeats)")
    base = None
    for name, fn in impls:
        best = float("inf")
        for r in range(args.repeat):
            t0 = time.perf_counter()
            fired = fn(args.jobs, args.events, seed=r)
            best = min(best, time.perf_counter() - t0)
        rate = fired / best
        base = base or best
        print(f"{name:16s} {best:7.3f} s  {rate / 1e3:8.1f} k events/s  "
              f"time ratio to engine {best / base:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
