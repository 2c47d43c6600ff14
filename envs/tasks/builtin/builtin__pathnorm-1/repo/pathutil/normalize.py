"""Path normalization without touching the file system."""


def normalize(path: str) -> str:
    """Collapse repeated slashes, '.' and '..' segments of a POSIX path."""
    absolute = path.startswith("/")
    parts = []
    for part in path.split("/"):
        if part == "":
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append(part)
        else:
            parts.append(part)
    joined = "/".join(parts)
    return "/" + joined if absolute else joined or "."
