from depcheck import newest, satisfies


def test_satisfies():
    assert satisfies("1.2.0", "1.1.9")
    assert satisfies("2.0", "2.0")
    assert not satisfies("0.9", "1.0")


def test_leading_v():
    assert satisfies("v1.4", "1.3")


def test_newest():
    assert newest(["0.1", "0.3", "0.2"]) == "0.3"
