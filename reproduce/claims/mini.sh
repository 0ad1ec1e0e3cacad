#!/usr/bin/env bash
# Every claim of reproduce/claims.yaml on this machine, then the table (docs/claims.md):
#   reproduce/claims/mini.sh        # about 15 hours on the 2-core development machine, idle
# Each tuning is AlgoPerf's external tuning (reproduce/tuning/mini.sh, trials of 1-3 minutes, the optimizers
# interleaved, a speed reference around each trial): the claims re-tuned under issue 54's protocol at 5 studies x
# 5 trials of their own optimizers, the others at 3 x 3 of their claims' optimizers or of every one (~540 trials); the
# paper-scale predictions take a few minutes. OUT chooses where (default tuned/claims-<date>); rerunning skips
# finished trials and resumes a killed one. Run it under the measure lock (flock /tmp/wagma-measure.lock ...) so
# that no other measurement shares the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${WAGMA_BENCH:-.venv/bin/wagma-bench}
out=${OUT:-tuned/claims-$(date +%Y%m%d)}
OUT="$out" STUDIES=5 TRIALS=5 OPTIMIZERS=allreduce,wagma reproduce/tuning/mini.sh ddppo_budget
OUT="$out" STUDIES=5 TRIALS=5 OPTIMIZERS=allreduce,local_sgd reproduce/tuning/mini.sh resnet_none
OUT="$out" STUDIES=5 TRIALS=5 OPTIMIZERS=allreduce,wagma,local_sgd,dpsgd,adpsgd,sgp,eager \
  reproduce/tuning/mini.sh resnet_independent
OUT="$out" OPTIMIZERS=wagma,local_sgd,dpsgd,adpsgd,sgp,eager reproduce/tuning/mini.sh ddppo_throughput
OUT="$out" OPTIMIZERS=allreduce,wagma,local_sgd,dpsgd,adpsgd,sgp,eager reproduce/tuning/mini.sh transformer_budget
OUT="$out" OPTIMIZERS=allreduce,wagma,local_sgd,dpsgd,adpsgd,sgp,eager \
  reproduce/tuning/mini.sh transformer transformer_sentences
# The paper's scales (simulator, Piz Daint's network from vendor figures); convergence from the tuned winners,
# the compute spread from the tuned runs (ResNet-50: per step, scaled to the preset's 0.32 s step; RL: per
# rollout and its PPO updates, scaled to the preset's 1 s step), the natural imbalance in place of an assumed one;
# AD-PSGD's exchange cost measured in the suite's own AD-PSGD (MEASURED: reproduce/scaling/measure_inputs.py's
# file, or make gpu-check's on a GPU); each prediction with INTERVAL resampled replicates and its flip conditions.
measured=${MEASURED:-reproduce/scaling/results-2core-20261206/measured-cpu.json}
interval=${INTERVAL:-100}
"$bin" simulate cluster=daint workload=resnet data=imagenet gpus=16,64 'optimizer=glob(*,exclude=dropcompute)' \
  imbalance=independent train.max_rounds=500 control_every=0 --measured "$measured" --interval "$interval" \
  --convergence "$out/resnet_independent" --compute-from "$out/resnet_independent" --out "$out/paper-scale/resnet50"
# The Transformer-base / WMT17 preset, once per batching (TUNING OUT): token batches and sentence batches
transformer() {
  "$bin" simulate cluster=daint workload=transformer data=wmt17_en_de gpus=16,32,64 'optimizer=glob(*)' imbalance=none \
    train.max_rounds=500 control_every=0 --measured "$measured" --interval "$interval" --convergence "$1" \
    --compute-from "$1" --out "$2"
}
transformer "$out/transformer" "$out/paper-scale/transformer"
transformer "$out/transformer_sentences" "$out/paper-scale/transformer_sentences"
# DD-PPO's batches do not split into micro-batches: DropCompute does not apply (run refuses it)
"$bin" simulate cluster=daint workload=ddppo gpus=64,256,1024 'optimizer=glob(*,exclude=dropcompute)' imbalance=none \
  train.max_rounds=500 control_every=0 --measured "$measured" --interval "$interval" \
  --compute-from "$out/ddppo_throughput" --out "$out/paper-scale/rl"
"$bin" claims "$out" --out "$out/claims"
