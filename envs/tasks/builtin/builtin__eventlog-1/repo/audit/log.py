"""An append-only list of audit events."""


class EventLog:
    def __init__(self, name: str, events=[]):
        self.name = name
        self.events = events

    def record(self, kind: str, **data) -> None:
        self.events.append({"kind": kind, **data})

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event["kind"] == kind)
