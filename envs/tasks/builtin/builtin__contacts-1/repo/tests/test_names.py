from contacts import display_name


def test_full_name():
    assert display_name({"first": "Ada", "last": "Lovelace", "email": "a@x"}) == "Lovelace, Ada"


def test_missing_keys():
    assert display_name({"first": "Ada", "email": "a@x"}) == "Ada"
    assert display_name({"email": "a@x"}) == "a@x"


def test_blank_values():
    assert display_name({"first": " ", "last": "Turing", "email": "t@x"}) == "Turing"
