"""Scaffold commands over a real sandbox (local git checkout; the docker backend where an engine runs)."""

import os
import subprocess

import pytest
from helpers import git
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from envs import LocalSandbox, load_tasks, open_sandbox
from envs.sandbox.docker_sandbox import engine_available
from jaxswe.agent.commands import SPECIAL_COMMANDS, FormatError, parse_action
from jaxswe.agent.prompts import load_prompts
from jaxswe.agent.scaffold import Scaffold

PROMPTS = load_prompts("default")
LINES = [f"line {i}" for i in range(1, 31)]


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("\n".join(LINES) + "\n")
    (src / "pkg" / "dup.py").write_text("x = 1\ny = 2\nx = 1\n")
    (src / "README").write_text("no newline at end")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return src


@pytest.fixture
def sc(repo):
    with LocalSandbox(repo, isolation="none") as sandbox:
        yield Scaffold(sandbox, PROMPTS, window_lines=10, command_timeout_s=20)


def run(sc, body):
    return sc.run(parse_action(f"Reasoning.\n```\n{body}\n```"))


def status(sc, cwd=None, file="n/a"):
    return f"(Current directory: {cwd or sc.workdir}, current file: {file}) bash-$"


def test_shell_output_exit_code_and_status_line(sc):
    assert run(sc, "echo hello") == f"hello\n{status(sc)}"
    out = run(sc, "ls missing-dir")
    assert "No such file" in out and "[exit code 2]" in out and out.endswith(status(sc))
    assert run(sc, "true") == f"{PROMPTS.observations['no_output']}\n{status(sc)}"


def test_cd_persists_and_env_does_not(sc):
    run(sc, "cd pkg")
    assert sc.cwd == f"{sc.workdir}/pkg"
    assert run(sc, "ls").startswith("dup.py\nmod.py\n")
    assert run(sc, "pwd").splitlines()[0] == f"{sc.workdir}/pkg"
    assert run(sc, "export FOO=1; cd ..; exit 3").endswith(status(sc))
    assert sc.cwd == sc.workdir
    assert run(sc, "echo ${FOO:-unset}").startswith("unset")


def test_shell_timeout_is_reported(repo):
    with LocalSandbox(repo, isolation="none") as sandbox:
        sc = Scaffold(sandbox, PROMPTS, command_timeout_s=1)
        out = run(sc, "sleep 30")
        assert "stopped after 1 seconds" in out.replace("1.0", "1") and out.endswith(status(sc))


def test_long_output_is_cut_in_the_middle(repo):
    with LocalSandbox(repo, isolation="none") as sandbox:
        sc = Scaffold(sandbox, PROMPTS, output_limit_chars=200)
        out = run(sc, "seq 1 10000")
        assert out.startswith("1\n2\n") and "characters truncated" in out and "\n10000\n" in out
        assert len(out) < 400


def test_open_goto_scroll_windows(sc):
    path = f"{sc.workdir}/pkg/mod.py"
    out = run(sc, "open pkg/mod.py")
    assert out.splitlines()[0] == "[File: pkg/mod.py (30 lines total)]"  # relative: no sandbox dir
    assert "1:line 1\n" in out and "10:line 10\n(20 more lines below)" in out
    assert out.endswith(status(sc, file=path))
    out = run(sc, "goto 20")
    assert "(14 more lines above)\n15:line 15" in out and "24:line 24\n(6 more lines below)" in out
    out = run(sc, "scroll_down")
    assert "(20 more lines above)\n21:line 21" in out and "30:line 30\n" in out
    out = run(sc, "scroll_down")  # clamps at the end
    assert "21:line 21" in out
    out = run(sc, "scroll_up")
    assert "11:line 11" in out and "(10 more lines below)" in out
    out = run(sc, "open pkg/mod.py 3")
    assert "1:line 1\n" in out
    assert "past the end" in run(sc, "goto 99")


def test_file_command_errors_are_observations(sc):
    assert "not found" in run(sc, "open nope.py")
    assert "is a directory" in run(sc, "open pkg")
    assert "no file is open" in run(sc, "edit 1:1\nx")
    assert "no file is open" in run(sc, "goto 3")
    assert "no file is open" in run(sc, "search_file foo")
    run(sc, "open pkg/mod.py")
    assert "outside" in run(sc, "edit 40:41\nx")
    assert "already exists" in run(sc, "create pkg/mod.py")


def test_edit_replace_insert_delete_append(sc, repo):
    run(sc, "open pkg/mod.py")
    out = run(sc, "edit 2:3 << 'EOF'\n    two\n\tthree  \nEOF")
    assert "2:    two\n3:\tthree  \n4:line 4" in out
    run(sc, "edit 5:4\ninserted")
    run(sc, "edit 7:8 << 'EOF'\nEOF")
    n = len(sc.sandbox.read_file("pkg/mod.py").splitlines())
    run(sc, f"edit {n + 1}:{n}\nappended")
    text = sc.sandbox.read_file("pkg/mod.py")
    expected = ["line 1", "    two", "\tthree  ", "line 4", "inserted", "line 5", *LINES[7:], "appended"]
    assert text == "\n".join(expected) + "\n"
    out = run(sc, "edit --file README 1:1\nnew readme")
    assert sc.sandbox.read_file("README") == "new readme"  # no trailing newline added
    assert out.endswith(status(sc, file=f"{sc.workdir}/README"))


def test_replace_unique_ambiguous_all_and_missing(sc):
    out = run(sc, "replace --file pkg/dup.py\n<<<<<<< SEARCH\ny = 2\n=======\ny = 3\n>>>>>>> REPLACE")
    assert "2:y = 3" in out
    out = run(sc, "replace\n<<<<<<< SEARCH\nx = 1\n=======\nx = 0\n>>>>>>> REPLACE")
    assert "matches 2 places" in out and "lines 1, 3" in out
    run(sc, "replace --replace-all\n<<<<<<< SEARCH\nx = 1\n=======\nx = 0\nz = 0\n>>>>>>> REPLACE")
    assert sc.sandbox.read_file("pkg/dup.py") == "x = 0\nz = 0\ny = 3\nx = 0\nz = 0\n"
    assert "was not found" in run(sc, "replace\n<<<<<<< SEARCH\nx = 1\n=======\n>>>>>>> REPLACE")


def test_create_and_search_file(sc):
    out = run(sc, "create new/dir/a.py << 'EOF'\ndef f():\n    return 1\nEOF")
    path = f"{sc.workdir}/new/dir/a.py"
    assert out.startswith("[File: new/dir/a.py (2 lines total)]") and out.endswith(status(sc, file=path))
    assert sc.sandbox.read_file("new/dir/a.py") == "def f():\n    return 1\n"
    out = run(sc, "search_file return")
    assert out.startswith('Found 1 matches for "return" in new/dir/a.py:\n2:    return 1')
    assert "No matches" in run(sc, 'search_file "line 99" pkg/mod.py')
    out = run(sc, "search_file 'line 3' pkg/mod.py")
    assert out.startswith('Found 2 matches for "line 3" in pkg/mod.py:\n3:line 3\n30:line 30\n')


def test_format_error_observation(sc):
    err = parse_action("no block here")
    assert isinstance(err, FormatError)
    out = sc.format_error(err)
    assert "fenced code block" in out and out.endswith(status(sc))
    out = sc.format_error(parse_action("```\nls\n```\n```\npwd\n```"))
    assert "2 fenced blocks" in out


def test_usage_error_observation(sc):
    assert run(sc, "goto x").startswith("Error: LINE must be a positive integer")


def test_diff_patch_has_new_files_not_caches_and_applies(sc, repo, tmp_path):
    base = sc.start_tree()
    run(sc, "open pkg/mod.py")
    run(sc, "edit 1:1\nfirst")
    run(sc, "create pkg/new.py\nvalue = 42")
    run(sc, "mkdir -p pkg/__pycache__ && echo junk > pkg/__pycache__/mod.cpython-311.pyc && rm pkg/dup.py")
    run(sc, "git -c user.name=a -c user.email=a@a commit -qam 'agent commit'")  # still diffed vs base
    patch = sc.diff_patch(base)
    assert "pkg/new.py" in patch and "__pycache__" not in patch and "deleted file" in patch
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "apply", "-"], input=patch, text=True, check=True)
    assert (clone / "pkg" / "mod.py").read_text().startswith("first\nline 2\n")
    assert (clone / "pkg" / "new.py").read_text() == "value = 42\n"
    assert not (clone / "pkg" / "dup.py").exists()


_words = st.sampled_from(
    ["pkg/mod.py", "pkg", "README", "nope.py", "../x", "/", "1", "0", "7:3", "2:1", "31:30", "1:99", "99",
     "-1", "--file", "--replace-all", "<<", "'EOF'", "EOF", "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE",
     "line 3", "x = 1", "\n", " ", "\t", "é"]
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from([c for c in SPECIAL_COMMANDS if c != "submit"]),
    st.lists(st.one_of(_words, st.text(max_size=6)), max_size=12),
)
def test_file_commands_never_raise_on_fuzzed_arguments(sc, name, words):
    action = parse_action(f"```\n{name} {' '.join(words)}\n```")
    assume(not isinstance(action, FormatError) and getattr(action, "name", "") != "shell")
    assert sc.run(action).endswith(") bash-$")


@pytest.mark.docker
@pytest.mark.skipif(not engine_available() and not os.environ.get("CI"), reason="no Docker engine reachable")
def test_file_commands_on_docker_backend():
    task = load_tasks("builtin")[0]
    with open_sandbox(task, "docker", timeout=60) as sandbox:
        sc = Scaffold(sandbox, PROMPTS, window_lines=5, command_timeout_s=60)
        base = sc.start_tree()
        assert run(sc, "cd /tmp").endswith(status(sc, cwd="/tmp"))
        run(sc, f"cd {sandbox.workdir}")
        out = run(sc, "create docker_probe/a.py << 'EOF'\nA = 1\nB = 2\nEOF")
        assert "[File: docker_probe/a.py (2 lines total)]" in out
        run(sc, "edit 2:2\nB = 3")
        run(sc, "replace\n<<<<<<< SEARCH\nA = 1\n=======\nA = 0\n>>>>>>> REPLACE")
        assert sandbox.read_file(f"{sandbox.workdir}/docker_probe/a.py") == "A = 0\nB = 3\n"
        assert "2:B = 3" in run(sc, "search_file B")
        assert "1:A = 0" in run(sc, "open docker_probe/a.py 1")
        patch = sc.diff_patch(base)
        assert "+A = 0" in patch and "docker_probe/a.py" in patch


def test_file_observations_name_no_sandbox_directory(sc):
    """The local sandbox's directory is random per episode: file commands show repository paths
    (the demo prompts' status line shows no directory either)."""
    outs = [
        run(sc, "open pkg/mod.py 12"),
        run(sc, "open nope.py"),
        run(sc, "open pkg"),
        run(sc, "search_file 'line 3' pkg/mod.py"),
        run(sc, "goto 999"),
        run(sc, "create pkg/mod.py"),
    ]
    bodies = [out.rsplit("\n", 1)[0] for out in outs]  # the default prompts' status line names the cwd
    assert all(sc.workdir not in body for body in bodies), bodies
    assert outs[0].startswith("[File: pkg/mod.py (30 lines total)]") and "file nope.py not found" in outs[1]
