import pytest

from backoff import delays, retry


def flaky(failures):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= failures:
            raise ConnectionError("boom")
        return "ok"

    return fn, calls


def test_number_of_delays_and_cap():
    waits = delays(6, base=1, cap=5)
    assert len(waits) == 5
    assert max(waits) == 5


def test_succeeds_after_failures():
    fn, calls = flaky(2)
    slept = []
    assert retry(fn, attempts=3, sleep=slept.append) == "ok"
    assert len(calls) == 3 and len(slept) == 2


def test_other_exceptions_propagate_at_once():
    def fn():
        raise KeyError("x")

    with pytest.raises(KeyError):
        retry(fn, exceptions=(ConnectionError,), sleep=lambda s: None)
