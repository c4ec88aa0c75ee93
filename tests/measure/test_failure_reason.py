"""A failed launch's record says where the error was raised (sieve, session 17: SGLang 0.5.23's block-FP8 MoE with
--moe-runner-backend marlin died with a bare "AttributeError: 'NoneType' object has no attribute 'runner_backend'")."""
import sys

from autotune.measure import records
from autotune.measure.measurer import classify, failure_reason

LIB = '''
class Runner:
    def forward(self, runner):
        return runner.runner_backend.is_aiter()
'''


def _raised(tmp_path, monkeypatch, wrap=None):
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    (tmp_path / "fakepkg" / "fp8.py").write_text(LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fakepkg", "fakepkg.fp8"):     # each test its own tmp_path
        sys.modules.pop(name, None)
    from fakepkg.fp8 import Runner
    try:
        try:
            Runner().forward(None)
        except AttributeError as e:
            if wrap is None:
                raise
            raise wrap("the layer's forward failed") from e
    except Exception as e:
        return e


def test_a_runtime_error_names_the_library_line_that_raised_it(tmp_path, monkeypatch):
    e = _raised(tmp_path, monkeypatch)
    assert classify(e)[0] == records.RUNTIME_ERROR
    reason = failure_reason("first launch", e)
    assert reason.startswith("first launch: AttributeError: 'NoneType' object has no attribute 'runner_backend'")
    assert reason.endswith("(raised at fakepkg/fp8.py:4)")


def test_a_re_raised_error_is_placed_where_its_cause_was_raised(tmp_path, monkeypatch):
    e = _raised(tmp_path, monkeypatch, wrap=RuntimeError)
    assert "RuntimeError: the layer's forward failed (raised at fakepkg/fp8.py:4)" in failure_reason("timing", e)


def test_a_refusal_is_its_own_evidence_and_gets_no_location(tmp_path, monkeypatch):
    class Refused(Exception):
        pass
    e = _raised(tmp_path, monkeypatch, wrap=Refused)
    assert classify(e)[0] == records.REFUSED
    assert "raised at" not in failure_reason("first launch", e)
