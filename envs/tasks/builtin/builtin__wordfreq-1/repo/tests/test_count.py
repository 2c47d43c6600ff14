from wordfreq import top_words, words


def test_words():
    assert words("It's a Test, a test!") == ["it's", "a", "test", "a", "test"]


def test_top_words():
    assert top_words("b a b c b a", 2) == [("b", 3), ("a", 2)]
