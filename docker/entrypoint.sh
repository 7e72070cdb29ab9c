#!/bin/sh
# Bring the harness up inside the container, export SLURM_CONF for every shell, then
# run the command (default: stay up so `docker compose exec` can submit jobs).
set -eu
/opt/malleable/scripts/slurm-harness up --nodes "$HARNESS_NODES" --gpus-per-node "$HARNESS_GPUS" \
  | tee /etc/profile.d/slurm-harness.sh
. /etc/profile.d/slurm-harness.sh
trap '/opt/malleable/scripts/slurm-harness down' TERM INT
"$@" &
wait $!
