#!/bin/bash
# The teardown stress loop: N short runs, alternating 2 ranks of WAGMA-SGD (progress
# and listener threads, forked planes) and 4 of eager-SGD, each to its last collective and teardown, beside
# one busy loop at normal priority (another job on the node: the ranks' teardowns interleave). One line per
# run in OUT/log.txt: exit code, summary status, and whether its stderr holds an abort.
#
#   reproduce/teardown/stress.sh CODE_DIR OUT_DIR N      e.g. a `git worktree` of the commit to try
#
# CODE_DIR's wagma_bench is imported (PYTHONPATH) with this checkout's .venv; the runs write under OUT_DIR.
set -u
code=$(realpath "$1"); out=$(realpath -m "$2"); n=$3
python=$(dirname "$(realpath "$0")")/../../.venv/bin/python
mkdir -p "$out"
python3 -c "while True: pass" & busy=$!
trap 'kill $busy' EXIT
cd "$code" || exit 2
for i in $(seq 0 $((n - 1))); do
  if (( i % 2 == 0 )); then np=2; opt=wagma; else np=4; opt=eager; fi
  t0=$(date +%s.%N)
  PYTHONPATH=$code "$python" -m wagma_bench run launcher.nproc=$np optimizer=$opt train.max_rounds=2 \
    eval.every_rounds=2 checkpoint.every_s=1e9 logger.progress=off "hydra.run.dir=$out/$i" > "$out/$i.out" 2> "$out/$i.err"
  rc=$?
  status=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['status'])" "$out/$i/summary.json" 2>/dev/null)
  abort=$(grep -c "SIGABRT\|Aborted\|terminate called" "$out/$i.err")
  printf '%s np=%s %s rc=%s status=%s abort=%s took=%.1f\n' "$i" "$np" "$opt" "$rc" "$status" "$abort" \
    "$(echo "$(date +%s.%N) - $t0" | bc)" | tee -a "$out/log.txt"
done
