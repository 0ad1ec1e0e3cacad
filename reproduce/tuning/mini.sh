#!/usr/bin/env bash
# Tuned comparisons on this machine (docs/tuning.md): AlgoPerf's external tuning at a budget a 2-core
# machine affords, then one report over all of them.
#   reproduce/tuning/mini.sh [transformer|resnet_paper|ddppo ...]   (default: all three)
# Environment: OPTIMIZERS (default allreduce,wagma), TRIALS (O, default 2), STUDIES (S, default 2),
# OUT (default tuned/<date>). Rerunning the same command skips finished trials and resumes a killed one.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${WAGMA_BENCH:-.venv/bin/wagma-bench}
optimizers=${OPTIMIZERS:-allreduce,wagma}
budget=(tune.trials="${TRIALS:-2}" tune.studies="${STUDIES:-2}")
out=${OUT:-tuned/$(date +%Y%m%d)}
# Per workload: its overrides and the trial cap (tune.max_runtime_s, about 2.5x the untuned
# Allreduce-SGD's time to target here; a trial past it counts as missing the target).
declare -A setup=(
  [transformer]="workload=transformer tune.max_runtime_s=150"
  [resnet_paper]="workload=resnet imbalance=paper tune.max_runtime_s=150"
  [ddppo]="workload=ddppo tune.max_runtime_s=150"
)
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(transformer resnet_paper ddppo)
for w in "${workloads[@]}"; do
  [ -n "${setup[$w]:-}" ] || { echo "unknown workload '$w'; one of: ${!setup[*]}" >&2; exit 2; }
  # shellcheck disable=SC2086  # the setup string is a list of overrides
  "$bin" tune ${setup[$w]} optimizer="$optimizers" "${budget[@]}" logger.progress=off --out "$out/$w"
done
"$bin" report "${workloads[@]/#/$out/}" --out "$out/report"
echo "report: $out/report"
