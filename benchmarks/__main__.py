"""``python -m benchmarks``: run the benchmark suite (see benchmarks/README.md)."""
import sys

from .runner import main

sys.exit(main())
