"""Search: the TPE studies and their policy, warm start, search spaces, the exhaustive sieve of backends and
tactics, and the finalists' re-measurement that declares a winner."""
