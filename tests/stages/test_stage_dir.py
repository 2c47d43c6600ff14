"""A stage dir's file names come from one place (`StageDir`), the layout docs/architecture.md
shows, and every stage file goes through one atomic writer."""

import re

import pytest
from helpers import ROOT

from jaxswe.run.files import write_text_atomic
from jaxswe.run.layout import StageDir, is_stage_dir

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _names(stage: StageDir) -> list[str]:
    """Every path `StageDir` names, relative to the stage dir (one example of each pattern)."""
    properties = [n for n, v in vars(StageDir).items() if isinstance(v, property)]
    paths = [getattr(stage, n) for n in properties]
    paths += [stage.episodes("samples"), stage.iteration_episodes(7), stage.eval_report("final_eval")]
    paths += [stage.eval_table("final_eval"), stage.curves("rl"), stage.eval_plot("final_eval")]
    paths += [stage.eval_dir("final_eval")]
    return [str(p.relative_to(stage.path)) for p in paths]


def test_the_documented_layout_lists_every_file_a_stage_dir_holds(tmp_path):
    """The stage-dir section of docs/architecture.md shows each name (patterns by their example)."""
    section = ARCHITECTURE.read_text().split("## Stage-dir layout")[1].split("\n## ")[0]
    shown = set(re.findall(r"`([^`]+)`", section))
    names = _names(StageDir(tmp_path))
    assert "trajectories/iter_0007.jsonl" in names
    patterns = {"trajectories/iter_0007.jsonl": "trajectories/iter_NNNN.jsonl",
                "trajectories/samples.jsonl": "trajectories/NAME.jsonl", "final_eval.json": "NAME.json",
                "final_eval_table.txt": "NAME_table.txt", "plots/rl_curves.png": "plots/STAGE_curves.png",
                "plots/final_eval.png": "plots/NAME.png", "final_eval": "NAME/metrics.jsonl"}  # fmt: skip
    inside = {name.split("/")[0] for name in shown if "/" in name}  # folders shown by their files
    missing = [n for n in names if patterns.get(n, n) not in shown | inside]
    assert not missing, f"not in docs/architecture.md's stage-dir layout: {missing}"


def test_a_stage_dir_is_known_by_what_it_wrote(tmp_path):
    stage = StageDir(tmp_path / "rl")
    assert not is_stage_dir(stage.path)
    write_text_atomic(stage.metrics, '{"step": 1}\n')
    assert is_stage_dir(stage.path) and stage.metrics.read_text() == '{"step": 1}\n'


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path):
    path = tmp_path / "history.json"
    write_text_atomic(path, "old\n")

    def parts():
        yield "new, half"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, parts())
    assert path.read_text() == "old\n"
    write_text_atomic(path, iter(["new\n", "whole\n"]))
    assert path.read_text() == "new\nwhole\n"
