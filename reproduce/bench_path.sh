# Sourced by reproduce/*/cluster.sh: sets `bench` to the wagma-bench to run, found without an activated venv:
# WAGMA_BENCH if set, else the repository's .venv (make setup / make setup-user), else the one on PATH; else
# stops, saying which venv to activate. Its sweeps' jobs put the same venv on the nodes' PATH (venv: auto).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n ${WAGMA_BENCH:-} ]]; then
  bench=$WAGMA_BENCH
elif [[ -x $repo/.venv/bin/wagma-bench ]]; then
  bench=$repo/.venv/bin/wagma-bench
elif command -v wagma-bench >/dev/null; then
  bench=$(command -v wagma-bench)
else
  echo "wagma-bench not found: not in $repo/.venv (make setup-user) nor on PATH; activate the venv you installed" \
    "it into (source VENV/bin/activate, e.g. make setup-user VENV=\$HOME/venvs/wb) or set WAGMA_BENCH=VENV/bin/wagma-bench" >&2
  exit 2
fi
[[ -x $bench ]] || { echo "WAGMA_BENCH=$bench is not an executable wagma-bench" >&2; exit 2; }
