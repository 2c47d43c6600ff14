from audit.log import EventLog

__all__ = ["EventLog"]
