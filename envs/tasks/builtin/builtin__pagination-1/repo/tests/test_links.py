from pager import page_links


def test_first_page():
    assert page_links(1, 30, 10) == {"prev": None, "next": 2, "last": 3}


def test_last_page():
    assert page_links(3, 30, 10) == {"prev": 2, "next": None, "last": 3}
