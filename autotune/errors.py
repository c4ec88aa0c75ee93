"""The error every step raises for bad input: the command prints its one line and exits 2."""


class UsageError(Exception):
    """Bad input: one line on stderr, exit code 2."""
