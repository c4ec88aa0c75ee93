"""The names a file hands us that become file names, folder names or printed lines: a GPU's name
(SGLang's `device_name=` in every config file name, the tuned folder's name) and a Triton version
(the `configs/triton_<version>/` folder SGLang reads), a release's version, and any other text a
file hands us to print (one printable line). One rule each, for every reader: a recording's header
(recording_header.py), a provenance.json and backend_choice.json (config_files.py) and
`--device-name` (export/skus.py).
"""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

# What torch.cuda.get_device_name() returns: printable ASCII words; nothing SGLang's file name
# grammar uses (',' '=' '[' ']'), no path separators, no control characters (a newline or a tab
# split the lines a run prints and the names it writes).
DEVICE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 ._()+-]{2,79}")
# What triton.__version__ looks like (3.6.0, 3.5.0+git1a2b3c, 3.4.0.dev20250101): SGLang names its
# config folder after it, dots made underscores.
TRITON_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*[0-9A-Za-z.+_-]{0,40}")


def device_name_problem(name) -> str | None:
    """Why `name` is not a GPU's name as torch prints it (None when it is)."""
    if not isinstance(name, str):
        return f"{name!r:.40} is not a GPU name (a string)"
    if not DEVICE_NAME.fullmatch(name) or "  " in name or name != name.strip():
        return (f"{name!r:.60} is not a plausible CUDA device name (as torch.cuda.get_device_name() prints it, "
                "e.g. 'NVIDIA H200': letters, digits, spaces and ._()+-)")
    return None


def triton_version_problem(version) -> str | None:
    if not isinstance(version, str):
        return f"{version!r:.40} is not a Triton version (a string, as triton.__version__: '3.6.0')"
    if not TRITON_VERSION.fullmatch(version):
        return f"{version!r:.60} is not a Triton version (as triton.__version__: '3.6.0'; it names a folder)"
    return None


# A version as a package or a release spells it (3.6.0, 0.5.23, 2.11.0+cu130, 580.159.04).
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


def version_problem(version) -> str | None:
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        return f"{version!r:.60} is not a version (as a release names itself: '0.5.23', '2.11.0+cu130')"
    return None


def plain_text_problem(text, most: int = 400) -> str | None:
    """Why `text` is not one printable line of at most `most` characters (None when it is): a newline,
    a tab or another control character split the lines autotune prints and the names it writes."""
    if not isinstance(text, str):
        return f"{text!r:.40} is not text"
    if not text.isprintable():
        return f"{text!r:.60} holds a control character (a newline, a tab): names and notes are one printable line"
    if len(text) > most:
        return f"{text[:40]!r}... is {len(text)} characters long, above {most}"
    return None


def _checked(problem):
    def check(v):
        why = problem(v)
        if why:
            raise ValueError(why)
        return v
    return AfterValidator(check)


DeviceName = Annotated[str, _checked(device_name_problem)]
TritonVersion = Annotated[str, _checked(triton_version_problem)]
Version = Annotated[str, _checked(version_problem)]
PlainText = Annotated[str, _checked(plain_text_problem)]
