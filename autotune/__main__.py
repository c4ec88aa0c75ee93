"""`python -m autotune ...`: the console script without an install (device machines, containers)."""
import sys

from .cli import main

sys.exit(main())
