import sys

from wagma_bench.cli import main

sys.exit(main())
