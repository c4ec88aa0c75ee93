"""The shape of a step of a command that measures, and who fills what of the context it works on.

A command is a list of steps over one RunContext (autotune.run.context). Each step owns its preconditions,
`check(ctx)`, and its work, `run(ctx)`; the command (autotune.run.pipeline) calls every step's check, then every
step's run. A check reads and refuses (UsageError, one line) and changes nothing: no file, no storage row, no
process. So a run refused for any reason has changed nothing, and a run that passed its checks is refused by
nothing it could have known before measuring.

Each step declares the context's fields it `needs` and those it `provides` (fills: for the steps after it, its
check's for their checks, its run's for their runs). The command fills some as it makes the context, the
opening of the device others (autotune.run.context.COMMAND, autotune.run.opening.PROVIDES); `check_order`
refuses a list of steps in which one needs what nothing before it provides, before any step checks or runs:
a step moved before the one that fills what it reads is one line, never an AttributeError halfway through a
run (or, worse, a None read as "nothing there").
"""
from __future__ import annotations

from typing import Iterable

from autotune.errors import UsageError


class Step:
    """One step of a command. `check`: its preconditions, before any step runs, changing nothing; `run`: its
    work. Both do nothing unless the step says otherwise. `needs`/`provides`: RunContext fields."""
    needs: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()

    def check(self, ctx) -> None:
        pass

    def run(self, ctx) -> None:
        pass


class StepOrderError(UsageError):
    """A command whose steps need what no step before them provides: one line, exit 2, before any step checks or
    runs (a command composed wrongly, as a kernel family declared wrongly is: registry.FamilyError)."""


def check_order(steps: list[Step], given: Iterable[str]) -> None:
    """Refuse `steps` where one needs a field that neither `given` (what the command and the opening fill) nor a
    step before it provides."""
    have = set(given)
    for i, step in enumerate(steps):
        missing = [name for name in step.needs if name not in have]
        if missing:
            later = [type(s).__name__ for s in steps[i + 1:] if set(missing) & set(s.provides)]
            raise StepOrderError(
                f"step {type(step).__name__} needs {', '.join(missing)}, which no step before it provides"
                + (f" ({', '.join(later)} does, after it)" if later else "")
                + f": the steps {' -> '.join(type(s).__name__ for s in steps)} are in the wrong order")
        have |= set(step.provides)
