"""The tuned folder as one product: its files' schemas, provenance.json (the one reader and writer), the change
that swaps a whole folder at once, and `autotune check`."""
