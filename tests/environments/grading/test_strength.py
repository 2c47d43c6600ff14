"""Test strength: wrong fixes derived from gold, graded in real local sandboxes; a planted weak task
(its tests check only the type of the result) against a strong built-in one; the CLI; RL's filter."""

import json

import pytest
from helpers import DATA

from envs import TaskError, load_tasks
from envs.grading.strength import (
    _documentation,
    compiled_key,
    filter_by_strength,
    measure,
    mutations,
    with_strength,
    without_hunk,
)
from jaxswe.cli import main
from jaxswe.config import config_from_dict
from jaxswe.errors import UserError
from jaxswe.rl.loop import drop_weak_tasks
from jaxswe.rl.strength import strength_summary
from jaxswe.stages.evaluate import task_strength

WEAK = DATA / "strength_tasks"
STRONG = "builtin__pagination-1"


def _cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="module")
def measured():
    weak = load_tasks(WEAK)[0]
    strong = next(t for t in load_tasks("builtin") if t.instance_id == STRONG)
    return {t.instance_id: (t, measure(t, budget=4, workers=2)) for t in (weak, strong)}


def test_mutations_at_exact_positions_and_equivalents_bounded():
    source = "def f(a, b):\n    x = 0\n    return a + b if a < b and ok(é) else 'é'\n"
    made = {(kind, change): text.splitlines()[2] for kind, _, change, text in mutations(source, {3})}
    assert made[("operator", "+ -> -")] == "    return a - b if a < b and ok(é) else 'é'"
    assert made[("operator", "and -> or")] == "    return a + b if a < b or ok(é) else 'é'"
    assert made[("comparison", "< -> >=")] == "    return a + b if a  >=  b and ok(é) else 'é'"
    assert made[("boundary", "< -> <=")] == "    return a + b if a  <=  b and ok(é) else 'é'"
    assert made[("constant", "'é' -> ''")] == '    return a + b if a < b and ok(é) else ""'
    assert made[("call", "ok(é) -> é")] == "    return a + b if a < b and é else 'é'"
    assert not any(text.splitlines()[1] != "    x = 0" for *_, text in mutations(source, {3}))
    comprehension = "ys = [y for y in xs if y > 0]\nz = min(ys, 0)\n"
    made = {change: text for _, _, change, text in mutations(comprehension, {1, 2})}
    assert made["if y > 0 dropped"] == "ys = [y for y in xs]\nz = min(ys, 0)\n"
    assert made["argument 0 dropped"] == "ys = [y for y in xs if y > 0]\nz = min(ys)\n"
    gold = "if 1:\n    x = 3\n"
    (equivalent,) = [text for _, _, change, text in mutations(gold, {1}) if change == "1 -> 2"]
    assert compiled_key(equivalent, "m.py") == compiled_key(gold, "m.py")  # `if 2:` compiles as `if 1:`
    assert compiled_key(gold.replace("3", "4"), "m.py") != compiled_key(gold, "m.py")
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import m\n"
    typed += "def f(x: 'm.T') -> int:\n    return 1\n"
    assert compiled_key(typed.replace("    import m", "    pass"), "t.py") == compiled_key(typed, "t.py")
    assert {change for *_, change, _ in mutations(typed, {4, 5})} == {"1 -> 2", "1 -> 0"}  # no hint mutated
    two = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n@@ -9 +9 @@\n-c\n+d\n"
    assert _documentation("docs/index.rst") and _documentation("CHANGES") and not _documentation("src/m.py")
    assert without_hunk(two, 0) == "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -9 +9 @@\n-c\n+d\n"


@pytest.mark.slow
def test_weak_task_is_found_and_strong_one_passes(measured):
    weak_task, weak = measured["weak__mean"]
    assert weak.strength is not None and weak.strength <= 0.25 and weak.undecided == 0, weak
    assert {(s.kind, s.change) for s in weak.survivors} >= {
        ("comparison", "> -> <="),
        ("boundary", "> -> >="),
    }
    assert all(s.patch.startswith("diff --git a/stats.py") for s in weak.survivors)
    strong_task, strong = measured[STRONG]
    assert strong.strength == 1.0 and not strong.survivors and strong.rejected == 4, strong
    kept, dropped, unmeasured = filter_by_strength(
        [with_strength(weak_task, weak), with_strength(strong_task, strong)], 0.5, measure_missing=False
    )
    assert [t.instance_id for t in kept] == [STRONG] and list(dropped) == ["weak__mean"] and not unmeasured


def test_cli_reports_strength_and_filters_weak_tasks(measured, tmp_path, capsys):
    assert _cli(["tasks", "validate", str(WEAK), "--strength", "--budget", "2", "--workers", "2"]) == 0
    out, err = capsys.readouterr()
    line = json.loads(out)
    assert line["strength"]["strength"] == 0.5 and len(line["strength"]["survivors"]) == 1, line
    assert "weak__mean: test strength 0.50 (1 of 2 wrong fixes rejected); survivors (possibly" in err, err
    records = tmp_path / "tasks.jsonl"
    records.write_text(
        "".join(json.dumps(with_strength(t, m).to_record()) + "\n" for t, m in measured.values())
    )
    out_file = tmp_path / "kept.jsonl"
    assert (
        _cli(["tasks", "filter", str(records), "--no-tests", "--min-strength", "0.5", "--out", str(out_file)])
        == 0
    )
    dropped = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    weak_strength = measured["weak__mean"][1].strength
    assert [d["instance_id"] for d in dropped] == ["weak__mean"]
    assert f"test strength {weak_strength:.2f} < 0.5" in dropped[0]["dropped"]
    (kept,) = load_tasks(out_file)
    assert kept.instance_id == STRONG and kept.strength == 1.0 and kept.survivors == ()
    (weak,) = load_tasks(records)[:1]
    assert weak.survivors and weak.survivors[0]["patch"].startswith("diff --git")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(with_strength(*measured[STRONG]).to_record() | {"strength": 1.5}) + "\n")
    with pytest.raises(TaskError, match="field 'strength' must be a number from 0 to 1 or null"):
        load_tasks(bad)


def test_rl_drops_weak_tasks_by_stored_strength(measured, tmp_path, capsys):
    records = tmp_path / "tasks.jsonl"
    records.write_text(
        "".join(json.dumps(with_strength(t, m).to_record()) + "\n" for t, m in measured.values())
    )
    ids = [t.instance_id for t, _ in measured.values()]
    cfg = config_from_dict({"env": {"tasks": str(records)}, "rl": {"min_strength": 0.5}})
    pool, counts = drop_weak_tasks(cfg, ids)
    assert pool == [STRONG] and counts["dropped"] == ["weak__mean"], counts
    assert counts["mean_strength"] == counts["lowest_strength"] == 1.0 and counts["below_1"] == {}, counts
    assert "task strength filter" in capsys.readouterr().err
    with pytest.raises(UserError, match="leaves no task to train on"):
        drop_weak_tasks(cfg, ["weak__mean"])


def test_summaries_report_the_strength_of_the_tasks_used():
    """The stored strength of the built-in tasks, as the eval and RL summaries report it."""
    cfg = config_from_dict({"env": {"tasks": "builtin"}})
    ids = ["builtin__stack-1", "builtin__slugify-1", "builtin__roman-1"]
    assert task_strength(cfg, ids) == {
        "measured": 3,
        "unmeasured": 0,
        "mean_strength": 2 / 3,
        "lowest_strength": 0.5,
        "below_1": {"builtin__roman-1": 0.5, "builtin__stack-1": 0.5},
    }
    assert task_strength(config_from_dict({"env": {"tasks": "toy"}}), ["toy-0"]) is None
    assert strength_summary(["a", "b", "a"], {"a": None})["unmeasured"] == 2
