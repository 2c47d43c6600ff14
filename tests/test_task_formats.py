"""Published task formats load as published and get their official defaults."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from envs import TaskError, load_tasks, official
from envs.tasks import reverse_patch

DATA = Path(__file__).parent / "data" / "published"
needs_swebench = pytest.mark.skipif(not official.available(), reason="the swebench extra is not installed")


@needs_swebench
def test_verified_records_get_official_spec_image_and_parser():
    django, sympy, astropy = load_tasks(DATA / "swe_bench_verified.jsonl")
    assert django.test_command.endswith(
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators"
    )
    assert "export LANG=en_US.UTF-8" in django.test_cmd  # the spec's eval_commands run first
    assert django.log_parser == "parse_log_django"
    assert django.image == "sweb.eval.x86_64.django__django-11099:latest"
    assert django.remote_image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert django.install["install"] == "python -m pip install -e ." and django.install["python"] == "3.6"
    assert (
        django.fail_to_pass[0] == "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"
    )
    assert django.env_commit == "419a78300f7cd27611196e1e464d50fd0385ff27"
    assert django.workdir == "/testbed" and "conda activate testbed" in django.shell_init
    assert sympy.test_command.endswith("bin/test -C --verbose sympy/core/tests/test_basic.py")
    assert sympy.log_parser == "parse_log_sympy"
    assert astropy.test_command == "pytest -rA astropy/modeling/tests/test_separable.py"  # the 4.3 spec
    assert astropy.log_parser == "parse_log_pytest_v2"
    # round trip: what a task writes reads back into the same task
    again = [json.loads(json.dumps(t.to_record())) for t in (django, sympy, astropy)]
    path = DATA.parent / "_roundtrip.tmp.json"
    try:
        path.write_text(json.dumps(again))
        assert load_tasks(path) == [django, sympy, astropy]
    finally:
        path.unlink(missing_ok=True)


def test_swe_gym_rebench_v1_v2_smith_load_as_published():
    (gym,) = load_tasks(DATA / "swe_gym.jsonl")
    assert gym.format == "swe-gym" and gym.test_command == "pytest -n0 -rA tests/test_ssm/test_ssm_boto3.py"
    assert gym.remote_image == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert "conda activate testbed" in gym.shell_init
    (v1,) = load_tasks(DATA / "swe_rebench_v1.json")
    assert v1.format == "swe-rebench"
    assert (
        v1.test_command == "pytest --no-header -rA --tb=no -p no:cacheprovider toolz/tests/test_itertoolz.py"
    )
    assert v1.install["pip_packages"] == ["pytest==8.3.5"] and v1.install["python"] == "3.11"
    assert v1.image == "swerebench/sweb.eval.x86_64.pytoolz_1776_toolz-603"
    (v2,) = load_tasks(DATA / "swe_rebench_v2.jsonl")
    assert v2.format == "swe-rebench-v2" and v2.workdir == "/cachetools" and v2.shell_init == ""
    assert (
        v2.test_command == "pytest -rA --tb=no -p no:cacheprovider tests/test_cache.py"
    )  # no directives added
    assert v2.install["install"] == ["pip install -e ."]
    (smith,) = load_tasks(DATA / "swe_smith.json")
    assert smith.format == "swe-smith" and smith.test_patch == "" and smith.test_directives == ()
    assert [t.rules for t in (gym, v1, v2, smith)] == ["swebench-4", "swebench-4", "rebench-v2", "swebench-4"]
    raw = json.loads((DATA / "swe_smith.json").read_text())[0]
    assert smith.patch == reverse_patch(raw["patch"]) and "+    return a + b" in smith.patch


def test_reverse_patch_is_what_git_apply_reverses(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
        ).stdout

    git("init", "-q")
    (repo / "a.py").write_text("x = 1\ny = 2\n")
    (repo / "gone.py").write_text("old\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (repo / "a.py").write_text("x = 1\ny = 3\nz = 4\n")
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("new\n")
    git("add", "-A")
    forward = git("diff", "--cached")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bug")
    (tmp_path / "rev.diff").write_text(reverse_patch(forward))
    git("apply", str(tmp_path / "rev.diff"))
    git("add", "-A")
    assert git("diff", "--cached", "HEAD~1") == ""  # back at the base state
    assert reverse_patch(reverse_patch(forward)) == forward


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"version": "0.1"}, "version"),  # django has no SWE-bench spec at 0.1
        ({"install_config": "[1]"}, "install_config"),
        ({"log_parser": "parse_log_nope"}, "log_parser"),
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
        ({"test_cmd": ["pytest", 3]}, "test_cmd"),
        ({"workdir": 5}, "workdir"),
        ({"format": "swe-nope"}, "format"),
    ],
)
@needs_swebench
def test_bad_published_record_names_the_field(tmp_path, over, field):
    record = json.loads((DATA / "swe_bench_verified.jsonl").read_text().splitlines()[0])
    record.update(over)
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(
        TaskError, match=f"record 0 \\(instance_id='django__django-11099'\\): field '{field}'"
    ):
        load_tasks(tmp_path / "t.jsonl")
