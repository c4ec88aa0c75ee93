"""Measurement records and the measurement cache file.

A record is one (problem, GEMM, M, config) measurement with an explicit status: a failure
is a record with a reason, never a special timing value. The cache file is gzipped JSON
lines: a header naming the device and versions, then one record per line. It is what
`--record` writes and what `--replay` reads in place of a GPU.
"""
from __future__ import annotations

import collections
import copy
import gzip
import io
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from autotune.fileio.reading import parse_json, require_regular
from autotune.contract.config import KernelConfig, config_key  # noqa: F401  (config_key: the records' identity)

OK = "ok"
# Failure statuses. "invalid" is rejected before launch (costs nothing).
INVALID = "invalid"
COMPILE_ERROR = "compile_error"
OUT_OF_RESOURCES = "out_of_resources"
WRONG_RESULT = "wrong_result"
RUNTIME_ERROR = "runtime_error"
CRASH = "crash"
TIMEOUT = "timeout"
NOT_RECORDED = "not_recorded"   # replay: the cache has no measurement for this
# The environment lacks a module the launch imports (an ImportError): the machine's fault, not the
# backend's. Backend choice shows it as skipped, never disqualifies on it and never stores it in
# the study, so a re-run on a fixed machine measures the backend.
UNAVAILABLE = "unavailable"
# SGLang (or FlashInfer through it) declined the backend for these weights on this GPU, by its own
# check, before any kernel ran ("Current platform does not support NVFP4 ..."): a failure of the
# backend here, shown as SGLang's answer.
REFUSED = "refused"
# The GPU's memory or the GPU itself was not there for the measurement (CUDA out of memory, a device busy
# or unavailable, a context lost to either): the machine's state, never the config's verdict. The pool
# retries such a measurement with fewer workers (autotune.measure.pool) and never hands it to a study; a
# storage or a recording of an earlier release that holds one as a runtime error or a crash is read
# as not measured (`is_resource_failure`), so it is measured again.
RESOURCE = "resource"
STATUSES = (OK, INVALID, COMPILE_ERROR, OUT_OF_RESOURCES, WRONG_RESULT, RUNTIME_ERROR, CRASH, TIMEOUT, NOT_RECORDED,
            UNAVAILABLE, REFUSED, RESOURCE)
# What CUDA, torch, cuBLAS and cuDNN say when memory or the device is not there (Triton's "out of
# resource: shared memory" is a config's own limit, OUT_OF_RESOURCES, and is not matched).
_RESOURCE_TEXT = re.compile(r"out of memory|OutOfMemoryError|busy or unavailable|ALLOC_FAILED|"
                            r"cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorDevicesUnavailable",
                            re.IGNORECASE)


def is_resource_reason(reason: str) -> bool:
    return bool(_RESOURCE_TEXT.search(reason or ""))


def is_resource_failure(m) -> bool:
    """A failure of the machine, not of the config: this release's RESOURCE status, or an earlier
    release's runtime error or crash whose reason says out of memory or a busy device."""
    return m.status == RESOURCE or (m.status in (RUNTIME_ERROR, CRASH) and is_resource_reason(m.reason))

CACHE_KIND = "autotune-measurement-cache"
CACHE_VERSION = 1


@dataclass
class Measurement:
    problem: str               # Problem.key
    gemm: str
    M: int
    config: KernelConfig       # a record's "config" entry, read as one (from_dict)
    status: str
    reason: str = ""
    time_us: float | None = None
    spread: float | None = None
    error: float | None = None
    compile_s: float = 0.0     # first launch (compile + load) in its worker
    bench_s: float = 0.0       # GPU-exclusive timing seconds
    samples: int = 0
    # The tactics the backend's runner offered for this problem at this M (JSON form), when the
    # task asked for them: FlashInfer enumerates them on the GPU, for the shapes at hand.
    tactics: list | None = None
    # A paired timing (worker.Task.versus): the median time of the config timed alternately beside
    # this one in one hold of the GPU (its backend's default) and the spread of the per-round ratios.
    versus_us: float | None = None
    versus_spread: float | None = None

    def __post_init__(self):
        # Records come from files (recordings, --record caches): a wrong one is refused where it is made.
        if not (isinstance(self.problem, str) and isinstance(self.gemm, str) and type(self.M) is int and self.M > 0
                and isinstance(self.config, KernelConfig) and self.status in STATUSES and isinstance(self.reason, str)):
            raise ValueError(f"not a measurement record (problem {self.problem!r:.40}, gemm {self.gemm!r:.20}, "
                             f"M {self.M!r:.20}, status {self.status!r:.20})")
        for name in ("time_us", "spread", "error", "versus_us", "versus_spread", "compile_s", "bench_s"):
            v = getattr(self, name)
            if v is not None and type(v) not in (int, float):
                raise ValueError(f"measurement {name} must be a number, got {v!r:.30}")
        for name in ("time_us", "compile_s", "bench_s"):     # what ranks configs and prices a replay
            v = getattr(self, name)                        # (a wrong result's error may be NaN)
            if v is not None and (v != v or v in (float("inf"), float("-inf")) or v < 0):
                raise ValueError(f"measurement {name} must be a finite non-negative number, got {v!r:.30}")
        if self.ok and not self.time_us:      # a 0 us config would win every M it was recorded at
            raise ValueError(f"an ok measurement's time_us must be above 0, got {self.time_us!r:.30}")
        if self.spread is not None and not (0 <= self.spread < float("inf")):    # also NaN
            raise ValueError(f"measurement spread must be a finite non-negative number, got {self.spread!r:.30}")
        if self.compile_s is None or self.bench_s is None:
            raise ValueError("measurement compile_s and bench_s must be numbers (0 where nothing ran)")
        if type(self.samples) is not int or self.samples < 0 or (self.tactics is not None and not isinstance(self.tactics, list)):
            raise ValueError("measurement samples must be an integer and tactics a list")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def key(self) -> tuple:
        return (self.problem, self.gemm, self.M, self.config.key)

    def to_dict(self) -> dict:
        """The record as a file holds it (a recording's line, a study's attribute)."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["config"], d["tactics"] = self.config.to_entry(), copy.deepcopy(self.tactics)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        """A record a file holds (`to_dict`'s form); a config that is not a JSON object of values is refused."""
        row = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if "config" in row:
            if not isinstance(row["config"], dict) or not all(isinstance(k, str) for k in row["config"]):
                raise ValueError(f"a measurement record's config must be a JSON object, got {row['config']!r:.40}")
            row["config"] = KernelConfig.from_entry(row["config"])
        return cls(**row)


def failure(problem: str, gemm: str, M: int, config: KernelConfig, status: str, reason: str, **kw) -> Measurement:
    return Measurement(problem, gemm, M, config, status, reason[:500], **kw)


@dataclass
class Cache:
    device: dict
    records: dict = field(default_factory=dict)   # Measurement.key -> Measurement
    problems: dict = field(default_factory=dict)  # Problem.key -> Problem.to_dict()
    notes: dict = field(default_factory=dict)
    # Re-measurements with more repeats (backend choice re-times its finalists), same keys: a
    # replay answers a careful task with them, so it makes the decisions the GPU run made.
    careful: dict = field(default_factory=dict)

    def add(self, m: Measurement, careful: bool = False) -> None:
        # A later measurement of the same key replaces an earlier one unless the earlier was OK
        # and the later is not (merging partial recordings keeps what worked).
        book, key = (self.careful if careful else self.records), m.key
        old = book.get(key)
        if old is None or m.ok or not old.ok:
            book[key] = m

    def get(self, problem: str, gemm: str, M: int, config: KernelConfig, careful: bool = False) -> Measurement | None:
        key = (problem, gemm, M, config.key)
        return (self.careful.get(key) if careful else None) or self.records.get(key)

    def copy(self) -> "Cache":
        """A cache whose books can change without changing this one's (Measurements are never
        changed in place: add replaces them)."""
        return Cache(copy.deepcopy(self.device), dict(self.records), dict(self.problems), copy.deepcopy(self.notes),
                     dict(self.careful))


def is_cache(path: Path) -> bool:
    """Ours: a file whose first line is a measurement cache's header."""
    for opener in (lambda: gzip.open(require_regular(path), "rt"), lambda: open(require_regular(path))):
        try:
            with opener() as f:
                return parse_json(f.readline()).get("kind") == CACHE_KIND
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, AttributeError):
            continue
    return False


CACHE_OURS = is_cache


def write_cache(path: str | Path, cache: Cache) -> None:
    """Through the one writer (atomic); never over a file that is not a measurement cache."""
    with atomic_file_for(path) as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        f.write(json.dumps({"kind": CACHE_KIND, "version": CACHE_VERSION, "device": cache.device,
                            "problems": cache.problems, "notes": cache.notes}) + "\n")
        for book, extra in ((cache.records, {}), (cache.careful, {"careful": True})):
            for m in sorted(book.values(), key=lambda r: (r.problem, r.gemm, r.M, r.config.key)):
                f.write(json.dumps({**m.to_dict(), **extra}, separators=(",", ":")) + "\n")
        f.flush()
        gz.flush()


def atomic_file_for(path):
    from autotune.fileio.writing import atomic_file, claim
    claim(path, CACHE_OURS)
    return atomic_file(path)


class CacheError(ValueError):
    pass


# Recordings read in this process, by (path, inode, size, mtime): one process that runs several replays
# (the test suite, a run of several families) parses a 30k-record recording once, not per run.
_READ: collections.OrderedDict = collections.OrderedDict()
_READ_KEEP = 4


def read_cache(path: str | Path) -> Cache:
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        st = None
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns) if st is not None else None
    if key in _READ:
        _READ.move_to_end(key)
        return _READ[key].copy()
    cache = _parse_cache(path)
    if key is not None:
        _READ[key] = cache.copy()
        while len(_READ) > _READ_KEEP:
            _READ.popitem(last=False)
    return cache


def _parse_cache(path: Path) -> Cache:
    try:
        with open(require_regular(path), "rb") as raw:       # gzipped or not by its bytes, whatever its name
            zipped = raw.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rt") if zipped else open(path) as f:
            header = parse_json(f.readline())
            if not isinstance(header, dict) or header.get("kind") != CACHE_KIND:
                raise CacheError(f"{path} is not an autotune measurement cache")
            if header.get("version") != CACHE_VERSION or type(header.get("version")) is not int:
                raise CacheError(f"{path}: cache version {header.get('version')!r:.20} not supported (want {CACHE_VERSION})")
            why = header_problem(header)
            if why:
                raise CacheError(f"{path}: unreadable measurement cache ({why})")
            cache = Cache(header["device"], problems=header.get("problems", {}), notes=header.get("notes", {}))
            for line in f:
                if line.strip():
                    row = parse_json(line)
                    careful = row.pop("careful", False)
                    cache.add(Measurement.from_dict(row), careful=careful)
    except FileNotFoundError:
        raise CacheError(f"measurement cache not found: {path}") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, KeyError, TypeError,
            AttributeError) as e:
        if isinstance(e, CacheError):
            raise
        # A recording cut short (a killed run, a partial copy) ends mid-stream: EOFError.
        raise CacheError(f"{path}: unreadable measurement cache ({type(e).__name__}: {e})") from None
    return cache


def header_problem(header) -> str | None:
    """Why `header` (a recording's first line, parsed) is not one a replay reads; None when it is."""
    from autotune.fileio.reading import first_error
    from autotune.measure.recording_header import CacheHeader

    why = first_error(CacheHeader, header)
    return why and f"its header's {why}"


def merge_caches(paths: list[str | Path]) -> Cache:
    """Several partial recordings of one device into one cache (device and versions must agree), each
    named once."""
    seen: dict = {}
    for p in paths:
        where = Path(p).resolve()
        if where in seen:
            raise CacheError(f"{p} is named twice (also as {seen[where]}): name each recording once")
        seen[where] = p
    caches = [read_cache(p) for p in paths]
    base = caches[0]
    for other, p in zip(caches[1:], paths[1:]):
        a = {k: base.device.get(k) for k in ("name", "sm")}
        b = {k: other.device.get(k) for k in ("name", "sm")}
        if a != b or base.device.get("versions", {}).get("triton") != other.device.get("versions", {}).get("triton"):
            raise CacheError(f"{p}: recorded on {b} / triton {other.device.get('versions', {}).get('triton')}, "
                             f"not {a} / triton {base.device.get('versions', {}).get('triton')}")
        base.problems.update(other.problems)
        for m in other.records.values():
            base.add(m)
        for m in other.careful.values():
            base.add(m, careful=True)
    return base
