"""The task record and where tasks come from: formats, parsers, patches, twins, the built-in suite."""
