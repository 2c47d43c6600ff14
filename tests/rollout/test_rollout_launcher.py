"""SGLang launcher: command construction, and start/wait/stop against real processes."""

import json
import os
import sys
import time

import pytest

from jaxswe.config import RolloutSection
from jaxswe.model.config import get_preset
from jaxswe.rollout.sglang_launcher import LaunchError, ServerProcess, sglang_command, stage_sglang_command


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_command_for_yarn_long_context(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    cmd = sglang_command(
        tmp_path, port=31000, tp_size=8, mem_fraction_static=0.8, context_length=131072, rope_scaling=yarn,
        python="/usr/bin/python3",
    )  # fmt: skip
    assert cmd[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    assert _arg(cmd, "--model-path") == str(tmp_path)
    assert _arg(cmd, "--port") == "31000" and _arg(cmd, "--tp-size") == "8"
    assert _arg(cmd, "--mem-fraction-static") == "0.8" and _arg(cmd, "--context-length") == "131072"
    override = json.loads(_arg(cmd, "--json-model-override-args"))
    assert override == {"rope_scaling": yarn, "max_position_embeddings": 131072}
    assert "--skip-tokenizer-init" in cmd


def test_seeded_sampling_asks_for_deterministic_inference(tmp_path):
    """SGLang 0.5.9 reads `sampling_seed` only with --enable-deterministic-inference; a stage passes
    it unless `rollout.deterministic_inference` is off."""
    (tmp_path / "config.json").write_text("{}")
    flag = "--enable-deterministic-inference"
    assert flag in sglang_command(tmp_path) and flag not in sglang_command(tmp_path, deterministic=False)
    model = get_preset("tiny")
    for on in (True, False):
        rollout = RolloutSection(engine="sglang", deterministic_inference=on, seed=7)
        cmd = stage_sglang_command(tmp_path, model, rollout, port=30002)
        assert (flag in cmd) is on and _arg(cmd, "--random-seed") == "7" and _arg(cmd, "--port") == "30002"


def test_command_without_yarn_and_bad_inputs(tmp_path):
    with pytest.raises(LaunchError, match="no config.json"):
        sglang_command(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    cmd = sglang_command(tmp_path, extra_args=["--disable-radix-cache"])
    assert "--json-model-override-args" not in cmd and "--context-length" not in cmd
    assert cmd[-1] == "--disable-radix-cache"
    with pytest.raises(LaunchError, match="tp_size"):
        sglang_command(tmp_path, tp_size=0)
    with pytest.raises(LaunchError, match="mem_fraction_static"):
        sglang_command(tmp_path, mem_fraction_static=1.5)


def test_process_that_exits_early_is_reported_with_its_log(tmp_path):
    cmd = [sys.executable, "-c", "print('boom: no GPU'); raise SystemExit(3)"]
    server = ServerProcess(cmd, "http://127.0.0.1:9", log_path=tmp_path / "log").start()
    with pytest.raises(LaunchError, match=r"exited with code 3.*boom: no GPU"):
        server.wait_healthy(timeout_s=30, poll_s=0.05)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_timeout_stops_the_whole_process_group(tmp_path):
    child_pid_file = tmp_path / "child"
    script = (
        "import subprocess, sys, time, pathlib;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
        f"pathlib.Path({str(child_pid_file)!r}).write_text(str(p.pid));"
        "time.sleep(300)"
    )
    server = ServerProcess([sys.executable, "-c", script], "http://127.0.0.1:9").start()
    deadline = time.monotonic() + 20
    while not child_pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(child_pid_file.read_text())
    with pytest.raises(LaunchError, match="not healthy after"):
        server.wait_healthy(timeout_s=0.5, poll_s=0.05)
    assert server.proc.poll() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
