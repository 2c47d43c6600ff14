from calc import sub


def test_sub():
    assert sub(5, 3) == 2
