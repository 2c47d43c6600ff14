"""The `jaxswe` command line: help, module entry point, and one-line errors with exit code 2."""

import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, user_env

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


def test_a_second_ctrl_c_exits_at_once_during_the_first_ones_cleanup():
    """The CLI's SIGINT handlers in a real process: the first Ctrl-C raises KeyboardInterrupt (the
    stage writes what it has), a second one during that cleanup exits 130 at once."""
    code = (
        "import time\n"
        "from jaxswe.cli import _sigint_handlers\n"
        "with _sigint_handlers():\n"
        "    try:\n"
        "        print('working', flush=True); time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        print('cleaning up', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "working\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "cleaning up\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    assert proc.stderr.read() == "jaxswe: interrupted again: exiting now\n"


@pytest.mark.slow
def test_progress_in_a_log_file_is_periodic_lines(tmp_path):
    """stderr a file: RFT sampling, its SFT steps and the stage's eval report in at most ~10 plain
    lines each (no carriage-return bar), the last one at the total."""
    env = user_env()
    log = tmp_path / "stderr.txt"
    argv = ["rft", "--config", str(ROOT / "configs" / "toy-rl.yaml"), "--run-dir", str(tmp_path / "rft")]
    t0 = time.monotonic()
    with log.open("w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "jaxswe", *argv, "--set", "eval.after_stage=true"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=300,
        )
    timed = (time.monotonic() - t0) // 30  # lines a slow machine adds: one per 30 s at most
    text = log.read_text()
    assert done.returncode == 0 and "\r" not in text, text[-3000:]
    for name, unit, total in (
        ("rft sampling", "episodes", 160),
        ("rft sft", "steps", 1),
        ("final_eval", "episodes", 16),
    ):
        pattern = rf"jaxswe {name} (\d+)/{total} {unit}, .*, [\d.e+-]+ s/{unit[:-1]}"
        counts = [int(m.group(1)) for m in re.finditer(pattern, text)]
        ok = counts and counts[-1] == total and counts == sorted(counts) and len(counts) <= 10 + timed
        assert ok, (name, text)
    assert "jaxswe rft sft 1/1 steps, loss " in text
