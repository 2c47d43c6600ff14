from semverlite.version import Version, parse

__all__ = ["Version", "parse"]
