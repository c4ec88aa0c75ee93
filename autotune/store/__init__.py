"""The Optuna storage: opened, claimed per run name, and indexed by (problem, part, M) for both searches."""
