"""Comparing dotted version strings such as '1.10.2' or 'v2.0'."""


def version_tuple(version: str) -> tuple:
    return tuple(version.strip().lstrip("v").split("."))


def satisfies(version: str, minimum: str) -> bool:
    """True if `version` is at least `minimum`."""
    return version_tuple(version) >= version_tuple(minimum)


def newest(versions):
    """The highest version in `versions`."""
    return max(versions, key=version_tuple)
