"""The error every step raises for bad input: the command prints its one line and exits 2."""
import re

# The user-information part of a URL (`scheme://user:password@host`): everything from `://` to the last
# `@` before the host's `/`, `?` or `#`; a password holding a raw `/` is no URL's (it is written %2F).
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#'\"<>]*)@")


# A user name that is a token (GitHub's and GitLab's prefixes, or too long for a person's name)
_TOKEN_USER = re.compile(r"(gh[opsu]_|github_pat_|glpat-)|.{20,}")


def mask_credentials(text: str) -> str:
    """`text` with the secret of every URL in it masked: `user:TOKEN@` as `user:***@`, and a bare `TOKEN@`
    (a token given as the user name, as GitHub's may be) as `***@`; a user name alone stays."""
    def masked(m) -> str:
        user, colon, _ = m.group(2).partition(":")
        if colon:
            return m.group(1) + f"{user}:***@"
        return m.group(1) + ("***@" if _TOKEN_USER.match(user) else f"{user}@")
    return _USERINFO.sub(masked, text)


def one_line(error) -> str:
    """An error's text as the one line the CLI prints (a library's message may span several, and may
    quote a name from a file with control characters in it: those are shown escaped, never sent raw; a
    URL's credentials are masked, whoever quoted the URL)."""
    text = mask_credentials(" ".join(str(error).split()))
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class CheckError(ValueError):
    """A tuned folder `autotune check` (or publish, or a re-run reading it) cannot read as ours."""


class UsageError(Exception):
    """Bad input: one line on stderr, exit code 2."""


class ExportError(ValueError):
    """A family's files cannot be written where asked: a folder holding results measured another way, a file
    changed by hand (said before anything is measured, as bad input), a merge a target release cannot run."""


class NothingDone(Exception):
    """The run went through and nothing useful came of it (no backend ran correctly anywhere): one line
    on stderr, exit code 1, and no file written for it (exit 0 means something useful was written)."""


class Incomplete(Exception):
    """The run went through and wrote what it could, but a step failed or a batch size has no key (each
    said in a line above): one line on stderr, exit code 4. Nothing measured is lost: the storage holds
    it, and the same command writes the rest without measuring it again."""


class GpuMemoryExhausted(Incomplete):
    """A measurement failed for want of GPU memory even with one worker on its GPU (autotune.measure.pool)."""
