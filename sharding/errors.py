"""The one error type of `sharding`: a mesh, rule or shape that cannot work, named in the message."""


class ShardingError(ValueError):
    """Bad mesh sizes, rules or shapes for sharding; the message says which and why."""
