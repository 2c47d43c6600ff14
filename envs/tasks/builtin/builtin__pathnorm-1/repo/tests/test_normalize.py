from pathutil import normalize


def test_repeated_slashes():
    assert normalize("a//b/") == "a/b"


def test_parent_segments():
    assert normalize("/a/b/../c") == "/a/c"
    assert normalize("../x") == "../x"
    assert normalize("/..") == "/"


def test_empty_relative():
    assert normalize("a/..") == "."
