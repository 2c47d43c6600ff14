from contacts.names import display_name

__all__ = ["display_name"]
