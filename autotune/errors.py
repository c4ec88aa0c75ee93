"""The error every step raises for bad input: the command prints its one line and exits 2."""


class UsageError(Exception):
    """Bad input: one line on stderr, exit code 2."""


class NothingDone(Exception):
    """The run went through and nothing useful came of it (no backend ran correctly anywhere): one line
    on stderr, exit code 1, and no file written for it (exit 0 means something useful was written)."""
