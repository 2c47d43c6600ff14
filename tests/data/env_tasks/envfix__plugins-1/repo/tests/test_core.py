from retrier import retry, retry_async


def test_retry_returns_first_success(mocker):
    fn = mocker.Mock(side_effect=[ValueError("no"), 7])
    assert retry(fn, sleep=mocker.Mock()) == 7
    assert fn.call_count == 2


def test_retry_sleeps_between_attempts(mocker):
    sleep = mocker.Mock()
    fn = mocker.Mock(side_effect=[ValueError("no"), ValueError("no"), 1])
    retry(fn, delay=0.5, sleep=sleep)
    assert sleep.call_count == 2


async def test_retry_async_returns_first_success(mocker):
    fn = mocker.AsyncMock(side_effect=[ValueError("no"), 3])
    assert await retry_async(fn) == 3
