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
    for name in ("serve", "tasks", "rft", "rl", "eval", "pipeline", "plan", "convert", "export", "inspect"):
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


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["rl"], "Missing option '--config'. (see 'jaxswe rl --help')"),
        (["rl", "--config", "c.yaml"], "Missing option '--run-dir'."),
        (["bogus"], "No such command 'bogus'. (see 'jaxswe --help')"),
        (["rl", "--bogus"], "No such option: --bogus"),
        (["tasks", "validate"], "Missing argument 'FILE'. (see 'jaxswe tasks validate --help')"),
        (["plan", "--config"], "Option '--config' requires an argument."),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv, expect, capsys):
    from jaxswe.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("jaxswe: error: ") and expect in err, err


def test_version_and_bare_command():
    from importlib.metadata import version

    out = _jaxswe("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"jaxswe {version('jaxswe')}", out
    out = _jaxswe()  # no command: the help, as click does
    assert out.returncode == 2 and "pipeline" in out.stdout + out.stderr


def test_override_error_names_the_override_and_closest_key(tmp_path, capsys):
    from jaxswe.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("stages: [rl]\n")
    argv = ["rl", "--config", str(path), "--run-dir", str(tmp_path / "run"), "--set", "rl.eps_hihg=0.3"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2
    assert err == "jaxswe: error: --set rl.eps_hihg=0.3: rl.eps_hihg: unknown key (did you mean rl.eps_high?)"
    assert not (tmp_path / "run").exists()
