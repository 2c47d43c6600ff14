"""Prompt files: the default loads whole, bad files get one clear error, render fills only known keys."""

import pytest

from jaxswe.agent.commands import SPECIAL_COMMANDS
from jaxswe.agent.prompts import FORMAT_ERROR_KEYS, PromptsError, load_prompts, render


def test_default_prompts_document_every_command():
    p = load_prompts("default")
    for command in SPECIAL_COMMANDS:
        assert command in p.system, command
    assert "EXACTLY ONE" in p.system and "{problem_statement}" in p.instance
    assert set(p.format_errors) == set(FORMAT_ERROR_KEYS)
    assert "{cwd}" in p.observations["status"] and "<demonstration>" in p.demonstration


def test_render_fills_known_keys_once_and_keeps_other_braces():
    out = render("a {x} {y} {not_given} {{literal}} {", x="{y}", y="1")
    assert out == "a {y} 1 {not_given} {{literal}} {"


def test_bad_prompt_files_are_clear_errors(tmp_path):
    with pytest.raises(PromptsError, match="no such file.*default"):
        load_prompts("nonexistent")
    bad = tmp_path / "p.yaml"
    bad.write_text("system: hi\ninstance: x\nformat_errors: {}\nobservations: {}\n")
    with pytest.raises(PromptsError, match="format_errors.no_command: missing"):
        load_prompts(bad)
    bad.write_text("system: [1]\n")
    with pytest.raises(PromptsError, match="system: missing or not a string"):
        load_prompts(bad)
    bad.write_text("system: 'unclosed\n")
    with pytest.raises(PromptsError, match="invalid YAML"):
        load_prompts(bad)
