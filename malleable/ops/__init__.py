"""Admin commands: what an operator runs at a terminal to see and steer the daemon.

One module per command group, each a thin click shell over a function that
builds the command's result as a plain JSON document; ``--json`` prints that
document, the default prints a text view of the same document
(`malleable.ops.output`). The documents' schemas live in
`malleable.ops.schemas` (rendered into docs/cli-json.md).

Modules:

* `output`: shared options (``--config``, ``--database-url``, ``--json``),
  errors and exit codes, text tables and time formatting.
* `access`: opening the state store for reading (also as a user who may only
  read the database file) or writing; `auth`: who may change things.
* `views`: derived numbers shared by the commands (recent throughput, the
  fitted goodput curve from a stored estimate, estimated remaining time).
* `status`, `job`, `plan`, `actions`, `control` (pause/resume), `policy`,
  `config`: the commands.
* `schemas`: the JSON schemas; `docgen`: writes docs/cli-json.md and
  docs/configuration.md (``python -m malleable.ops.docgen``).

Exit codes of every command here: 0 done; 1 the operation failed or was
refused (not allowed, Slurm did not answer, ``status --check`` found the
daemon unhealthy); 2 bad input (usage, a bad value, an unusable configuration
or database), with a one-line message on stderr and no traceback.
"""
