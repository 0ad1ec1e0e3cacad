#!/usr/bin/env bash
# The DD-PPO comparison on this machine: MiniWorld point-goal navigation (the embedded default), 4 local
# ranks, every registered optimizer one after another under a fixed training-time budget, then the
# report. See reproduce/ddppo/README.md.
#   reproduce/ddppo/mini.sh [more overrides]      (SEEDS=1,2,3 for three seeds; TIME_S=600 per run)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${WAGMA_BENCH:-.venv/bin/wagma-bench}
optimizers=${OPTIMIZERS:-$(.venv/bin/python -c "from wagma_bench.optim import OPTIMIZERS; print(','.join(OPTIMIZERS))")}
out=multirun/ddppo_mini_$(date +%Y%m%d-%H%M%S)
"$bin" run -m workload=ddppo optimizer="$optimizers" seed="${SEEDS:-1}" train.time_limit_s="${TIME_S:-600}" \
    logger.progress=lines hydra.sweep.dir="$out" "$@"
"$bin" report "$out" --out "$out/report"
echo "report: $out/report"
