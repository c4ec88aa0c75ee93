"""What autotune prints goes out in the terminal's encoding, whatever it is: where that encoding lacks
a character (PYTHONIOENCODING=ascii, an old C locale), a plain-ASCII stand-in is printed instead
('µs' as 'us', '×' as 'x'; anything else as its \\x escape), never an error. A print that failed
mid-run was a traceback that left a tuned folder half-written (tuned files without the overlay)."""
from __future__ import annotations

import codecs
import contextlib
import io
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
