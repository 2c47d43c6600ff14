"""Where metrics rows go besides metrics.jsonl: TensorBoard, Weights & Biases, MLflow.

`logging.backends` in the config (default [tensorboard]; W&B and MLflow from the extras
`jaxswe[wandb]`, `jaxswe[mlflow]`). TensorBoard events live in `<dir>/tb`; a resumed stage purges
the events past its last checkpoint. Each stage dir is one tracked run, resumed as the same run:
W&B's run id is derived from the stage dir's path, MLflow's is kept in `<dir>/mlflow_run_id`. W&B
follows its own settings (`wandb login`, WANDB_MODE=offline for no network); MLflow logs to
MLFLOW_TRACKING_URI, which must be set (a tracking server, or any store MLflow accepts). Only
scalar values are sent. Steps a resumed run logs again (rows after the last committed checkpoint)
are dropped by W&B (steps only grow) and logged once more by MLflow.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from jaxswe.errors import UserError


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def check_trackers(names: list[str]) -> None:
    """Refuse, before a stage starts, trackers that cannot open: not installed, or MLflow with no
    MLFLOW_TRACKING_URI."""
    for name in names:
        if importlib.util.find_spec("tensorboardX" if name == "tensorboard" else name) is None:
            raise UserError(f"logging.backends names {name}, not installed: pip install 'jaxswe[{name}]'")
    if "mlflow" in names and not os.environ.get("MLFLOW_TRACKING_URI"):
        raise UserError("logging.backends names mlflow: set MLFLOW_TRACKING_URI (e.g. http://host:5000)")


def _module(name: str) -> Any:
    check_trackers([name])
    return importlib.import_module(name)


class TensorBoardTracker:
    """Scalars as TensorBoard events in `<dir>/tb` (events from `start_step` on purged first)."""

    def __init__(self, directory: Path, start_step: int = 0):
        from tensorboardX import SummaryWriter  # imported here: it pulls in torch when installed

        self.writer = SummaryWriter(str(Path(directory) / "tb"), purge_step=start_step or None)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """One W&B run per stage dir (id from its path: a resumed stage continues it)."""

    def __init__(self, directory: Path, project: str, run_name: str, config: dict[str, Any]):
        wandb = _module("wandb")
        run_id = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=project, name=run_name, id=run_id, resume="allow", dir=str(directory),
                              config=config)  # fmt: skip

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """One MLflow run per stage dir in the experiment `project` (its id kept in the dir)."""

    def __init__(self, directory: Path, project: str, run_name: str, config: dict[str, Any]):
        mlflow = _module("mlflow")
        self.client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        self.metric = mlflow.entities.Metric
        id_file = directory / "mlflow_run_id"
        if id_file.is_file():
            self.run_id = id_file.read_text().strip()
            return
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        id_file.write_text(self.run_id + "\n")
        params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in _flat(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"rl.lr": ...} from nested dicts."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        out |= _flat(value, name + ".") if isinstance(value, dict) else {name: value}
    return out


def open_trackers(
    names: list[str], directory: str | Path, *, start_step: int, project: str, run_name: str,
    config: dict[str, Any],
) -> list[Tracker]:  # fmt: skip
    """The trackers `names` for the stage dir `directory` (made if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    external = {"wandb": WandbTracker, "mlflow": MlflowTracker}
    return [
        TensorBoardTracker(directory, start_step)
        if name == "tensorboard"
        else external[name](directory, project, run_name, config)
        for name in names
    ]


def stage_trackers(cfg: Any, directory: str | Path, stage: str) -> Callable[[int], list[Tracker]]:
    """What a stage's MetricsLogger opens on process 0: the config's `logging.backends` for
    `directory`, as the run `<config name>/<stage>` with the whole config as its parameters."""
    names, project = list(cfg.logging.backends), cfg.logging.project
    run_name, config = f"{cfg.name}/{stage}", cfg.model_dump(mode="json")
    return lambda start_step: open_trackers(
        names, directory, start_step=start_step, project=project, run_name=run_name, config=config
    )
