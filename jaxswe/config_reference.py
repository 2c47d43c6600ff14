"""docs/config.md, generated from the config schema: every key, its type, default and meaning.

The meaning of a key is the comment written with its field in jaxswe/config.py: the comment lines
right above it and the comment at the end of its line; a key with neither takes the nearest
comment block above it in its section that names it. `python -m jaxswe.config_reference` rewrites
docs/config.md; tests/cli/test_config_reference.py fails when the file is out of date.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from jaxswe import config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
HEADER = """# Configuration reference

Every key of a run config (`jaxswe <stage> --config FILE`, `--set section.key=value`), its type,
default and meaning. Generated from `jaxswe/config.py` by `python -m jaxswe.config_reference`;
do not edit by hand. A config file names only what differs from these defaults (see
`configs/*.yaml`); unknown keys are errors.
"""


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.string.startswith("# fmt:"):
            found[tok.start[0]] = tok.string.lstrip("#").strip()
    return found


def _block_above(comments: dict[int, str], lines: list[str], lineno: int) -> tuple[int, str]:
    """(first line, text) of the comment lines right above `lineno` (whole-line comments only)."""
    text, first = [], lineno
    while first - 1 in comments and lines[first - 2].lstrip().startswith("#"):
        first -= 1
        text.insert(0, comments[first])
    return first, " ".join(text)


def field_meanings(source: str) -> dict[str, dict[str, str]]:
    """Class name -> field name -> the field's comment (see the module docstring)."""
    comments, lines = _comments(source), source.splitlines()
    meanings: dict[str, dict[str, str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, str] = {}
        blocks: list[str] = []
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            _, above = _block_above(comments, lines, stmt.lineno)
            own_lines = range(stmt.lineno, stmt.end_lineno + 1)
            trailing = [
                comments[n] for n in own_lines if n in comments and not lines[n - 1].lstrip().startswith("#")
            ]
            own = " ".join(filter(None, [above, *trailing]))
            if above:
                blocks.append(above)
            name = stmt.target.id
            fields[name] = own or next((b for b in reversed(blocks) if _names(b, name)), "")
        meanings[node.name] = fields
    return meanings


def _names(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _constraints(field: Any) -> str:
    """` (> 0)`, ` (>= 0, < 1)`: the bounds pydantic checks."""
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = [
        f"{sign} {getattr(m, key)}" for m in field.metadata for key, sign in signs.items() if hasattr(m, key)
    ]
    return f" ({', '.join(bounds)})" if bounds else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(prefix: str, model: type[BaseModel], annotations: dict[str, str], meanings: dict[str, str]) -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            continue  # a section: its own table
        kind = f"`{_cell(annotations[name])}`{_cell(_constraints(field))}"
        default = f"`{_cell(_default(field))}`"
        rows.append(f"| `{prefix}{name}` | {kind} | {default} | {_cell(meanings.get(name, ''))} |")
    return "\n".join(rows)


def _annotations(source: str) -> dict[str, dict[str, str]]:
    """Class name -> field name -> its annotation as written."""
    return {
        node.name: {
            s.target.id: ast.unparse(s.annotation)
            for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef)
    }


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def reference() -> str:
    """docs/config.md's text for the schema as it is now."""
    source = Path(config.__file__).read_text()
    meanings, annotations = field_meanings(source), _annotations(source)

    def section(title: str, prefix: str, model: type[BaseModel]) -> list[str]:
        cls = model.__name__
        return [
            title + "\n",
            _doc(model) + "\n",
            _table(prefix, model, annotations[cls], meanings[cls]) + "\n",
        ]

    parts = [HEADER, *section("## Top level", "", config.RunConfig)]
    for name, field in config.RunConfig.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            parts += section(f"## `{name}`", f"{name}.", model)
        if model is config.EnvSection:
            parts += section("### `env.docker_hosts` items", "", config.DockerHostSection)
    return "\n".join(parts)


def undocumented() -> list[str]:
    """Keys whose field has no comment to take a meaning from."""
    text = reference()
    return [
        line.split("`")[1] for line in text.splitlines() if line.startswith("| `") and line.endswith("|  |")
    ]


if __name__ == "__main__":
    DOC.write_text(reference())
    if missing := undocumented():
        print(f"keys with no comment in jaxswe/config.py: {', '.join(missing)}", file=sys.stderr)
