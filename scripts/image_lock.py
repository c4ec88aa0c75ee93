"""The image's lock, Dockerfile.pip-freeze.txt: what pip installs in autotune's image, exactly.

    python3 scripts/image_lock.py write FREEZE --built-from TEXT [--index URL ...] > Dockerfile.pip-freeze.txt
    python3 scripts/image_lock.py compare LOCK FREEZE

`write` turns a `pip freeze` of an image built with IMAGE_STACK=resolve (scripts/lock_image.sh) into the
lock: each package pinned, with the sha256 of every file the index offers for that version (its simple
API, PEP 691 JSON or PEP 503 HTML, asked once per package: this is the deliberate refresh, never part of
a build). pip's hash checking is all or nothing, so where an index gives no hash for some package the
lock is written without hashes and says which. `compare` is the drift check of a build
(scripts/build_image.sh): the image's freeze must hold exactly the lock's pins; else one line naming the
differences and exit 1.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

HEADER = ("# The image's lock: pip installs exactly this in autotune's image (Dockerfile: --no-deps -r this file).\n"
          "# Refreshed on purpose only: bash scripts/lock_image.sh (resolves the stack afresh and writes this file).\n")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.M)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, tuple[str, str]]:
    """canonical name -> (name as written, version), for every `name==version` line of a freeze or lock."""
    return {canonical(m.group(1)): (m.group(1), m.group(2)) for m in PIN.finditer(text)}


def _file_version(filename: str, name: str) -> str | None:
    """The version a distribution file's name carries (a wheel's second field, an sdist's suffix)."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip", ".tar.bz2"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            head = re.match(r"^(.+?)-(\d.*)$", stem)
            return head.group(2) if head and canonical(head.group(1)) == canonical(name) else None
    return None


def index_hashes(index: str, name: str, version: str) -> list[str]:
    """sha256 of every file `index` offers for name==version ([] where it offers none or gives no hash)."""
    url = f"{index.rstrip('/')}/{canonical(name)}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            kind, body = r.headers.get("Content-Type", ""), r.read().decode("utf-8", "replace")
    except OSError:
        return []
    if "json" in kind:
        files = [(f["filename"], (f.get("hashes") or {}).get("sha256")) for f in json.loads(body).get("files", [])]
    else:
        files = [(m.group(2), m.group(1)) for m in
                 re.finditer(r'<a[^>]*href="[^"#]*#sha256=([0-9a-f]{64})"[^>]*>([^<]+)</a>', body)]
    return sorted({h for f, h in files if h and _file_version(f, name) == version})


def lock_text(freeze: str, built_from: str, indexes: list[str]) -> tuple[str, list[str]]:
    """(the lock, the packages no index gave a hash for)."""
    pinned = sorted(pins(freeze).values(), key=lambda nv: canonical(nv[0]))
    hashes = {}
    for name, version in pinned:
        hashes[name] = next((h for h in (index_hashes(i, name, version) for i in indexes) if h), [])
    missing = [n for n, h in hashes.items() if not h]
    lines = [HEADER + f"# Resolved FROM {built_from}.\n"]
    for name, version in pinned:
        if missing:          # pip's hash checking is all or nothing
            lines.append(f"{name}=={version}\n")
        else:
            lines.append(f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes[name]) + "\n")
    return "".join(lines), missing


def drift(lock: str, freeze: str) -> str:
    """'' where the freeze holds exactly the lock's pins, else what differs."""
    want = {n: v for n, (_, v) in pins(lock).items()}
    got = {n: v for n, (_, v) in pins(freeze).items()}
    parts = [f"{n} {want[n]} -> {got[n]}" for n in sorted(want) if n in got and got[n] != want[n]]
    parts += [f"{n} {want[n]} missing" for n in sorted(set(want) - set(got))]
    parts += [f"{n} {got[n]} not in the lock" for n in sorted(set(got) - set(want))]
    return ", ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("freeze")
    w.add_argument("--built-from", required=True)
    w.add_argument("--index", action="append", default=None)
    c = sub.add_parser("compare")
    c.add_argument("lock")
    c.add_argument("freeze")
    a = ap.parse_args(argv)
    if a.cmd == "write":
        text, missing = lock_text(Path(a.freeze).read_text(), a.built_from, a.index or ["https://pypi.org/simple"])
        sys.stdout.write(text)
        if missing:
            print(f"image_lock: no index gave a hash for {', '.join(missing[:5])}"
                  f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}: the lock pins versions only",
                  file=sys.stderr)
        return 0
    why = drift(Path(a.lock).read_text(), Path(a.freeze).read_text())
    if why:
        print(f"the image holds other packages than {a.lock}: {why} (the lock is what the image installs: "
              "refresh it on purpose with scripts/lock_image.sh)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
