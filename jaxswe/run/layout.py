"""Run-dir layout: a stage dir (what one stage command writes; `StageDir` names every file in it)
or a run dir whose subdirs are stages (a pipeline's: RUN_DIR/<stage>/). One resolver for every
command that takes either."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

# The files a tokenizer is read from (at least one of them) ...
TOKENIZER_MAIN = ("tokenizer.json", "tokenizer_config.json")
# ... and every tokenizer and chat-template file copied next to a model's weights (those present)
TOKENIZER_FILES = (*TOKENIZER_MAIN, "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja")  # fmt: skip
GENERATION_CONFIG = "generation_config.json"  # a model's eos and pad ids


@dataclass(frozen=True)
class StageDir:
    """The files of one stage dir, by name. A pipeline's run dir names its `summary`, `config`
    and `config_history` the same way."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def summary(self) -> Path:
        """The stage's summary: written when it finished."""
        return self.path / "summary.json"

    @property
    def partial_summary(self) -> Path:
        """An interrupted stage's summary so far."""
        return self.path / "summary_partial.json"

    @property
    def config(self) -> Path:
        """The settings the stage (or run) uses."""
        return self.path / "config.yaml"

    @property
    def config_history(self) -> Path:
        """One line per run of the dir: the first config, then each resume's changes."""
        return self.path / "config_history.jsonl"

    @property
    def model(self) -> Path:
        """The model's HF config and its tokenizer dir."""
        return self.path / "model.json"

    @property
    def metrics(self) -> Path:
        """One metrics row per step (RL: iteration)."""
        return self.path / "metrics.jsonl"

    @property
    def history(self) -> Path:
        """RL: each task's outcomes so far (the task filter of a later RL stage reads it)."""
        return self.path / "history.json"

    @property
    def task_filter(self) -> Path:
        """RL: the counts and the task pool of rl.task_filter."""
        return self.path / "task_filter.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def weights(self) -> Path:
        """The weights a rollout server loads (written through disk)."""
        return self.path / "weights"

    @property
    def tokenizer(self) -> Path:
        """The tokenizer a warmstart (or the toy model) builds, unless model.tokenizer is set."""
        return self.path / "tokenizer"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def report(self) -> Path:
        """`jaxswe inspect`'s HTML report."""
        return self.path / "report.html"

    def episodes(self, name: str) -> Path:
        """A JSONL file of episodes: demonstrations, decoys, samples, an eval's (by its name)."""
        return self.trajectories / f"{name}.jsonl"

    def iteration_episodes(self, step: int) -> Path:
        """RL: the episodes of iteration `step`."""
        return self.episodes(f"iter_{step:04d}")

    def eval_report(self, name: str) -> Path:
        """An eval's report (eval, final_eval, heldout_eval)."""
        return self.path / f"{name}.json"

    def eval_dir(self, name: str) -> Path:
        """Where an eval's metrics row and trackers go: the stage dir of an eval stage, its own
        folder for the evals at a training stage's end (final_eval, heldout_eval)."""
        return self.path if name == "eval" else self.path / name

    def eval_table(self, name: str) -> Path:
        """An eval's report as a text table."""
        return self.path / f"{name}_table.txt"

    def curves(self, stage: str) -> Path:
        """The plot of a training stage's metrics."""
        return self.plots / f"{stage}_curves.png"

    def eval_plot(self, name: str) -> Path:
        return self.plots / f"{name}.png"


def is_stage_dir(path: str | Path) -> bool:
    """Whether `path` holds what every stage dir holds at least one of once the stage has started."""
    stage = StageDir(path)
    return stage.path.is_dir() and any(
        p.exists() for p in (stage.checkpoints, stage.metrics, stage.trajectories)
    )


def sub_stages(run_dir: str | Path) -> list[Path]:
    """The stage dirs directly under `run_dir`, in run order: the order of the run's config.yaml
    `stages` list, stages it does not name after them by name; [] when there are none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    order: list[str] = []
    config = StageDir(run_dir).config
    if config.is_file():
        try:
            stages = (yaml.safe_load(config.read_text()) or {}).get("stages") or []
            order = [str(s) for s in stages] if isinstance(stages, list) else []
        except (yaml.YAMLError, AttributeError):
            order = []
    found = [d for d in run_dir.iterdir() if is_stage_dir(d)]
    return sorted(found, key=lambda d: (order.index(d.name) if d.name in order else len(order), d.name))


def holds_checkpoint(checkpoints: str | Path) -> bool:
    """Whether a checkpoints dir holds a committed step (a numbered subdir)."""
    checkpoints = Path(checkpoints)
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def newest_trained_stage(run_dir: str | Path) -> Path | None:
    """The stage dir under `run_dir` whose checkpoints were written last (`run_dir` itself when it is
    a stage dir with checkpoints); None when no stage there holds a checkpoint."""
    run_dir = Path(run_dir)
    if holds_checkpoint(StageDir(run_dir).checkpoints):
        return run_dir
    trained = [d for d in sub_stages(run_dir) if holds_checkpoint(StageDir(d).checkpoints)]
    return max(trained, key=lambda d: StageDir(d).checkpoints.stat().st_mtime) if trained else None


def stage_dirs(path: str | Path) -> list[Path]:
    """`[path]` for a stage dir, a run dir's stages (`sub_stages`) otherwise."""
    return [Path(path)] if is_stage_dir(path) else sub_stages(path)
