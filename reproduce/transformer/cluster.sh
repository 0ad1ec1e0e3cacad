#!/usr/bin/env bash
# The paper's Transformer / WMT17 En-De comparison on a SLURM cluster: every registered optimizer at the
# paper's GPU counts, experiment=paper_transformer. See reproduce/transformer/README.md.
#   reproduce/transformer/cluster.sh DATA_DIR [--dry-run | --submit | --submitit] [more overrides]
# DATA_DIR: the fairseq-binarized WMT17 En-De directory (reproduce/transformer/README.md, "Preparing WMT17 English-German").
# Environment: CLUSTER (profile in conf/cluster/, default daint), GPUS (default 16,32,64),
# LOGGER (default wandb: offline where WANDB_MODE=offline, docs/slurm.md "W&B on compute nodes"),
# WAGMA_BENCH (default: the repository's .venv, else PATH), SEEDS (seeds per configuration, default 1), OPTIMIZERS (default: all registered).
set -euo pipefail
data=${1:?usage: cluster.sh DATA_DIR [--dry-run | --submit | --submitit] [overrides]}
shift
optimizers=${OPTIMIZERS:-'glob(*)'}  # every optimizer in conf/optimizer/
source "$(dirname "$0")/../bench_path.sh"  # sets bench: WAGMA_BENCH, the repository's .venv or PATH
exec "$bench" sweep cluster="${CLUSTER:-daint}" gpus="${GPUS:-16,32,64}" experiment=paper_transformer \
    data.path="$data" optimizer="$optimizers" seeds="${SEEDS:-1}" logger="${LOGGER:-wandb}" "$@"
