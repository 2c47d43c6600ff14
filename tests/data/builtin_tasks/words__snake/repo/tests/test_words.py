import words


def test_shout():
    assert words.shout('hi') == 'HI!'
