"""Reading small delimited text tables into dicts."""


def read_table(text: str, sep: str = ",") -> list:
    """Rows as dicts keyed by the header line's names."""
    lines = text.split("\n")
    header = [name.strip() for name in lines[0].split(sep)]
    rows = []
    for line in lines[1:]:
        values = [value.strip() for value in line.split(sep)]
        rows.append(dict(zip(header, values)))
    return rows


def column(rows: list, name: str) -> list:
    return [row[name] for row in rows]
