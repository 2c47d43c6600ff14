"""SWEEnv on the built-in tasks (local backend): scripted policies through the token-exact loop."""

import asyncio
import os
import re
import threading

import pytest
from agent_helpers import ScriptRouter

import envs
from envs import SandboxError, load_tasks
from jaxswe.agent.demos import command_reply, gold_patch_to_commands
from jaxswe.agent.loop import run_episodes
from jaxswe.agent.swe_env import SWEEnv
from jaxswe.config import RunConfig
from jaxswe.rollout.types import SamplingParams
from jaxswe.tokenizer import build_tokenizer

TASKS = load_tasks("builtin")
SAMPLING = SamplingParams(max_new_tokens=2048)


@pytest.fixture(scope="module")
def tok():
    corpus = [t.problem_statement for t in TASKS] + [t.patch for t in TASKS]
    return build_tokenizer(corpus, 1000)


def play(tok, tasks, scripts, concurrency=2, episodes=None):
    """The trajectories of `scripts` played on `tasks` (in the SWEEnvs `episodes`, if given)."""
    router = ScriptRouter(tok, {t.problem_statement.strip(): s for t, s in zip(tasks, scripts, strict=True)})
    episodes = episodes or [SWEEnv(t, backend="local", window_lines=20, command_timeout_s=60) for t in tasks]
    return asyncio.run(
        run_episodes(
            episodes,
            router,
            tok,
            sampling=SAMPLING,
            max_turns=12,
            max_context_tokens=16384,
            concurrency=concurrency,
        )
    )


SUBMIT = command_reply("submit", "I am done.")


SHADOW_PDB = command_reply(
    "printf 'import sys\\nprint(\"PASSED everything\")\\nsys.exit(0)\\n' > pdb.py", "And a helper."
)


@pytest.mark.slow  # grades every built-in task (~1-2 s each)
def test_gold_patch_commands_resolve_every_builtin_task(tok):
    """Every gold fix, typed as commands, resolves its task through the agent loop; the root pdb.py
    written beside it (pytest's debugging plugin imports pdb) never reaches the run: reset, named
    in the grade, and the fix still resolves (the shadow alone resolves nothing:
    tests/environments/grading/test_grading_forgery.py)."""
    scripts = [
        [command_reply(c, "Apply the fix.") for c in gold_patch_to_commands(t.patch)] + [SHADOW_PDB, SUBMIT]
        for t in TASKS
    ]
    episodes = [SWEEnv(t, backend="local", window_lines=20, command_timeout_s=60) for t in TASKS]
    trajs = play(tok, TASKS, scripts, episodes=episodes)
    for task, traj, env in zip(TASKS, trajs, episodes, strict=True):
        assert (traj.ended_by, traj.reward, traj.infra_error) == ("submitted", 1.0, None), task.instance_id
        assert env.grade_result.dropped_paths == ("pdb.py",), (task.instance_id, env.grade_result.reason)
        assert _files(traj.patch) == _files(task.patch) | {"pdb.py"} and task.patch.strip() in traj.patch
        assert traj.task_id == task.instance_id and not any(traj.format_errors)
        traj.check()


def _files(patch: str) -> set[str]:
    return set(re.findall(r"^diff --git a/(\S+) ", patch, re.M))


@pytest.mark.slow  # grades every built-in task (~1-2 s each)
def test_submitting_nothing_resolves_nothing(tok):
    """Through the agent loop, on two tasks (that the empty patch resolves no built-in task is what
    tests/environments/grading/test_envs_builtin_suite.py validates)."""
    look = command_reply("ls && git status --short", "Let me look around first.")
    trajs = play(tok, TASKS[:2], [[look, SUBMIT]] * 2)
    for task, traj in zip(TASKS[:2], trajs, strict=True):
        assert (traj.ended_by, traj.reward, traj.patch) == ("submitted", 0.0, ""), task.instance_id


def test_reset_format_error_step_submit_and_grading(monkeypatch):
    task = TASKS[0]
    grades = []
    real_grade = envs.grade
    monkeypatch.setattr(envs, "grade", lambda *a, **k: grades.append(a) or real_grade(*a, **k))
    env = SWEEnv(task, backend="local", window_lines=7, demonstration=True)
    assert "7 lines" in env.system_prompt
    first = env.reset()
    workdir = env.sandbox.workdir
    assert task.problem_statement.strip() in first and "<demonstration>" in first
    assert first.endswith(f"(Current directory: {workdir}, current file: n/a) bash-$")
    step = env.step("I will do two things.\n```\nls\n```\n```\npwd\n```")
    assert step.format_error and not step.done and "2 fenced blocks" in step.observation
    step = env.step("Done?\n```\nsubmit now\n```")  # a usage error, not a submit
    assert not step.done and not step.format_error and "submit takes no arguments" in step.observation
    step = env.step("No command at all.")
    assert step.format_error and step.info["format_error"] == "no_command"
    step = env.step("List.\n```bash\ncd tests && ls\n```")
    assert not step.format_error and step.observation.endswith(
        f"(Current directory: {workdir}/tests, current file: n/a) bash-$"
    )
    step = env.step("Add a note.\n```\ncreate ../NOTES.txt\nhello\n```")
    assert "NOTES.txt (1 lines total)" in step.observation
    step = env.step("```\nsubmit\n```")
    assert step.done and step.ended_by == "submitted" and "+hello" in step.info["patch"]
    assert env.sandbox is None and not os.path.exists(workdir)  # closed on submit
    assert env.reward() == 0.0 and env.reward() == 0.0 and len(grades) == 1  # graded once, fresh sandbox
    assert env.grade_result.resolved is False
    with pytest.raises(RuntimeError, match="single-use"):
        env.reset()


def test_sandbox_is_closed_when_a_step_breaks():
    env = SWEEnv(TASKS[0], backend="local")
    env.reset()
    sandbox = env.sandbox
    sandbox.close()  # the sandbox dies under the episode
    with pytest.raises(SandboxError):
        env.step("```\nls\n```")
    assert env.sandbox is None
    assert env.reward() == 0.0  # never submitted


def test_broken_sandbox_ends_episode_as_infra_error(tok):
    def dying_factory(task):
        sandbox = envs.open_sandbox(task, "local")
        sandbox.close()
        return sandbox

    env = SWEEnv(TASKS[0], sandbox_factory=dying_factory)
    router = ScriptRouter(tok, {"": [SUBMIT]})
    [traj] = asyncio.run(
        run_episodes([env], router, tok, sampling=SAMPLING, max_turns=3, max_context_tokens=8192)
    )
    assert traj.ended_by == "error" and traj.reward is None and "closed sandbox" in traj.infra_error


def test_an_episode_cancelled_while_its_sandbox_opens_leaves_it_closed(tok):
    """Ctrl-C or the end of an RL stage cancels episodes whose sandbox is still being made (a pool
    slot, a container): the close runs first, and the sandbox made after it is closed too."""
    gate, opened = threading.Event(), []

    def slow_factory(task):
        gate.wait(30)
        opened.append(envs.open_sandbox(task, "local"))
        return opened[-1]

    env = SWEEnv(TASKS[0], sandbox_factory=slow_factory)

    async def cancel_while_opening():
        run = run_episodes([env], ScriptRouter(tok, {"": [SUBMIT]}), tok, sampling=SAMPLING, max_turns=3,
                           max_context_tokens=8192)  # fmt: skip
        episode = asyncio.ensure_future(run)
        await asyncio.sleep(0.2)
        episode.cancel()  # its close runs now; the sandbox opens 2 s later
        threading.Timer(2.0, gate.set).start()
        with pytest.raises(asyncio.CancelledError):
            await episode

    asyncio.run(cancel_while_opening())
    assert len(opened) == 1
    with pytest.raises(SandboxError, match="closed sandbox"):
        opened[0].exec("true")


def test_from_config_reads_agent_and_env_sections():
    config = RunConfig.model_validate({"agent": {"window_lines": 33}, "env": {"command_timeout_s": 5}})
    env = SWEEnv.from_config(TASKS[0], config)
    assert (env.window_lines, env.command_timeout_s, env.backend) == (33, 5, "local")
    assert "33 lines" in env.system_prompt


@pytest.mark.parametrize("in_trained_prompt", [False, True])
def test_demonstration_is_sampled_with_but_not_trained_on(tok, in_trained_prompt):
    """The one-shot demo is in the prompt the model samples with; the episode RFT trains on starts
    with the demo-free prompt (unless agent.demonstration_in_trained_prompt) and then holds the very
    same turns, token for token."""
    from jaxswe.agent.trajectory import ChatFormat

    task = TASKS[0]
    router = ScriptRouter(tok, {task.problem_statement.strip(): [SUBMIT]})
    env = SWEEnv(task, demonstration=True, demonstration_in_trained_prompt=in_trained_prompt)
    (traj,) = asyncio.run(
        run_episodes([env], router, tok, sampling=SAMPLING, max_turns=3, max_context_tokens=16384)
    )
    demo = env.prompts.demonstration.strip()
    if in_trained_prompt:
        assert demo[:40] in tok.decode(traj.input_ids[: traj.prompt_len]) and traj.sampled_prompt_ids is None
        return
    sampled = traj.sampled_prompt_ids
    assert demo and demo[:40] in tok.decode(sampled)
    chat = ChatFormat.from_tokenizer(tok)
    plain = SWEEnv(task).prompts.instance
    assert "{demonstration}" in plain
    head = traj.input_ids[: traj.prompt_len]
    assert head == chat.prompt_ids(env.system_prompt, env.trained_first_message)
    assert demo[:40] not in tok.decode(head) and traj.messages[1]["content"] == env.trained_first_message
    ((seen, generated),) = router.outputs  # one turn: SUBMIT
    assert seen == sampled and traj.input_ids[traj.prompt_len :] == generated
    traj.check()
    n = traj.prompt_len
    assert traj.rft_loss_mask()[:n].sum() == 0 and sum(traj.loss_mask) > 0
