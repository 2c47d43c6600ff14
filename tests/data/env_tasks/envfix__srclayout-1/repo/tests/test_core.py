from wordstat import top_words, word_counts


def test_counts_plain_words():
    assert word_counts("a b a")["a"] == 2


def test_top_words_orders_by_count():
    assert top_words("b b a c c c") == ["c", "b", "a"]


def test_top_words_breaks_ties_alphabetically():
    assert top_words("z y x", n=2) == ["x", "y"]
