"""Bad input to the stage commands: one clear line, exit 2, nothing written, before any work."""

import json

import pytest

from jaxswe.cli import main


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    return exc.value.code, err


@pytest.fixture
def config(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    path = tmp_path / "c.yaml"
    path.write_text("name: t\nstages: [rl]\nrl: {iterations: 1}\n")
    return path


@pytest.mark.parametrize(
    "command,overrides,expect",
    [
        ("rl", ["model.path=/nonexistent/model"], "model.path /nonexistent/model"),
        ("rft", ["init_from=/nonexistent/run"], "/nonexistent/run: no checkpoint found"),
        (
            "eval",
            ["model.path=/x", "rollout.engine=http", "rollout.urls=[http://127.0.0.1:9]"],
            "no rollout server",
        ),
        ("rl", ["model.path=/x", "env.tasks=EMPTY"], "holds no tasks"),
        ("pipeline", ["stages=[rft, warmstart]"], "warmstart can only be the first stage"),
        ("rl", ["rl.group_size=1"], "rl.group_size"),
    ],
)
def test_bad_input_one_line(tmp_path, config, capsys, command, overrides, expect):
    overrides = [o.replace("EMPTY", str(tmp_path / "tasks.jsonl")) for o in overrides]
    run_dir = tmp_path / "run"
    argv = [command, "--config", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        argv += ["--set", o]
    code, err = _run(argv, capsys)
    assert code == 2
    assert err.startswith("jaxswe: error: ") and len(err.splitlines()) == 1, err
    assert expect in err
    assert not run_dir.exists()


def test_rl_refuses_existing_checkpoints_without_resume(tmp_path, capsys):
    from jaxswe.config import config_from_dict
    from jaxswe.rl.loop import run_rl
    from jaxswe.stages.context import StageContext

    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "1" / "_CHECKPOINT_METADATA").write_text(json.dumps({}))
    ctx = StageContext(config_from_dict({}), tmp_path, None, None, [], [], None)
    with pytest.raises(Exception, match="--resume"):
        run_rl(ctx, resume=False)


def test_turn_penalty_threshold_checked_before_work(tmp_path, config, capsys):
    run_dir = tmp_path / "run"
    argv = ["rl", "--config", str(config), "--run-dir", str(run_dir), "--set", "agent.max_turns=3"]
    code, err = _run(argv + ["--set", "rl.turn_penalty_threshold=5"], capsys)
    assert code == 2 and "rl.turn_penalty_threshold (5) must be below agent.max_turns (3)" in err
    assert not run_dir.exists()
