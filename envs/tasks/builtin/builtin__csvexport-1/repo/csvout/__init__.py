from csvout.fields import quote_field
from csvout.writer import to_csv

__all__ = ["quote_field", "to_csv"]
