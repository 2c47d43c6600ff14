from csvout import quote_field, to_csv


def test_plain_fields():
    assert quote_field("abc") == "abc"
    assert quote_field(None) == ""
    assert quote_field(3.5) == "3.5"


def test_separator_is_quoted():
    assert quote_field("a,b") == '"a,b"'


def test_document():
    assert to_csv(["name", "city"], [["Ada", "London, UK"]]) == 'name,city\r\nAda,"London, UK"\r\n'
