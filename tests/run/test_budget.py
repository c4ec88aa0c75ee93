"""--budget on a GPU is the run's wall time from the process's start: each problem of the config searches gets
an equal share of what is left when it starts, after what the backend choice that follows is estimated to take;
a replay keeps its budget in recorded device seconds (no end)."""
import time
from types import SimpleNamespace

import pytest

from autotune.run import config_search
from autotune.search.context import TuneSettings


def _ctx(kind="gpu", budget=150.0, plans=()):
    return SimpleNamespace(settings=TuneSettings(budget_s=budget), device=SimpleNamespace(kind=kind), plans=list(plans))


def test_each_problem_gets_an_equal_share_of_what_is_left(monkeypatch):
    now = time.monotonic()
    monkeypatch.setattr("autotune.search.context.process_started", lambda: now - 10.0)
    end = config_search.problem_end(_ctx(), 2)
    # 150 s from a start 10 s ago, less the finish: two problems share the 138 s left
    assert end - now == pytest.approx((150 - 10 - config_search.FINISH_S) / 2, abs=0.5)
    assert config_search.problem_end(_ctx(), 1) - now == pytest.approx(150 - 10 - config_search.FINISH_S, abs=0.5)


def test_the_backend_choice_after_the_searches_keeps_its_estimate(monkeypatch):
    now = time.monotonic()
    monkeypatch.setattr("autotune.search.context.process_started", lambda: now)
    monkeypatch.setattr(config_search, "backend_choice_s", lambda ctx: 40.0)
    assert config_search.problem_end(_ctx(), 1) - now == pytest.approx(150 - 40 - config_search.FINISH_S, abs=0.5)


def test_a_budget_already_spent_ends_the_search_at_once_and_a_replay_has_no_end(monkeypatch):
    now = time.monotonic()
    monkeypatch.setattr("autotune.search.context.process_started", lambda: now - 500.0)
    assert config_search.problem_end(_ctx(), 3) <= time.monotonic()
    assert config_search.problem_end(_ctx(kind="replay"), 1) is None
    assert config_search.problem_end(_ctx(budget=None), 1) is None
