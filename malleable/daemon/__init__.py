"""The daemon: poll, ingest, decide, apply.

Owns the APScheduler service and its jobs, the decision cycle (which receives
its clock, SlurmClient and progress source as parameters so the simulator can
run it unchanged), the reconciler (plan vs. observed Slurm state -> actions),
the actuator (a crash-safe state machine per action, each step recorded before
it runs), modes (dry-run, pause, once), systemd integration and metrics.
"""
