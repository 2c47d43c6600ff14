from tabular import column, read_table


def test_read_table():
    rows = read_table("name, age\nada, 36\nalan, 41")
    assert rows == [{"name": "ada", "age": "36"}, {"name": "alan", "age": "41"}]


def test_other_separator():
    assert read_table("a;b\n1;2", sep=";") == [{"a": "1", "b": "2"}]


def test_column():
    assert column(read_table("x,y\n1,2\n3,4"), "y") == ["2", "4"]
