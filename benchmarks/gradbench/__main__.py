"""``python -m benchmarks.gradbench``: see runner.py and README.md."""
import sys

from .runner import main

sys.exit(main())
