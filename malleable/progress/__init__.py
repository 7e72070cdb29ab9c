"""The job contract's data path: progress files from jobs to the database.

Modules (docs/progress-format.md describes the files, docs/job-author-guide.md
the job's side):

* ``reporter``: the job side, standard library only (it imports inside any
  training environment): `Reporter` (progress lines, the checkpoint-signal
  flag, Slurm's environment, the daemon's plan), atomic checkpoints.
* ``lines``: one progress line -> a typed record or a rejection reason.
* ``spool``: safe, bounded reads of the spool directory (no symlinks, owner
  check, new bytes only) and the framing of a read into lines.
* ``ingest``: the daemon's (and the simulator's) ingest step: new lines into
  progress samples, job events and per-file offsets and rejection counts.
* ``plan``: the daemon writes a requeued job's plan file (size, batch size).
* ``cli``: ``malleable report ...`` for jobs not written in Python.
"""
