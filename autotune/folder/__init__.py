"""The tuned folder as one product: its handle (`tuned.TunedFolder`: paths, provenance.json's one reader and
writer, every file's hash, the change), the change that swaps a whole folder at once, the schemas of what
provenance records, and `autotune check`."""
