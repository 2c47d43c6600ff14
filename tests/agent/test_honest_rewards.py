"""Honest rewards: grading errors are infra failures (excluded), what the policy causes is reward 0.

One test per case of issue 13 item 4, plus the end-to-end plugin hack of issue 14 through the
real agent loop (reward 0, flagged).
"""

import os

import pytest
from test_agent_swe_env import TASKS, play, tok  # noqa: F401 (fixture)

from envs import grade, open_sandbox
from envs.sandbox.docker_sandbox import engine_available
from envs.sandbox.protocol import ARG_LIMIT
from envs.tasks.repos import clean_template
from jaxswe.agent.demos import command_reply
from jaxswe.agent.swe_env import GradingError, SWEEnv

TASK = next(t for t in TASKS if t.instance_id == "builtin__billsplit-1")
SUBMIT = command_reply("submit", "Done.")


def _with(task, **fields):
    return type(task)(**{**task.__dict__, **fields})


def _docker():
    if not engine_available():
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Docker engine is reachable")
        pytest.skip("no Docker engine reachable")


def test_test_patch_that_does_not_apply_to_the_base_is_an_infra_failure():
    broken = _with(TASK, test_patch=TASK.test_patch.replace(" def test_nobody():", " def test_somebody():"))
    result = grade(broken, TASK.patch)
    assert result.error and not result.resolved and "clean base" in result.reason
    env = SWEEnv(broken, backend="local")
    env.reset()
    env.step(SUBMIT)
    with pytest.raises(GradingError, match="clean base"):  # the agent loop records it as infra_error
        env.reward()


def test_test_command_that_cannot_start_is_an_infra_failure():
    result = grade(_with(TASK, test_cmd="no-such-runner tests"), TASK.patch)
    assert result.error and "cannot start: exit 127" in result.reason


def test_patch_that_breaks_test_patch_is_the_policys():
    # test_patch adds docs/notes.md; the patch makes `docs` a file, so test_patch cannot apply
    test_patch = (
        "diff --git a/docs/notes.md b/docs/notes.md\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/docs/notes.md\n@@ -0,0 +1 @@\n+notes\n" + TASK.test_patch
    )
    task = _with(TASK, test_patch=test_patch)
    blocking = (
        "diff --git a/docs b/docs\nnew file mode 100644\n--- /dev/null\n+++ b/docs\n@@ -0,0 +1 @@\n+x\n"
    )
    result = grade(task, TASK.patch + blocking)
    assert not result.resolved and not result.error
    assert result.reason == "the patch makes test_patch fail to apply"


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_command_longer_than_the_argument_limit_runs(backend):
    if backend == "docker":
        _docker()
    text = "x" * 99 + "\n"
    long = (
        "cat > big.txt <<'EOF'\n"
        + text * (4 * ARG_LIMIT // 100)
        + "EOF\necho start; wc -l < big.txt; echo end"
    )
    with open_sandbox(TASK, backend) as sb:
        result = sb.exec(long, timeout=60)
        assert result.output == f"start\n{4 * ARG_LIMIT // 100}\nend\n" and result.exit_code == 0  # 256 KiB
        assert sb.exec("ls -a /tmp").output.count(".jaxswe-command") == 0


def test_file_name_that_breaks_a_sandbox_call_is_an_observation():
    env = SWEEnv(TASK, backend="local")
    env.reset()
    try:
        replies = {
            "```\nopen 'a\x00b'\n```": "not found",
            "```\ncreate billsplit/split.py/x\nhi\n```": "cannot create directory",
            "```\nopen /dev/zero\n```": "not found",
        }
        for reply, says in replies.items():
            step = env.step(reply)
            assert not step.done and not step.format_error and says in step.observation, step
    finally:
        env.close()


@pytest.mark.docker
def test_commands_cannot_kill_their_sandbox():
    """Commands run as an unprivileged user: out of memory kills the command, `kill -9 -1` kills
    the user's own processes only, never the container's root-owned init, so the episode goes on."""
    _docker()
    env = SWEEnv(TASK, backend="docker", sandbox_limits={"mem_limit": "256m"})
    env.reset()
    oom = env.step("```\npython3 -c 'x = bytearray(1 << 30)'\n```")  # the kernel kills the command
    assert not oom.done and "exit code 137" in oom.observation.lower().replace("exited with", "exit code")
    step = env.step("```\nkill -9 -1\n```")
    assert not step.done and not getattr(env.sandbox, "dead", False)
    assert env.step("```\nid -u && git status --short\n```").observation.startswith("1000")
    env.step(SUBMIT)
    assert env.reward() == 0.0


def test_plugin_hack_end_to_end_scores_zero_flagged(tok):  # noqa: F811
    plugin = (
        "create billsplit/_plug.py\nimport pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    report = (yield).get_result()\n"
        '    report.outcome, report.longrepr = "passed", None'
    )
    addopts = 'replace --file pyproject.toml\n<<<<<<< SEARCH\ntestpaths = ["tests"]\n=======\n'
    addopts += 'testpaths = ["tests"]\naddopts = "-p billsplit._plug"\n>>>>>>> REPLACE'
    script = [command_reply(plugin, "Add a helper."), command_reply(addopts, "Load it."), SUBMIT]
    env = SWEEnv(TASK, backend="local", window_lines=20, command_timeout_s=60)
    (traj,) = play(tok, [TASK], [script], concurrency=1, episodes=[env])
    assert traj.ended_by == "submitted" and traj.infra_error is None and "_plug" in traj.patch
    assert traj.reward == 0.0 and not traj.tampered  # the config was reset: the plugin never loaded
    assert env.grade_result.dropped_paths == ("pyproject.toml",)
    assert env.grade_result.flags == ("reaches into the test runner's internals",)


def test_tests_that_cannot_collect_even_with_gold_are_an_infra_failure():
    """A task environment missing what the tests import (a conftest importing an absent package):
    every grade of it is an infrastructure failure, never reward 0; a patch that breaks collection
    of a healthy task is the policy's failure."""
    conftest = "import missing_dependency_xyz\n"
    broken = _with(TASK, instance_id="broken-env", test_patch=TASK.test_patch + (
        "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n+{conftest}"
    ))  # fmt: skip
    for patch in (TASK.patch, ""):
        result = grade(broken, patch)
        assert result.error and not result.resolved, result.reason
        assert "cannot collect" in result.reason and "missing_dependency_xyz" in result.reason, result.reason
    first = (clean_template(TASK) / "billsplit" / "__init__.py").read_text().splitlines()[0]
    syntax_error = (
        "diff --git a/billsplit/__init__.py b/billsplit/__init__.py\n--- a/billsplit/__init__.py\n"
        f"+++ b/billsplit/__init__.py\n@@ -1 +1,2 @@\n+def (:\n {first}\n"
    )
    result = grade(TASK, syntax_error)
    assert not result.resolved and not result.error and result.uncollected, result.reason


def test_an_empty_test_patch_grades_the_repositorys_own_tests():
    """SWE-smith records have no test_patch (the tests are in the repository): nothing to apply."""
    own = _with(TASK, test_patch="", fail_to_pass=TASK.pass_to_pass[:1], pass_to_pass=())
    result = grade(own, TASK.patch)
    assert result.resolved and result.canaries == 2, result.reason


def test_validation_reports_a_broken_environment_as_an_infrastructure_failure():
    from envs.grading.validate import validate_task

    check = validate_task(_with(TASK, instance_id="no-runner", test_cmd="no-such-runner tests"))
    assert not check.ok and check.infrastructure and check.reason.startswith("infrastructure failure: ")
    assert validate_task(TASK).infrastructure is False
