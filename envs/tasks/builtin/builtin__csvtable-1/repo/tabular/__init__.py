from tabular.table import column, read_table

__all__ = ["column", "read_table"]
