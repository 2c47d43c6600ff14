"""eval.heldout: tasks no stage trains on, checked at start and compared stage against stage."""

import json

import pytest

from jaxswe.config import load_config
from jaxswe.errors import UserError
from jaxswe.stages.context import check_inputs
from jaxswe.stages.stages import paired_comparisons

CONFIG = "configs/demo-cpu.yaml"


def test_heldout_tasks_are_known_and_never_trained_on():
    cfg = load_config(CONFIG, ["task_subset=[builtin__stack-1]", "eval.heldout=[builtin__lru-1]"])
    tasks, eval_tasks, heldout = check_inputs(cfg)
    assert [t.instance_id for t in tasks] == [t.instance_id for t in eval_tasks] == ["builtin__stack-1"]
    assert [t.instance_id for t in heldout] == ["builtin__lru-1"]
    assert check_inputs(load_config(CONFIG, ["eval.heldout=[]"])).heldout == []  # the default: none
    with pytest.raises(UserError, match="training tasks"):
        check_inputs(
            load_config(CONFIG, ["task_subset=[builtin__stack-1]", "eval.heldout=[builtin__stack-1]"])
        )
    with pytest.raises(UserError, match="unknown instance ids"):
        check_inputs(load_config(CONFIG, ["eval.heldout=[builtin__nope-1]"]))


def test_paired_comparisons_read_the_named_report(tmp_path):
    def report(stage, name, successes):
        (tmp_path / stage).mkdir(exist_ok=True)
        per_task = {t: {"samples": 8, "successes": c, "rate": c / 8} for t, c in successes.items()}
        (tmp_path / stage / name).write_text(json.dumps({"per_task": per_task}))

    report("rft", "final_eval.json", {"a": 2, "b": 3})
    report("rl", "final_eval.json", {"a": 6, "b": 7})
    report("rft", "heldout_eval.json", {"h": 1})
    report("rl", "heldout_eval.json", {"h": 1})
    stages = ["rft", "rl", "eval"]
    (train,) = paired_comparisons(tmp_path, stages)
    (held,) = paired_comparisons(tmp_path, stages, report="heldout_eval")
    assert (train["before"], train["after"], train["num_tasks"]) == ("rft", "rl", 2)
    assert train["diff"] == pytest.approx(0.5) and train["these_tasks"]["significant"]
    assert (held["num_tasks"], held["diff"]) == (1, 0.0) and not held["these_tasks"]["significant"]
    assert train["these_tasks"]["method"] == "independent"  # no per-episode outcomes to pair
    # reports with each sample's outcome (seed order) pair episode by episode
    outcomes = {"rft": [1, 1, 0, 0, 0, 0, 0, 0], "rl": [1, 1, 1, 1, 1, 1, 0, 0]}
    for stage, o in outcomes.items():
        per_task = {"a": {"samples": 8, "successes": sum(o), "rate": sum(o) / 8, "outcomes": o}}
        (tmp_path / stage / "final_eval.json").write_text(json.dumps({"per_task": per_task}))
    (train,) = paired_comparisons(tmp_path, stages)
    assert (
        train["these_tasks"]["method"] == "paired" and train["these_tasks"]["discordant"]["after_only"] == 4
    )
