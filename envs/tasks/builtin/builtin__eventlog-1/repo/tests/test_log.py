from audit import EventLog


def test_record_and_count():
    log = EventLog("auth", [])
    log.record("login", user="ada")
    log.record("login", user="alan")
    log.record("logout", user="ada")
    assert log.count("login") == 2
    assert log.events[0] == {"kind": "login", "user": "ada"}


def test_initial_events():
    log = EventLog("auth", [{"kind": "boot"}])
    assert log.count("boot") == 1
