from stats import mean


def test_mean_is_a_number():
    assert isinstance(mean([2]), int | float)
