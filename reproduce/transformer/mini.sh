#!/usr/bin/env bash
# The Transformer comparison on this machine: the embedded synthetic_mt corpus, 4 local ranks, every
# registered optimizer one after another, then the report. See reproduce/transformer/README.md.
#   reproduce/transformer/mini.sh [more overrides]      (SEEDS=1,2,3 for three seeds)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${WAGMA_BENCH:-.venv/bin/wagma-bench}
optimizers=${OPTIMIZERS:-$(.venv/bin/python -c "from wagma_bench.optim import OPTIMIZERS; print(','.join(OPTIMIZERS))")}
out=multirun/transformer_mini_$(date +%Y%m%d-%H%M%S)
"$bin" run -m workload=transformer optimizer="$optimizers" seed="${SEEDS:-1}" logger.progress=lines \
    hydra.sweep.dir="$out" "$@"
"$bin" report "$out" --out "$out/report"
echo "report: $out/report"
