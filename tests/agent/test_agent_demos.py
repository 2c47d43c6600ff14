"""gold_patch_to_commands: git diffs -> compact scaffold commands that rebuild the patched tree."""

import random

import pytest
from helpers import git

from envs import LocalSandbox
from jaxswe.agent.commands import Command, parse_action
from jaxswe.agent.demos import DemoError, command_reply, gold_patch_to_commands
from jaxswe.agent.prompts import load_prompts
from jaxswe.agent.scaffold import Scaffold

PROMPTS = load_prompts("default")


def make_repo(path, files):
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")


def diff_to(repo, target):
    """Write `target` files (None deletes) into repo, return `git diff` of it, then restore the base."""
    for name, text in target.items():
        p = repo / name
        if text is None:
            p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "HEAD")
    git(repo, "reset", "-q", "--hard", "HEAD")
    return patch


def apply_with_scaffold(repo, commands):
    with LocalSandbox(repo, isolation="none") as sandbox:
        sc = Scaffold(sandbox, PROMPTS, command_timeout_s=20)
        for cmd in commands:
            action = parse_action(command_reply(cmd, "Applying the change."))
            assert isinstance(action, Command), (cmd, action)
            out = sc.run(action)
            assert "Error:" not in out and "[exit code" not in out, (cmd, out)
        git(sc.workdir, "add", "-A")
        return git(sc.workdir, "diff", "--cached", "HEAD")


def test_multi_hunk_edits_new_deleted_and_tricky_content(tmp_path):
    base = {
        "pkg/a.py": "".join(f"line {i}\n" for i in range(1, 41)),
        "pkg/gone.py": "x = 1\n",
        "README.md": "# title\n\ntext\n",
    }
    repo = tmp_path / "repo"
    make_repo(repo, base)
    a = [f"line {i}" for i in range(1, 41)]
    a[0:1] = ["first", "  inserted at top"]  # replace + insert at the top
    a[15:17] = []  # pure deletion in the middle
    a[30:30] = ["EOF", "    ```", "\tnew"]  # insertion holding a heredoc marker and a fence
    a.append("appended at the end")
    target = {
        "pkg/a.py": "\n".join(a) + "\n",
        "pkg/gone.py": None,
        "pkg/sub/new.py": "def f():\n    return 'EOF'\n",
        "README.md": "# title\n\n```python\nx = 1\n```\n",
    }
    patch = diff_to(repo, target)
    commands = gold_patch_to_commands(patch)
    kinds = [c.split()[0] for c in commands]
    assert kinds.count("create") == 1 and kinds.count("rm") == 1
    assert kinds.count("edit") == patch.count("\n@@ ") - 2  # one per hunk, less the new and deleted file
    assert apply_with_scaffold(repo, commands) == patch


def test_edits_hold_only_the_changed_span(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo, {"m.py": "".join(f"v{i} = {i}\n" for i in range(20))})
    patch = diff_to(repo, {"m.py": "".join(f"v{i} = {i if i != 10 else -1}\n" for i in range(20))})
    assert gold_patch_to_commands(patch) == ["edit --file m.py 11:11 << 'EOF'\nv10 = -1\nEOF"]


@pytest.mark.slow
def test_random_edits_roundtrip(tmp_path):
    rng = random.Random(0)
    files = {f"f{k}.txt": "".join(f"{k}-{i}\n" for i in range(rng.randint(1, 30))) for k in range(25)}
    repo = tmp_path / "repo"
    make_repo(repo, files)
    target = {}
    for name, text in files.items():
        lines = text.splitlines()
        for _ in range(rng.randint(1, 6)):
            i = rng.randint(0, len(lines))
            op = rng.choice(["ins", "del", "rep"])
            if op == "ins":
                lines[i:i] = [f"new {rng.random():.3f}" for _ in range(rng.randint(1, 3))]
            elif lines:
                j = min(len(lines), i + rng.randint(1, 3))
                lines[i:j] = [] if op == "del" else [f"rep {rng.random():.3f}"]
        target[name] = "".join(f"{line}\n" for line in lines)
    patch = diff_to(repo, target)
    assert apply_with_scaffold(repo, gold_patch_to_commands(patch)) == patch
    # the demo's decoys: the same edits writing back the lines they replace leave the tree unchanged
    decoy = gold_patch_to_commands(patch, write_back=True)
    assert [c.split(" << ")[0].split()[:3] for c in decoy] == [
        c.split(" << ")[0].split()[:3] for c in gold_patch_to_commands(patch)
    ]  # edit --file PATH: the same files in the same order
    assert apply_with_scaffold(repo, decoy) == ""


def test_bad_patches_are_clear_errors():
    with pytest.raises(DemoError, match="no file diffs"):
        gold_patch_to_commands("just text")
    binary = "diff --git a/x.bin b/x.bin\nindex 1..2 100644\nBinary files a/x.bin and b/x.bin differ\n"
    with pytest.raises(DemoError, match="binary"):
        gold_patch_to_commands(binary)
    new_file = (
        "diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x=1\n"
    )
    assert gold_patch_to_commands(new_file) == ["create n.py << 'EOF'\nx=1\nEOF"]
    with pytest.raises(DemoError, match="no write-back edit"):
        gold_patch_to_commands(new_file, write_back=True)


def test_command_reply_fence_outgrows_inner_fences():
    text = command_reply("create a.md\n````\nx\n````", "Write the docs.")
    assert text.startswith("Write the docs.\n`````\n") and parse_action(text).lines == ("````", "x", "````")
