"""The `jaxswe` command line: help, module entry point, and one-line errors with exit code 2."""

import subprocess
import sys

import pytest

from jaxswe.cli import _COMMAND_MODULES


def _jaxswe(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "jaxswe", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_every_registered_command():
    out = _jaxswe("--help")
    assert out.returncode == 0, out.stderr
    for name in ("serve", "tasks", "rft", "rl", "eval", "pipeline", "plan", "convert"):
        assert name in out.stdout
    assert len(_COMMAND_MODULES) == len(set(_COMMAND_MODULES))


@pytest.mark.parametrize("command", ["rl", "plan"])  # each spawns a full CLI; test_cli_errors covers more
def test_missing_config_is_one_line_exit_2(tmp_path, command):
    args = [command, "--config", str(tmp_path / "missing.yaml")]
    if command != "plan":
        args += ["--run-dir", str(tmp_path / "run")]
    out = _jaxswe(*args)
    assert out.returncode == 2
    lines = [line for line in out.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and "missing.yaml" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def test_unknown_config_key_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rl:\n  iteratons: 3\n")
    out = _jaxswe("plan", "--config", str(path))
    assert out.returncode == 2 and "rl.iteratons: unknown key" in out.stderr
