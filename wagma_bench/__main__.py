import sys

from wagma_bench.cli import entry

sys.exit(entry())
