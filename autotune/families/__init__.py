"""The kernel families, one package each, plugins above the core: each answers the contract of
autotune.contract.protocol and is found by autotune.contract.registry (its rules, inputs, reference, baselines,
launch and files). The search, the measuring and the store name no family's keys."""
