"""The one exception type the CLI turns into a single-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (config, path, task file, server); the message is for them."""
