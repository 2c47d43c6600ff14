"""Bad input to the stage commands: one clear line, exit 2, nothing written, before any work."""

import json

import pytest
import yaml

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
    from jaxswe.stages.context import StageContext
    from jaxswe.stages.rl import run_rl

    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "1" / "_CHECKPOINT_METADATA").write_text(json.dumps({}))
    ctx = StageContext(config_from_dict({}), tmp_path, None, None, [], [], None)
    with pytest.raises(Exception, match="--resume"):
        run_rl(ctx, resume=False)  # before any work


def test_turn_penalty_threshold_checked_before_work(tmp_path, config, capsys):
    run_dir = tmp_path / "run"
    argv = ["rl", "--config", str(config), "--run-dir", str(run_dir), "--set", "agent.max_turns=3"]
    code, err = _run(argv + ["--set", "rl.turn_penalty_threshold=5"], capsys)
    assert code == 2 and "rl.turn_penalty_threshold (5) must be below agent.max_turns (3)" in err
    assert not run_dir.exists()


@pytest.mark.parametrize("command", ["rl", "pipeline"])
def test_a_refused_rerun_leaves_the_run_dir_as_it_was(tmp_path, capsys, command):
    """Without --resume a run dir that holds a run is refused before anything is written; a file as
    run dir is one line too; --resume cannot change the model the checkpoints hold."""
    config = tmp_path / "c.yaml"
    config.write_text("name: t\nstages: [rl]\nmodel: {preset: tiny}\nrl: {iterations: 1}\n")
    run = tmp_path / "run"
    stage = run / "rl"  # both write RUN_DIR/<stage>
    stage.mkdir(parents=True)
    from jaxswe.config import dump_config, load_config

    for d in {run, stage}:
        dump_config(load_config(config), d / "config.yaml")
    (stage / "metrics.jsonl").write_text('{"step": 1}\n')
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    argv = [command, "--config", str(config), "--run-dir", str(run)]
    code, err = _run(argv + ["--set", "rl.iterations=5"], capsys)
    assert code == 2 and "is not empty; pass --resume" in err and len(err.splitlines()) == 1, err
    code, err = _run(argv + ["--resume", "--set", "model.preset=qwen2.5-0.5b"], capsys)
    assert code == 2 and "--resume cannot change the model" in err and "model.preset: 'tiny'" in err, err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    if command == "rl":  # a stage dir given as the run dir (a run of the older layout) is that stage's
        code, err = _run([*argv[:-1], str(stage), "--resume", "--set", "model.preset=qwen2.5-0.5b"], capsys)
        assert code == 2 and "is a stage dir (an older layout)" in err and "cannot change the model" in err, (
            err
        )
    (tmp_path / "file").write_text("")
    code, err = _run([command, "--config", str(config), "--run-dir", str(tmp_path / "file")], capsys)
    assert code == 2 and "--run-dir is a file" in err, err


def test_resumed_settings_are_named_and_kept_in_the_config_history(tmp_path, capsys):
    from jaxswe.config import config_from_dict
    from jaxswe.stages.stage_io import record_config

    first = config_from_dict({"name": "t", "optimizer": {"lr": 1e-3}})
    record_config(tmp_path, first)
    record_config(tmp_path, first)  # an unchanged resume adds nothing
    second = config_from_dict({"name": "t", "optimizer": {"lr": 2e-3}, "rl": {"iterations": 7}})
    record_config(tmp_path, second)
    err = capsys.readouterr().err
    assert "resumed with optimizer.lr: 0.001 -> 0.002" in err and "rl.iterations: " in err, err
    lines = [json.loads(line) for line in (tmp_path / "config_history.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["config"] == first.model_dump(mode="json")
    assert lines[1]["changes"]["optimizer.lr"] == [1e-3, 2e-3] and set(lines[1]["changes"]) == {
        "optimizer.lr",
        "rl.iterations",
    }
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == second.model_dump(mode="json")
