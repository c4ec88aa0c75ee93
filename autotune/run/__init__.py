"""`autotune run` and its kin (`worker`, `export`, `record`): the pipeline, its steps and what it prints."""
