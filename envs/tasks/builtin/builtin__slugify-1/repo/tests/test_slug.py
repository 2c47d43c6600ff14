from textkit import slugify


def test_words_joined_by_dash():
    assert slugify("Hello World") == "hello-world"


def test_accents_are_dropped():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_max_length():
    assert slugify("a b c d", max_length=3) == "a-b"
