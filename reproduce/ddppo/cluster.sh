#!/usr/bin/env bash
# The paper's DD-PPO comparison on a SLURM cluster with habitat-sim: every registered optimizer at the
# paper's GPU counts, experiment=paper_ddppo (habitat-lab PointNav on Gibson). See reproduce/ddppo/README.md.
#   reproduce/ddppo/cluster.sh DATA_ROOT [--dry-run | --submit | --submitit] [more overrides]
# DATA_ROOT: the folder holding habitat's data/scene_datasets/gibson and data/datasets/pointnav/gibson/v1.
# Environment: CLUSTER (profile in conf/cluster/, default daint), GPUS (default 64,256,1024),
# LOGGER (default wandb: offline where WANDB_MODE=offline, docs/slurm.md "W&B on compute nodes"),
# WAGMA_BENCH (default: the repository's .venv, else PATH), SEEDS (default 1), OPTIMIZERS (default: all registered), UPDATES (PPO updates per run, default 500).
set -euo pipefail
root=${1:?usage: cluster.sh DATA_ROOT [--dry-run | --submit | --submitit] [overrides]}
shift
optimizers=${OPTIMIZERS:-'glob(*)'}  # every optimizer in conf/optimizer/
source "$(dirname "$0")/../bench_path.sh"  # sets bench: WAGMA_BENCH, the repository's .venv or PATH
exec "$bench" sweep cluster="${CLUSTER:-daint}" gpus="${GPUS:-64,256,1024}" experiment=paper_ddppo \
    env.data_root="$root" optimizer="$optimizers" seeds="${SEEDS:-1}" train.epochs="${UPDATES:-500}" logger="${LOGGER:-wandb}" "$@"
