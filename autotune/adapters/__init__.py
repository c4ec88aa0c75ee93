"""The one door to SGLang's and FlashInfer's internals: their config loader, their layers built outside a server,
checkpoint-format weights, FlashInfer's autotuner cache and SGLang's release history. Nothing else in autotune
imports a private SGLang or FlashInfer symbol (tests/repo/test_layers.py)."""
