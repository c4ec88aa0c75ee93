"""What autotune prints goes out in the terminal's encoding, whatever it is: where that encoding lacks
a character (PYTHONIOENCODING=ascii, an old C locale), a plain-ASCII stand-in is printed instead
('µs' as 'us', '×' as 'x'; anything else as its \\x escape), never an error. A print that failed
mid-run was a traceback that left a tuned folder half-written (tuned files without the overlay)."""
from __future__ import annotations

import codecs
import contextlib
import errno
import io
import os
import sys
import unicodedata

ERRORS = "autotune-plain"        # the codec error handler's name
STAND_INS = {"µ": "u", "μ": "u", "×": "x", "→": "->", "←": "<-", "–": "-", "—": "-", "…": "...", "≈": "~",
             "≤": "<=", "≥": ">=", "±": "+-", "‘": "'", "’": "'", "“": '"', "”": '"', "•": "*", "°": " deg"}


def plain(ch: str) -> str:
    """`ch` in plain ASCII: its stand-in, its letters without accents (é: e), else its escape."""
    if ch.isascii():
        return ch
    if ch in STAND_INS:
        return STAND_INS[ch]
    bare = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return bare if bare.isprintable() and bare else ch.encode("ascii", "backslashreplace").decode()


def _stand_ins(error: UnicodeError):
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return "".join(plain(ch) for ch in error.object[error.start:error.end]), error.end


codecs.register_error(ERRORS, _stand_ins)


def plain_fallbacks() -> None:
    """stdout and stderr print what their encoding lacks as plain ASCII (an encoding that has it is
    unaffected)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError, OSError, io.UnsupportedOperation):   # closed, or detached
                stream.reconfigure(errors=ERRORS)


# --- streams that cannot fail the command -----------------------------------------------------------
# stdout or stderr full (ENOSPC), closed by its reader (`| head -1`: EPIPE) or gone (EIO): a print raised
# OSError from wherever it was, a traceback, and a run stopped halfway through writing its folder. The
# command's work never depends on its printing: the first failure is remembered, later writes dropped.

class Kept:
    """A text stream whose writes never raise: the first OSError (or a closed stream's ValueError) is
    kept in `lost` and what comes after is dropped; the descriptor below is pointed at /dev/null so the
    interpreter's own last flush cannot fail either."""

    def __init__(self, stream):
        self.stream = stream
        self.lost: OSError | None = None

    def _failed(self, e: Exception) -> None:
        self.lost = e if isinstance(e, OSError) else OSError(errno.EBADF, str(e))
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self.stream.write(text)
            except (OSError, ValueError) as e:
                self._failed(e)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as e:
                self._failed(e)

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def kept_streams():
    """sys.stdout and sys.stderr as Kept streams while the block runs (each flushed at its end); yields
    (stdout, stderr)."""
    out, err = Kept(sys.stdout), Kept(sys.stderr)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved


def lost_output(out: Kept) -> str | None:
    """Why what the command printed on stdout was lost, None where it was not or where its reader chose
    to stop reading (a closed pipe: `| head -1` took what it wanted)."""
    if out.lost is None or out.lost.errno == errno.EPIPE:
        return None
    return out.lost.strerror or str(out.lost)
