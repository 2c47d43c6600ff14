"""Published task formats load as published and get their official defaults."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import DATA

from envs import TaskError, load_tasks
from envs.tasks import official
from envs.tasks.records import reverse_patch

PUBLISHED = DATA / "published"
needs_swebench = pytest.mark.skipif(not official.available(), reason="the swebench extra is not installed")


REAL_SWE_BENCH = ("swe_bench_verified_real.jsonl", "swe_bench_lite_real.json", "swe_bench_dev_real.json")


def _real_swe_bench_records():
    out = []
    for name in REAL_SWE_BENCH:
        text = (PUBLISHED / name).read_text()
        rows = (
            [json.loads(x) for x in text.splitlines() if x.strip()]
            if name.endswith(".jsonl")
            else json.loads(text)
        )
        out += [(name, r) for r in rows]
    return out


@needs_swebench
def test_verified_records_get_official_spec_image_and_parser():
    tasks = {t.instance_id: t for name in REAL_SWE_BENCH for t in load_tasks(PUBLISHED / name)}
    django, sympy, astropy = (
        tasks[i] for i in ("django__django-11099", "sympy__sympy-13031", "astropy__astropy-12907")
    )
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
    assert sympy.test_command.endswith("bin/test -C --verbose sympy/matrices/tests/test_sparse.py")
    assert sympy.log_parser == "parse_log_sympy"
    assert astropy.test_command == "pytest -rA astropy/modeling/tests/test_separable.py"  # the 4.3 spec
    assert astropy.log_parser == "parse_log_pytest_v2"
    # round trip: what a task writes reads back into the same task
    again = [json.loads(json.dumps(t.to_record())) for t in (django, sympy, astropy)]
    path = PUBLISHED.parent / "_roundtrip.tmp.json"
    try:
        path.write_text(json.dumps(again))
        assert load_tasks(path) == [django, sympy, astropy]
    finally:
        path.unlink(missing_ok=True)


@needs_swebench
@pytest.mark.parametrize(
    ("name", "record"), _real_swe_bench_records(), ids=lambda x: x if isinstance(x, str) else x["instance_id"]
)
def test_real_swe_bench_records_run_what_swebench_derives(name, record):
    """Each real record: the test command, eval commands, parser, image and install recipe that
    swebench 4.1 derives from it (its eval script's test line, its spec, its parser for the repo)."""
    from swebench.harness.constants import END_TEST_OUTPUT, MAP_REPO_VERSION_TO_SPECS, START_TEST_OUTPUT
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.test_spec.python import make_eval_script_list_py

    (task,) = [t for t in load_tasks(PUBLISHED / name) if t.instance_id == record["instance_id"]]
    spec = MAP_REPO_VERSION_TO_SPECS[record["repo"]][record["version"]]
    script = make_eval_script_list_py(
        record, spec, "testbed", "/testbed", record["base_commit"], record["test_patch"]
    )
    test_line = script[script.index(f": '{START_TEST_OUTPUT}'") + 1]
    assert script[script.index(test_line) + 1] == f": '{END_TEST_OUTPUT}'"
    *eval_commands, command = task.test_command.split("; ")
    assert command == test_line and eval_commands == spec.get("eval_commands", [])
    assert task.format == "swe-bench" and task.rules == "swebench-5"
    assert task.log_parser == MAP_REPO_TO_PARSER[record["repo"]].__name__
    assert (
        task.image
        == official.instance_image(record["instance_id"])
        == f"sweb.eval.x86_64.{record['instance_id'].lower()}:latest"
    )
    assert task.install == {k: v for k, v in spec.items() if k not in ("test_cmd", "eval_commands")}
    assert task.workdir == "/testbed" and task.env_commit == record["environment_setup_commit"]
    f2p = record["FAIL_TO_PASS"]
    assert list(task.fail_to_pass) == (json.loads(f2p) if isinstance(f2p, str) else f2p)


def test_the_real_rebench_v2_record_loads_as_its_eval_script_runs_it():
    """SWE-rebench V2's own sample (a C task): its `scripts/eval.py` runs `install_config.test_cmd`
    in `/<repo name>` of `image_name` and parses with `parse_log_jq` (the same code as swebench's)."""
    if not official.available():
        pytest.skip("parse_log_jq comes from the swebench extra")
    (task,) = load_tasks(PUBLISHED / "swe_rebench_v2_real.json")
    assert task.format == "swe-rebench-v2" and task.rules == "rebench-v2"
    assert task.test_command == "make check" and task.workdir == "/netcdf-c" and task.shell_init == ""
    assert task.image == "docker.io/swerebenchv2/unidata-netcdf-c:1925-ad6bff3"
    assert task.log_parser == "parse_log_jq" and task.install["install"][-1] == "make -j$(nproc)"
    assert len(task.fail_to_pass) == 12 and "tst_filter.sh" in task.fail_to_pass
    log = "PASS: tst_filter.sh\nFAIL: t_dap3a\n"
    from envs.tasks.parsers import PARSERS

    assert PARSERS[task.log_parser](log)[0] == {"tst_filter.sh": "PASSED", "t_dap3a": "FAILED"}


def test_swe_gym_rebench_v1_v2_smith_standins_load_as_published():
    """Hand-made stand-ins (tests/data/published/SOURCES.md): no real record of these was reachable."""
    (gym,) = load_tasks(PUBLISHED / "swe_gym_standin.jsonl")
    assert gym.format == "swe-gym" and gym.test_command == "pytest -n0 -rA tests/test_ssm/test_ssm_boto3.py"
    assert gym.remote_image == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert "conda activate testbed" in gym.shell_init
    (v1,) = load_tasks(PUBLISHED / "swe_rebench_v1_standin.json")
    assert v1.format == "swe-rebench"
    assert (
        v1.test_command == "pytest --no-header -rA --tb=no -p no:cacheprovider toolz/tests/test_itertoolz.py"
    )
    assert v1.install["pip_packages"] == ["pytest==8.3.5"] and v1.install["python"] == "3.11"
    assert v1.image == "swerebench/sweb.eval.x86_64.pytoolz_1776_toolz-603"
    (v2,) = load_tasks(PUBLISHED / "swe_rebench_v2_standin.jsonl")
    assert v2.format == "swe-rebench-v2" and v2.workdir == "/cachetools" and v2.shell_init == ""
    assert (
        v2.test_command == "pytest -rA --tb=no -p no:cacheprovider tests/test_cache.py"
    )  # no directives added
    assert v2.install["install"] == ["pip install -e ."]
    (smith,) = load_tasks(PUBLISHED / "swe_smith_standin.json")
    assert smith.format == "swe-smith" and smith.test_patch == "" and smith.test_directives == ()
    assert [t.rules for t in (gym, v1, v2, smith)] == ["swebench-4", "swebench-4", "rebench-v2", "swebench-4"]
    raw = json.loads((PUBLISHED / "swe_smith_standin.json").read_text())[0]
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
    record = json.loads((PUBLISHED / "swe_bench_verified_real.jsonl").read_text().splitlines()[5])
    record.update(over)
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(
        TaskError, match=f"record 0 \\(instance_id='django__django-11099'\\): field '{field}'"
    ):
        load_tasks(tmp_path / "t.jsonl")


@pytest.mark.parametrize("parser", ["parse_log_phpunit", "parse_log_react_pdf", "parse_log_julia"])
def test_rebench_v2_parsers_that_differ_from_swebench_ones_are_refused(tmp_path, parser):
    """SWE-rebench V2's phpunit and react_pdf parsers strip durations from names, swebench's of the
    same name do not; julia is V2's own. Such a record is refused, not graded by other code."""
    (record,) = json.loads((PUBLISHED / "swe_rebench_v2_real.json").read_text())
    record["install_config"]["log_parser"] = parser
    (tmp_path / "t.json").write_text(json.dumps(record))
    with pytest.raises(TaskError, match=f"field 'log_parser' names '{parser}', a SWE-rebench V2 parser"):
        load_tasks(tmp_path / "t.json")
