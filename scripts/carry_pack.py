"""Packs a wheel (or an unpacked, patched package tree) into a solid xz tarball for a device carry:
xz of the whole is ~4x smaller than a wheel's zip. Used by scripts/carry_lib.sh.

usage: python carry_pack.py SOURCE OUT.tar.xz [--drop PREFIX]... [--keep-so PREFIX]... [--no-so]
SOURCE: a .whl, or a folder (a wheel unpacked and patched). Always left out: dist-info/RECORD,
__pycache__. --drop: path prefixes left out. --keep-so: when given, only .so files under these
prefixes are kept (the rest of the package's compiled extensions are left out); --no-so: none."""
import argparse
import io
import os
import tarfile
import zipfile


def files(source):
    """(name, bytes loader) of every file of a wheel or a folder."""
    if os.path.isdir(source):
        for d, _, fs in sorted(os.walk(source)):
            for f in sorted(fs):
                path = os.path.join(d, f)
                yield os.path.relpath(path, source), (lambda p=path: open(p, "rb").read())
        return
    z = zipfile.ZipFile(source)
    for i in z.infolist():
        if not i.filename.endswith("/"):
            yield i.filename, (lambda i=i: z.read(i))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--keep-so", action="append", default=None)
    ap.add_argument("--no-so", action="store_true")
    a = ap.parse_args()
    if a.no_so:
        a.keep_so = []
    n = 0
    with tarfile.open(a.out, "w:xz", preset=9) as t:
        for name, load in files(a.source):
            if name.endswith("dist-info/RECORD") or "__pycache__" in name or name.startswith(tuple(a.drop)):
                continue
            if a.keep_so is not None and name.endswith(".so") and not name.startswith(tuple(a.keep_so)):
                continue
            data = load()
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o755 if name.endswith(".so") else 0o644
            t.addfile(ti, io.BytesIO(data))
            n += 1
    print(f"{os.path.basename(a.out)}: {n} files, {os.path.getsize(a.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
