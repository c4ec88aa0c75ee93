"""The README's main job writes the same bytes as the recording of it: a refactor that changes what
`autotune run` decides, writes or says is seen here (issue 24's rule: behaviour unchanged).

The job is the README's own first command line, run as the README runs it (a fresh process, in an
empty folder holding the committed recordings at their README paths). Compared with the recording
(tests/data/readme_main_job.json.gz, made by this file's `record` at the commit the check was
written on):
- every file it writes under tuned_configs/, byte for byte, except the timestamps two runs of one
  commit never share (ISO-8601 dates in provenance.json, backend_choice.json and server_args.yaml:
  the export time) and provenance's `wall_seconds` (wall-clock time); a run's `device_seconds` is the
  replay's recorded device time and is compared;
- its Optuna storage autotune.db, every row of every table (study and trial ids, names, params,
  values, attributes), except the trials' start/complete times and the run's `opened` time;
- what it prints on stdout, line for line (it prints no time of day).
Re-record (only when a change of behaviour is meant): `python -m tests.repo.test_readme_main_job record`.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from tests.fakes.main_job import GOLDEN, assert_as_recorded, outputs, run_main_job


@pytest.mark.slow
def test_the_readme_main_job_writes_what_it_wrote_before(tmp_path):
    assert_as_recorded(outputs(tmp_path, run_main_job(tmp_path)))


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        rec = outputs(Path(d), run_main_job(Path(d)))
    GOLDEN.write_bytes(gzip.compress(json.dumps(rec, sort_keys=True).encode(), mtime=0))
    print(f"wrote {GOLDEN}: {len(rec['files'])} files, {sum(len(t['rows']) for t in rec['storage'].values())} "
          "storage rows, the stdout")
