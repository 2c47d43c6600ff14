"""Scaffold prompts from YAML: system prompt, instance template, demonstration, messages.

`load_prompts("default")` reads jaxswe/prompts/default.yaml; any other argument is a YAML path.
Templates use `{name}` placeholders filled by `render`; unknown `{...}` text stays as written,
so code with braces in a prompt needs no escaping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jaxswe.errors import UserError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
FORMAT_ERROR_KEYS = ("no_command", "multiple_commands", "unclosed_block", "empty_command")
OBSERVATION_KEYS = ("no_output", "exit_code", "timeout", "truncated", "usage_error", "status")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PromptsError(UserError):
    """A prompts file that is missing or lacks a required entry."""


@dataclass(frozen=True)
class Prompts:
    """All texts the scaffold shows the model."""

    system: str
    instance: str
    demonstration: str
    format_errors: dict[str, str]
    observations: dict[str, str]


def render(template: str, **fields: Any) -> str:
    """Fill `{name}` placeholders present in `fields`, in one pass (values are never re-scanned)."""
    return _PLACEHOLDER.sub(
        lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), template
    )


def load_prompts(name_or_path: str | Path = "default") -> Prompts:
    """Load a prompts YAML by name (jaxswe/prompts/<name>.yaml) or path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROMPTS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))
        raise PromptsError(f"prompts {str(name_or_path)!r}: no such file (built-in names: {known})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise PromptsError(f"{path}: invalid YAML") from None
    if not isinstance(data, dict):
        raise PromptsError(f"{path}: top level must be a mapping")

    def text(value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise PromptsError(f"{path}: {key}: missing or not a string")
        return value

    def table(key: str, keys: tuple[str, ...]) -> dict[str, str]:
        section = data.get(key)
        if not isinstance(section, dict):
            raise PromptsError(f"{path}: {key}: missing or not a mapping")
        return {k: text(section.get(k), f"{key}.{k}") for k in keys}

    return Prompts(
        system=text(data.get("system"), "system"),
        instance=text(data.get("instance"), "instance"),
        demonstration=text(data.get("demonstration", ""), "demonstration"),
        format_errors=table("format_errors", FORMAT_ERROR_KEYS),
        observations=table("observations", OBSERVATION_KEYS),
    )
