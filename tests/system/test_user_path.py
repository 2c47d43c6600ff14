"""The path a user takes through the `jaxswe` CLI, where a slip used to give a silently wrong
answer: a mistyped --resume, which weights `jaxswe eval` evaluates, a stage that trained nothing, a
finished stage resumed; and what JAX's fork warning prints (what Ctrl-C prints:
tests/rl/test_rl_async.py). Each a real `jaxswe` subprocess on a tiny toy RL stage where one can show it."""

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, user_env

from jaxswe.cli import main
from jaxswe.config import config_from_dict
from jaxswe.errors import UserError
from jaxswe.stages.evaluate import eval_weights
from jaxswe.stages.stages import check_trained

TOY = str(ROOT / "configs" / "toy-rl.yaml")
# one iteration of 2 x 2 two-turn episodes of a random policy: every reward -1, nothing to train on
TINY = ("rl.iterations=1", "rl.problems_per_iteration=2", "rl.group_size=2", "rl.resample_to_fill=false",
        "rollout.max_batch=4", "env.max_parallel=4", "agent.max_turns=2", "rl.turn_penalty_threshold=1",
        "env.toy_tasks=2")  # fmt: skip


def _jaxswe(*args: str, sets: tuple[str, ...] = TINY) -> subprocess.CompletedProcess:
    env = user_env()
    argv = [*args, *(a for s in sets for a in ("--set", s))]
    return subprocess.run(
        [sys.executable, "-m", "jaxswe", *argv], env=env, capture_output=True, text=True, timeout=300
    )


def test_resume_of_a_missing_run_is_refused(tmp_path, capsys):
    """A mistyped --run-dir with --resume: one line, exit 2, nothing written (not a fresh run)."""
    typo = tmp_path / "typo"
    out = _jaxswe("rl", "--config", TOY, "--run-dir", str(typo), "--resume", sets=())
    assert out.returncode == 2 and out.stderr == (
        f"jaxswe: error: {typo / 'rl'}: nothing to resume (does not exist); check --run-dir, "
        "or drop --resume to start a new run\n"
    ), out.stderr
    assert not typo.exists()
    (tmp_path / "empty").mkdir()
    for command in ("pipeline", "eval"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--config", TOY, "--run-dir", str(tmp_path / "empty"), "--resume"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and "nothing to resume" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["empty"] and not any((tmp_path / "empty").iterdir())


@pytest.mark.slow
def test_untrained_stage_fails_resumes_as_it_is_and_is_what_eval_takes(tmp_path, capsys):
    """One tiny `jaxswe rl` (one toy stage; every later step reads it): it trained nothing, says so
    and fails; --resume keeps it as it is; `jaxswe eval --run-dir` evaluates it and says so."""
    run_dir = tmp_path / "run"
    _untrained_rl_fails(run_dir, _jaxswe("rl", "--config", TOY, "--run-dir", str(run_dir)))
    _resumed_finished_stage_stays(run_dir, capsys)
    _eval_takes_the_trained_stage(run_dir, tmp_path / "fresh", capsys)


def _untrained_rl_fails(run_dir: Path, out: subprocess.CompletedProcess) -> None:
    """A stage with 0 optimizer steps: exit 2 with one line saying so; its summary.json stays."""
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "jaxswe: error: the rl stage trained nothing: 0 optimizer steps in 1 iterations"
    ), last
    assert "allow_untrained_stage=true" in last
    summary = json.loads((run_dir / "rl" / "summary.json").read_text())
    assert summary["optimizer_steps"] == 0 and summary["episodes_drawn"] == 4, summary


def _resumed_finished_stage_stays(run_dir: Path, capsys) -> None:
    """--resume of a finished stage runs nothing and leaves every file byte for byte (its counters
    were once rewritten to this process's zeros); allow_untrained_stage lets it pass."""
    stage = run_dir / "rl"
    before = {p: p.read_bytes() for p in stage.rglob("*") if p.is_file()}
    sets = [a for s in (*TINY, "allow_untrained_stage=true") for a in ("--set", s)]
    main(["rl", "--config", TOY, "--run-dir", str(run_dir), "--resume", *sets])
    out = capsys.readouterr()
    assert f"jaxswe: == rl finished before ({stage / 'summary.json'})\n" in out.err, out.err
    assert "jaxswe rl 1/1" not in out.err  # no iteration ran
    assert {p: p.read_bytes() for p in stage.rglob("*") if p.is_file()} == before
    assert json.loads(out.out) == json.loads(before[stage / "summary.json"])


def _eval_takes_the_trained_stage(run_dir: Path, fresh: Path, capsys) -> None:
    """`jaxswe eval --run-dir RUN` without --init-from evaluates RUN's newest trained stage and says
    so (stderr and summary.json); with no weights at all it refuses rather than score a random init."""
    out = _jaxswe("eval", "--config", TOY, "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"jaxswe: == eval of {run_dir / 'rl'} -> {run_dir / 'eval'}\n" in out.stderr, out.stderr
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["weights"] == str(run_dir / "rl") and summary["num_episodes"] == 2, summary
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--config", TOY, "--run-dir", str(fresh)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("jaxswe: error: eval has no trained weights"), err
    assert len(err.splitlines()) == 1 and not fresh.exists(), err


def test_untrained_rft_is_refused_unless_allowed(capsys):
    rft = {"name": "rft", "samples": 6, "sft_steps": 0, "trajectories_kept": 0}
    with pytest.raises(UserError, match="rft stage trained nothing: no resolved trajectory among 6 samples"):
        check_trained(rft, config_from_dict({}))
    assert check_trained(rft, config_from_dict({"allow_untrained_stage": True})) is rft
    assert "WARNING: the rft stage trained nothing" in capsys.readouterr().err
    trained = {"name": "rl", "iterations": 2, "optimizer_steps": 3}
    assert check_trained(trained, config_from_dict({})) is trained


def test_eval_weights_in_words():
    toy = {"env": {"tasks": "toy"}, "model": {"preset": "tiny"}}
    assert eval_weights(config_from_dict({}), "runs/a/rl") == "runs/a/rl"
    assert eval_weights(config_from_dict({"model": {"path": "/m"}}), None) == "model.path /m"
    allowed = config_from_dict({**toy, "eval": {"allow_random_init": True}})
    assert eval_weights(allowed, None) == "random init of the toy model (model.seed 0)"
    with pytest.raises(UserError, match="eval.allow_random_init=true"):
        eval_weights(config_from_dict(toy), None)


_FORKS = """
import subprocess, sys, warnings
import jax
jax.devices()  # JAX warns at every os.fork() from here on (subprocess with preexec_fn forks)
if sys.argv[1] == "once":
    from jaxswe.cli import _each_warning_once
    _each_warning_once()
for _ in range(5):
    with warnings.catch_warnings():  # as libraries do: it clears Python's once-per-place registry
        pass
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "copies"), [("once", 1), ("plain", 5)])
def test_jax_fork_warning_prints_once_per_process(mode, copies):
    """What the CLI installs first: each warning once per process. Without it JAX's os.fork()
    warning prints at every sandbox command (thousands in a demo's stderr)."""
    env = user_env()
    out = subprocess.run([sys.executable, "-c", _FORKS, mode], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("RuntimeWarning: os.fork() was called") == copies, out.stderr


def _running(cmdline: str) -> int:
    """How many processes run with this exact command line (NUL-separated, as /proc shows it)."""
    count = 0
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            count += proc.name.isdigit() and (proc / "cmdline").read_bytes() == cmdline.encode()
    return count


def test_cancelled_episodes_close_their_sandboxes_at_once():
    """What Ctrl-C does to SWE episodes: cancelled while each runs a long command in its sandbox,
    every environment closes at once (the command killed, the sandbox directory gone), not once
    the commands end."""
    from agent_helpers import ScriptRouter

    from envs import load_tasks
    from jaxswe.agent.demos import command_reply
    from jaxswe.agent.loop import run_episodes
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.rollout.types import SamplingParams
    from jaxswe.tokenizer import build_tokenizer

    tasks = load_tasks("builtin")[:2]
    tok = build_tokenizer([t.problem_statement for t in tasks], 1000)
    router = ScriptRouter(
        tok, {t.problem_statement.strip(): [command_reply("sleep 60", "Wait.")] for t in tasks}
    )
    envs = [SWEEnv(t, backend="local", command_timeout_s=120) for t in tasks]

    async def cancelled_after_start() -> tuple[float, list]:
        run = asyncio.ensure_future(
            run_episodes(
                envs,
                router,
                tok,
                sampling=SamplingParams(max_new_tokens=64),
                max_turns=3,
                max_context_tokens=4096,
                concurrency=2,
            )  # fmt: skip
        )
        while len(router.outputs) < len(tasks):  # both episodes sent their command
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 60
        while _running("sleep\x0060\x00") < len(tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # ... and their sandboxes run it (opening one can take seconds)
        roots = [env.sandbox.root for env in envs]
        run.cancel()
        t0 = time.monotonic()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        return time.monotonic() - t0, roots

    seconds, roots = asyncio.run(cancelled_after_start())
    assert seconds < 10 and roots and not any(root.exists() for root in roots), (seconds, roots)


def test_a_task_file_is_a_stage_input_in_one_flag(tmp_path):
    """`--tasks FILE` stands for the four overrides a demo config otherwise needs on a user's own
    task file; a later --set still wins, and a missing file is one line."""
    from jaxswe.cli.stages import task_file_overrides
    from jaxswe.config import ConfigError, load_config

    tasks = tmp_path / "yourlib.jsonl"
    tasks.write_text("")
    cfg = load_config(ROOT / "configs" / "demo-cpu.yaml", [*task_file_overrides(tasks), "eval.heldout=[x]"])
    assert cfg.env.tasks == cfg.env.eval_tasks == str(tasks.resolve()) and cfg.task_subset is None
    assert cfg.eval.heldout == ["x"]
    with pytest.raises(ConfigError, match="no such task file"):
        task_file_overrides(tmp_path / "typo.jsonl")
