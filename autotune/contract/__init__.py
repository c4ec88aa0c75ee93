"""The contract between the core and the kernel families: the protocol every family answers (`protocol.py`, a
typing.Protocol with every hook the core calls), the registry that finds the families (`registry.py`), the
search spaces (`spaces.py`), and what backend-choice families share (`backend_family.py`; `runner.py`: a backend
is a runner object in one file; `capabilities.py`: which backends a run launches and what their declarations
predict). The core (measure, store, search, the folder) imports this package, never a family: the families are
plugins above it (autotune/families/)."""
