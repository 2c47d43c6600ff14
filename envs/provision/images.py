"""Docker images without a registry: a Debian base built with debootstrap, per-task images on it.

The base image is built locally (`debootstrap --variant=minbase`, then `docker import` of the root
file system) from the Debian mirror apt is configured with on this machine, and cached by tag.
Task images are layered as SWE-bench layers them: base -> environment image (a venv at
/opt/jaxswe-venv over the image's Python with `pip_packages`; shared by every task with the same
recipe) -> instance image (the task's clean repository at its workdir; there, as the official repo
script runs them, the recipe's `pre_install` lines, its requirements as swebench reads and cleans
them (the text a local task venv installs) and its `install` command). A recipe whose Python is not
the base's gets the host's install of that Python (pyenv, uv or conda, found as a local task venv
finds it) copied into an image layer at its own path, and its venv on it. A recipe the base cannot
build as its harness would (a conda environment.yml) is refused with the reason. Build steps run
WITH network (the engine's default bridge, or `$JAXSWE_BUILD_NETWORK`); sandboxes run the result
with network none. A recipe with no such steps is the base image + the repository. SWE-bench /
SWE-rebench images (`sweb.eval.x86_64.<id>`, or SWE-bench's remote name) are used as they are when
the engine already has them.

    python -m envs base [--tag T] [--force]      build (or keep) the base image
    python -m envs task FILE [--force]           build the task images of a task file

This module uses only the `docker` command line for the base image, so `.ci/docker.sh` can run it
with the system Python before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from envs.errors import SandboxError
from envs.sandbox.docker_sandbox import SANDBOX_USER, TESTBED

if TYPE_CHECKING:
    from envs.provision.venvs import Interpreter
    from envs.tasks.records import Task

BASE_IMAGE = "jaxswe/base:bookworm"
BASE_PYTHON = "3.11"  # Debian bookworm's python3
BASE_PACKAGES = (
    "python3", "python-is-python3", "python3-pytest", "python3-venv", "python3-pip", "git", "procps",
    "coreutils", "patch",
)  # fmt: skip
TASK_VENV = "/opt/jaxswe-venv"


def apt_mirror(apt_dir: str | Path = "/etc/apt") -> tuple[str, str]:
    """(mirror URI, suite) of the first main Debian source apt is configured with."""
    apt_dir = Path(apt_dir)
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or not path.name.endswith((".list", ".sources")):
            continue
        text = path.read_text(errors="replace")
        if path.name.endswith(".sources"):  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (k.strip().lower(), v.strip())
                    for k, _, v in (ln.partition(":") for ln in stanza.splitlines() if not ln.startswith("#"))
                    if v
                )
                uris, suites = fields.get("uris", "").split(), fields.get("suites", "").split()
                if "deb" in fields.get("types", "").split() and uris and suites and "security" not in uris[0]:
                    return uris[0], suites[0]
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    rest = [p for p in parts[1:] if not p.startswith("[")]
                    if len(rest) >= 2 and "security" not in rest[0]:
                        return rest[0], rest[1]
    raise SandboxError(f"no Debian mirror found in {apt_dir}/sources.list*; pass mirror= explicitly")


def _docker(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    if shutil.which("docker") is None:
        raise SandboxError("the `docker` command line is not installed")
    return subprocess.run(["docker", *args], input=input, capture_output=True)


def image_exists(tag: str) -> bool:
    """Whether the engine (DOCKER_HOST) has an image with this tag."""
    return _docker("image", "inspect", tag).returncode == 0


def build_base_image(
    tag: str = BASE_IMAGE, *, mirror: str | None = None, suite: str | None = None, force: bool = False
) -> str:
    """Build the Debian base image with debootstrap + `docker import`; skip when `tag` exists."""
    if not force and image_exists(tag):
        print(f"base image {tag} exists", file=sys.stderr)
        return tag
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed (apt-get install debootstrap)")
    default_mirror, default_suite = apt_mirror()
    mirror, suite = mirror or default_mirror, suite or default_suite
    with tempfile.TemporaryDirectory(prefix="jaxswe-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(rootfs)]
        print(f"debootstrap {suite} from {mirror} (a few minutes)", file=sys.stderr)
        done = subprocess.run([*cmd, mirror], capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"debootstrap failed ({done.returncode}): {done.stderr[-2000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "--change", 'CMD ["bash"]', "--change", "ENV LANG=C.UTF-8", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise SandboxError(f"docker import of the base rootfs failed: {imported.stderr[-2000:]}")
    print(f"built base image {tag}", file=sys.stderr)
    return tag


def task_image_name(task: Task) -> str:
    """The local image tag of a task built on the base image."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", task.instance_id.lower()).strip("-.")[:100]
    return f"jaxswe/task:{name}-{task.base_commit[:12]}"


def _repo_tar(repo_dir: Path, workdir: str = TESTBED) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(repo_dir), arcname=workdir.strip("/"))
    return buf.getvalue()


def build_network() -> str:
    """The network of image build steps: `$JAXSWE_BUILD_NETWORK`, default the engine's `bridge`
    (an engine started with --bridge=none needs `host`, as `docker build --network host`)."""
    return os.environ.get("JAXSWE_BUILD_NETWORK", "bridge")


_BUILD_CA = "/tmp/jaxswe-build-ca.pem"


def build_ca_bundle() -> str | None:
    """The CA bundle build steps trust (a network behind a TLS-inspecting proxy): the file named by
    `$JAXSWE_BUILD_CA_BUNDLE`, else the host's pip or OpenSSL bundle when set; None: the image's own."""
    for name in ("JAXSWE_BUILD_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE"):
        path = os.environ.get(name)
        if path and os.path.isfile(path):
            return path
    return None


def _ca_archive(path: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=_BUILD_CA.lstrip("/"))
    return buf.getvalue()


def _layer(
    client, image: str, tag: str, script: str, *, archive: bytes | None = None, env: dict | None = None,
    workdir: str = "/",
) -> str:  # fmt: skip
    """Commit `image` + `script` (run WITH network, the build step) as `tag`. The build step alone
    trusts build_ca_bundle() (copied in, removed before the commit; the image's env is `env`)."""
    ca = build_ca_bundle()
    step_env = dict(env or {})
    if ca:
        step_env |= {"PIP_CERT": _BUILD_CA, "SSL_CERT_FILE": _BUILD_CA, "REQUESTS_CA_BUNDLE": _BUILD_CA}
        script = f"{script}\nrm -f {_BUILD_CA}"
    container = client.containers.create(
        image, command=["bash", "-c", script], network_mode=build_network(), labels={"jaxswe.build": "1"},
        working_dir=workdir, environment=step_env,
    )  # fmt: skip
    try:
        if ca:
            container.put_archive("/", _ca_archive(ca))
        if archive is not None:
            container.put_archive("/", archive)
        container.start()
        status = container.wait(timeout=3600)
        if status.get("StatusCode") != 0:
            logs = container.logs().decode(errors="replace")[-1500:]
            raise SandboxError(f"building image {tag} failed ({status.get('StatusCode')}): {logs}")
        repository, _, version = tag.partition(":")
        conf = {"WorkingDir": workdir, "Cmd": ["bash"]}
        if env:
            conf["Env"] = [f"{k}={v}" for k, v in env.items()]
        container.commit(repository=repository, tag=version, conf=conf)
    finally:
        container.remove(force=True)
    return tag


def _has(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _lines(value) -> list[str]:
    return [value] if isinstance(value, str) and value else list(value or [])


def image_python(task: Task) -> Interpreter | None:
    """The host interpreter a task's image runs its venv on: the recipe's Python when it is not the
    base's (found as `envs.provision.venvs.find_python` finds it, a self-contained install copied into the
    image at its own path), None for the base's own. SandboxError when none can be copied."""
    from envs.provision.venvs import find_python

    version = str(task.install.get("python") or "")
    if not version or version == BASE_PYTHON:
        return None
    python = find_python(version)
    if python.prefix.startswith("/usr/"):
        raise SandboxError(
            f"its Python {version} is a system install ({python.prefix}); an image takes a "
            "self-contained one (pyenv, uv or conda)"
        )
    return python


def _prefix_tar(python: Interpreter) -> bytes:
    """The interpreter's tree at its own path (its executable's run path names it), without CPython's
    own test suite (a third of it), each directory above it made traversable, not listable, by the
    sandbox user (/root is 0700)."""
    buf = io.BytesIO()
    parts = Path(python.prefix).parts[1:]
    suite = "/".join([*parts, "lib", f"python{python.version}", "test"])
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for depth in range(1, len(parts)):
            parent = tarfile.TarInfo("/".join(parts[:depth]))
            parent.type, parent.mode = tarfile.DIRTYPE, 0o711
            tar.addfile(parent)
        tar.add(python.prefix, arcname="/".join(parts), filter=lambda m: None if m.name == suite else m)
    return buf.getvalue()


def interpreter_image(python: Interpreter, *, client, base: str = BASE_IMAGE) -> str:
    """`base` with the host interpreter `python` in it (cached by base, prefix and version)."""
    base_id = client.images.get(base).id.removeprefix("sha256:")[:12]
    key = json.dumps([base_id, python.prefix, python.path, python.version])
    tag = f"jaxswe/python:{python.version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not _has(client, tag):
        _layer(client, base, tag, f"set -e\n{shlex.quote(python.path)} -c 'import ssl, sqlite3, ctypes'",
               archive=_prefix_tar(python))  # fmt: skip
    return tag


def env_image(task: Task, *, client, base: str = BASE_IMAGE) -> tuple[str, dict[str, str]]:
    """(the environment image of the task's recipe over `base`, its environment variables)."""
    pip = _lines(task.install.get("pip_packages"))
    installs = bool(task.install.get("install") or task.requirement_files or task.install.get("pre_install"))
    python = image_python(task)
    if python is not None:  # its own venv: the base's pytest is the base Python's
        base = interpreter_image(python, client=client, base=base)
        venv = [f"{shlex.quote(python.path)} -m venv {TASK_VENV}"]
    elif pip or installs:
        # the image's own packages (pytest from the base) stay visible; pip_packages go into the venv,
        # which has its own pip (the base's pip is externally managed)
        venv = [f"python3 -m venv --system-site-packages {TASK_VENV}"]
    else:
        return base, {}
    if pip:
        venv.append(f"{TASK_VENV}/bin/pip install -q {' '.join(shlex.quote(p) for p in pip)}")
    if python is None:  # the base's pytest under the venv's Python (its script would run the system Python)
        launcher = f"#!{TASK_VENV}/bin/python\nimport sys\nimport pytest\nsys.exit(pytest.console_main())\n"
        script_path = f"{TASK_VENV}/bin/pytest"
        venv.append(f"[ -e {script_path} ] || {{ printf %s {shlex.quote(launcher)} > {script_path} "
                    f"&& chmod 755 {script_path}; }}")  # fmt: skip
    script = "\n".join(["set -e", *venv])
    base_id = client.images.get(base).id.removeprefix("sha256:")[:12]
    tag = f"jaxswe/env:{hashlib.sha256(json.dumps([base_id, script]).encode()).hexdigest()[:16]}"
    env = {"PATH": f"{TASK_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "VIRTUAL_ENV": TASK_VENV}  # fmt: skip
    if not _has(client, tag):
        _layer(client, base, tag, script)
    return tag, env


def requirement_steps(task: Task) -> list[str]:
    """Shell lines that install the task's requirements as the official harness does (the first
    file that exists at the environment commit, cleaned by swebench:
    envs.provision.venvs.task_requirements)."""
    if not task.requirement_files:
        return []
    from envs.provision.venvs import task_requirements

    path, text = task_requirements(task)
    file = "/tmp/jaxswe-requirements.txt"
    write = f"printf %s {shlex.quote(text)} > {file}"
    return [f"# {path}", write, f"pip install -q -r {file}", f"rm -f {file}"]


def build_task_image(task: Task, *, client=None, base: str = BASE_IMAGE, force: bool = False) -> str:
    """The task's instance image: its environment image + the clean repository at its workdir,
    requirement files and `install` run there (cached by tag)."""
    import docker

    from envs.tasks.repos import clean_template

    client = client or docker.from_env()
    if not _has(client, base):
        raise SandboxError(f"base image {base} is missing; build it with `python -m envs base`")
    try:
        python = image_python(task)
    except SandboxError as err:
        raise SandboxError(f"cannot build the image of {task.instance_id}: {err}") from None
    version = python.version if python is not None else BASE_PYTHON
    if (problem := task.recipe_problem(version, local=False)) is not None:
        raise SandboxError(
            f"cannot build the image of {task.instance_id}: {problem}; use its published image"
        )
    parent, env = env_image(task, client=client, base=base)
    chown = f"chown -R {SANDBOX_USER} {shlex.quote(task.workdir)}"  # what the install wrote too
    steps = [*_lines(task.install.get("pre_install")), *requirement_steps(task)]
    steps += _lines(task.install.get("install"))
    if python is not None:  # pytest when the recipe brought none, as a local task venv gets it
        steps.append('python -c "import pytest" 2>/dev/null || pip install -q pytest')
    script = "\n".join(["set -e", *steps, chown])  # in the workdir
    parent_id = client.images.get(parent).id.removeprefix("sha256:")[:12]
    step = hashlib.sha256(script.encode()).hexdigest()[:8]
    tag = f"{task_image_name(task)}-{parent_id}-{step}"  # a rebuilt base, environment or step: a new image
    if not force and _has(client, tag):
        return tag
    archive = _repo_tar(clean_template(task), task.workdir)
    return _layer(client, parent, tag, script, archive=archive, env=env, workdir=task.workdir)


# Run once in a SWE image: drop everything in /testbed's git after base_commit ($1).
_CLEAN_HISTORY = r"""
set -e
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'  # root, a user's repo
cd "$2"
git rev-parse -q --verify "$1^{commit}" >/dev/null || { echo "base_commit $1 is not in $2"; exit 3; }
[ "$(git rev-parse HEAD)" = "$1" ] || git -c advice.detachedHead=false checkout -q "$1"
branch=$(git symbolic-ref -q --short HEAD || true)
git remote | xargs -r -n1 git remote remove
git for-each-ref --format='%(refname)' | while read -r ref; do
  [ "$ref" = "refs/heads/$branch" ] || git update-ref -d "$ref"
done
rm -f .git/FETCH_HEAD .git/ORIG_HEAD
git reflog expire --expire=now --all
git gc -q --prune=now
chown -R "$3" "$2"
"""


def clean_image_name(task: Task) -> str:
    """The tag of a task's cleaned SWE image (a new cleaning script gives a new tag)."""
    script = hashlib.sha256(_CLEAN_HISTORY.encode()).hexdigest()[:8]
    return task_image_name(task).replace("jaxswe/task:", "jaxswe/clean:", 1) + f"-{script}"


def clean_swe_image(task: Task, *, client=None, image: str | None = None) -> str:
    """A derived image of the task's SWE image (`image`, default task.image) with the history of
    the repository at task.workdir cut at base_commit and the repository owned by SANDBOX_USER (cached)."""
    import docker

    client = client or docker.from_env()
    image = image or task.image
    tag = clean_image_name(task)
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    container = client.containers.create(
        image, command=["bash", "-c", _CLEAN_HISTORY, "clean", task.base_commit, task.workdir, SANDBOX_USER],
        network_mode="none", labels={"jaxswe.build": "1"},
    )  # fmt: skip
    try:
        container.start()
        status = container.wait(timeout=1800)
        if status.get("StatusCode") != 0:
            logs = container.logs().decode(errors="replace")[-1000:]
            raise SandboxError(f"task {task.instance_id}: cleaning {image} failed: {logs}")
        repository, _, version = tag.partition(":")
        container.commit(
            repository=repository, tag=version, conf={"WorkingDir": task.workdir, "Cmd": ["bash"]}
        )
    finally:
        container.remove(force=True)
    return tag


def task_image(task: Task, *, client=None, base: str = BASE_IMAGE) -> tuple[str, str]:
    """(image, shell init) of a task: its published image (its name, else SWE-bench's remote name;
    history cleaned) when the engine has it, else the layered image built from the local repository."""
    import docker

    client = client or docker.from_env()
    published = [name for name in (task.image, task.remote_image) if name]
    for name in published:
        if _has(client, name):
            return clean_swe_image(task, client=client, image=name), task.shell_init
    if published and task.source_dir is None and task.repos_dir_clone() is None:
        raise SandboxError(
            f"task {task.instance_id}: image {published[0]} is not on the engine and there is no "
            f"local repository to build one from (looked in {task.repos_dir_clone(missing_ok=True)})"
        )
    return build_task_image(task, client=client, base=base), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    base = sub.add_parser("base", help="build the Debian base image (cached by tag)")
    base.add_argument("--tag", default=BASE_IMAGE)
    base.add_argument("--mirror")
    base.add_argument("--suite")
    base.add_argument("--force", action="store_true")
    task = sub.add_parser("task", help="build the task images of a task file (or `builtin`)")
    task.add_argument("file")
    task.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "base":
        print(build_base_image(args.tag, mirror=args.mirror, suite=args.suite, force=args.force))
    else:
        from envs.tasks.records import load_tasks

        for t in load_tasks(args.file):
            print(build_task_image(t, force=args.force))
    return 0
