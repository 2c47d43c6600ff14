import pytest

from semverlite import Version, parse


def test_parse_release():
    assert parse("1.2.3") == Version(1, 2, 3)


def test_parse_prerelease():
    assert parse("2.0.0-rc.1") == Version(2, 0, 0, "rc.1")
    assert str(parse(" 2.0.0-rc.1 ")) == "2.0.0-rc.1"


def test_release_sorts_after_prerelease():
    versions = [parse("1.0.0"), parse("1.0.0-beta"), parse("0.9.9")]
    assert [str(v) for v in sorted(versions, key=Version.sort_key)] == [
        "0.9.9", "1.0.0-beta", "1.0.0"]


def test_invalid():
    with pytest.raises(ValueError):
        parse("1.2")
