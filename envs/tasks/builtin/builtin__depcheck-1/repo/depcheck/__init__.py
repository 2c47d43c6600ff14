from depcheck.compare import newest, satisfies

__all__ = ["newest", "satisfies"]
