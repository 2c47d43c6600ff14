"""Parse `--name value`, `--flag` and positional arguments."""


class ArgError(ValueError):
    pass


def parse_args(argv: list, options: dict):
    """`options` maps names to a type (bool options take no value).

    Returns (values, positional).
    """
    values = {name: (False if kind is bool else None) for name, kind in options.items()}
    positional = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name = arg[2:]
            if name not in options:
                raise ArgError(f"unknown option: {arg}")
            if options[name] is bool:
                values[name] = True
            else:
                if i + 1 >= len(argv):
                    raise ArgError(f"missing value for {arg}")
                values[name] = options[name](argv[i + 1])
                i += 1
        else:
            positional.append(arg)
        i += 1
    return values, positional
