from billsplit.split import split_evenly

__all__ = ["split_evenly"]
