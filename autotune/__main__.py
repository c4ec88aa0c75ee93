"""`python -m autotune ...`: the console script without an install (device machines, containers)."""
import sys

from autotune.cli import main

sys.exit(main())
