"""docs/config.md is generated from the config schema and up to date: every key, its default and meaning."""

from __future__ import annotations

from jaxswe.config import RunConfig
from jaxswe.config_reference import DOC, reference, undocumented


def test_config_reference_is_current_and_complete():
    text = reference()
    assert DOC.read_text() == text, "docs/config.md is out of date: run `python -m jaxswe.config_reference`"
    assert undocumented() == [], "give these keys a comment in jaxswe/config.py"
    for name, field in RunConfig.model_fields.items():  # every section's every key has a row
        keys = getattr(field.annotation, "model_fields", {name: None})
        prefix = f"{name}." if keys.keys() != {name} else ""
        assert all(f"| `{prefix}{key}` |" in text for key in keys), name
