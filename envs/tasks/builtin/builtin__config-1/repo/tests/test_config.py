import pytest

from confparse import Config, ConfigError


def test_get():
    config = Config.from_text("# comment\nname = demo\nport=8080\n")
    assert config.get("name") == "demo"
    assert config.get("missing", "x") == "x"


def test_get_int():
    config = Config.from_text("port = 8080")
    assert config.get_int("port") == 8080
    assert config.get_int("retries", 3) == 3


def test_get_bool_true():
    assert Config.from_text("debug = yes").get_bool("debug") is True
    assert Config.from_text("").get_bool("debug") is False


def test_bad_line():
    with pytest.raises(ConfigError):
        Config.from_text("just words")
