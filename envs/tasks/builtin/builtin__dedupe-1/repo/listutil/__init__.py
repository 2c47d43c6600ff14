from listutil.dedupe import dedupe

__all__ = ["dedupe"]
