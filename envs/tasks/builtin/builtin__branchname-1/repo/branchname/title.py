"""Human-readable titles from branch names like 'feature/add-login'."""

KNOWN_PREFIXES = ("feature/", "bugfix/", "hotfix/")


def strip_prefix(branch: str) -> str:
    for prefix in KNOWN_PREFIXES:
        if branch.startswith(prefix):
            return branch.lstrip(prefix)
    return branch


def title(branch: str) -> str:
    """'feature/add-login' -> 'Add login'."""
    words = strip_prefix(branch).replace("_", "-").split("-")
    return " ".join(words).capitalize()
