"""Parsing `key = value` lines; '#' starts a comment line."""


class ConfigError(ValueError):
    pass


def parse_lines(text: str) -> dict:
    values = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ConfigError(f"line {number}: expected 'key = value'")
        key, value = line.split("=", 1)
        values[key.strip()] = value.strip()
    return values
