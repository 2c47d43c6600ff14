"""Human-readable names of contact records (dicts loaded from JSON)."""


def display_name(contact: dict) -> str:
    """'Last, First' when both are known, else whichever is known, else the email."""
    first = str(contact.get("first", "")).strip()
    last = str(contact.get("last", "")).strip()
    if first and last:
        return f"{last}, {first}"
    return first or last or contact["email"]
