"""Semantic versions: MAJOR.MINOR.PATCH[-PRERELEASE]."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: str = ""

    def __str__(self):
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{self.prerelease}" if self.prerelease else core

    def sort_key(self):
        """A release sorts after all of its pre-releases."""
        return (self.major, self.minor, self.patch, self.prerelease == "", self.prerelease)


def parse(text: str) -> Version:
    parts = text.strip().split("-")
    prerelease = parts[1] if len(parts) > 1 else ""
    try:
        major, minor, patch = (int(p) for p in parts[0].split("."))
    except ValueError:
        raise ValueError(f"not a version: {text!r}") from None
    return Version(major, minor, patch, prerelease)
