from branchname import strip_prefix, title


def test_strip_prefix():
    assert strip_prefix("feature/login") == "login"
    assert strip_prefix("hotfix/crash") == "crash"
    assert strip_prefix("main") == "main"


def test_title():
    assert title("bugfix/null_pointer") == "Null pointer"
