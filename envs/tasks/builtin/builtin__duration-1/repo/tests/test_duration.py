from humantime import format_duration, parse_duration


def test_format():
    assert format_duration(3725) == "1h 2m 5s"
    assert format_duration(7384) == "2h 3m 4s"
    assert format_duration(0) == "0s"


def test_parse():
    assert parse_duration("1h 2m 5s") == 3725
    assert parse_duration("2d") == 172800
