"""Kernel families: the registry, the protocol a family answers, and one package per family (its rules, inputs,
reference, baselines and launch). The search, the measuring and the store name no family's keys."""
