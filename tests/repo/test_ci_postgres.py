"""scripts/start-postgres.sh as .ci/run uses it: each cluster in a folder of its own on a free port (two
checkouts' CI runs never share one: a fixed /tmp/autotune-pg on 55432 was reused by another checkout's
CI), the same cluster again on the same port, and `--stop` leaving no server and no folder behind."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")),
                                 reason="no PostgreSQL server installed (Debian's postgresql package)")]


def _start(data: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts/start-postgres.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, "AUTOTUNE_PG_DATA": str(data)}, timeout=300)


def _answers(url: str) -> bool:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as c:
            return c.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    except sqlalchemy.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def test_two_clusters_take_two_free_ports_and_stop_leaves_nothing():
    # the postgres user (when run as root) makes and writes these: a folder it can reach, not pytest's 0700 one
    scratch = Path(tempfile.mkdtemp(prefix="autotune-pg-test-", dir="/tmp"))
    scratch.chmod(0o1777)
    first, second = scratch / "a", scratch / "b"
    try:
        urls = []
        for data in (first, second):
            r = _start(data)
            assert r.returncode == 0, r.stderr
            urls.append(r.stdout.strip().splitlines()[-1])
        assert urls[0] != urls[1] and all(_answers(u) for u in urls)
        again = _start(first)
        assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == urls[0]     # reused, same port
        for data, url in zip((first, second), urls):
            assert _start(data, "--stop").returncode == 0
            assert not _answers(url)
            assert not [p for p in scratch.iterdir() if p.name.startswith(data.name)]
        bad = _start(first, "--stopp")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    finally:
        for data in (first, second):
            _start(data, "--stop")
        shutil.rmtree(scratch, ignore_errors=True)
