#!/usr/bin/env bash
# The claims at the paper's scale on a SLURM cluster: every tuning as a sweep of SLURM jobs, then the table.
#   CLUSTER=daint reproduce/claims/cluster.sh submit   # render and submit every tuning (sbatch)
#   CLUSTER=daint reproduce/claims/cluster.sh finish   # after the jobs: wait, score, predict, the table
#   CLUSTER=daint reproduce/claims/cluster.sh dry-run  # render only, submit nothing
# CLUSTER names conf/cluster/NAME.yaml; OUT (default tuned/claims-cluster) holds one tuning directory per setup,
# named as reproduce/claims.yaml's `measured.tuning` reads them. Budget: 3 studies x 3 trials per optimizer,
# i.e. 63 jobs per setup; GPUS (default 64) for the tunings, the paper's ResNet-50 and Transformer scale.
# IMAGENET (data.root) and WMT (fairseq's binarized WMT17 En-De, data.path) name the data sets on the cluster
# (docs/workloads.md); DD-PPO needs habitat-sim there. LOGGER (default wandb: offline where WANDB_MODE=offline;
# sync, then `wagma-bench report --wandb`: docs/slurm.md); WAGMA_BENCH (default: the repository's .venv, else PATH).
set -euo pipefail
cd "$(dirname "$0")/../.."
source reproduce/bench_path.sh  # sets bench: WAGMA_BENCH, the repository's .venv or PATH
bin=$bench
cluster=${CLUSTER:?CLUSTER=NAME (conf/cluster/NAME.yaml)}
out=${OUT:-tuned/claims-cluster}
gpus=${GPUS:-64}
imagenet=${IMAGENET:?IMAGENET=DIR (ImageNet for torchvision)}
wmt=${WMT:?WMT=DIR (binarized WMT17 En-De)}
mode=${1:?submit | finish | dry-run}
declare -A setup=(
  [resnet_independent]="experiment=paper_resnet50 data.root=$imagenet imbalance=independent"
  [resnet_none]="experiment=paper_resnet50 data.root=$imagenet imbalance=none"
  [transformer]="experiment=paper_transformer data.path=$wmt"
  [transformer_budget]="experiment=paper_transformer data.path=$wmt eval.target=null"
  [ddppo_throughput]="experiment=paper_ddppo eval.target=null"
  [ddppo_budget]="experiment=paper_ddppo eval.target=null"
)
case "$mode" in
  submit|dry-run)
    for s in "${!setup[@]}"; do
      optimizers='glob(*)'
      [[ $s == ddppo* ]] && optimizers='glob(*,exclude=dropcompute)'  # DD-PPO's batches do not split
      # shellcheck disable=SC2086  # the setup string is a list of overrides
      "$bin" tune cluster="$cluster" gpus="$gpus" optimizer="$optimizers" ${setup[$s]} tune.trials=3 tune.studies=3 \
        logger="${LOGGER:-wandb}" \
        --out "$out/$s" "--$mode"
    done ;;
  finish)
    for s in "${!setup[@]}"; do "$bin" sweep wait "$out/$s"; "$bin" tune score "$out/$s"; done
    "$bin" simulate cluster="$cluster" workload=resnet data=imagenet gpus=64 'optimizer=glob(*)' imbalance=independent \
      control_every=0 --convergence "$out/resnet_independent" --compute-from "$out/resnet_independent" \
      --out "$out/paper-scale/resnet50"
    "$bin" simulate cluster="$cluster" workload=ddppo gpus=1024 'optimizer=glob(*,exclude=dropcompute)' imbalance=none \
      control_every=0 --compute-from "$out/ddppo_throughput" --out "$out/paper-scale/rl"
    "$bin" claims "$out" --out "$out/claims" ;;
  *) echo "unknown mode '$mode': submit | finish | dry-run" >&2; exit 2 ;;
esac
