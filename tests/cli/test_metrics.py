import json
import struct
from pathlib import Path

import pytest
from helpers import ROOT

from jaxswe.cli import main
from jaxswe.run.metrics import MetricsLogger, read_rows, truncate_after
from jaxswe.run.plots import plot_metrics


def test_log_truncate_resume_and_plot(tmp_path):
    m = MetricsLogger(tmp_path)
    for step in range(4):
        m.log(step, {"reward_mean": step / 4, "pass_rate": 0.5, "note": "x"})
    m.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # torn write of a killed process
    assert [r["step"] for r in read_rows(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    # resume at step 2: rows 2.. are dropped, then re-logged once
    m = MetricsLogger(tmp_path, start_step=2)
    m.log(2, {"reward_mean": 0.9})
    m.close()
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["reward_mean"] == 0.9
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    drawn = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots" / "curves.png", title="t")
    assert drawn == ["reward_mean", "pass_rate"]
    assert (tmp_path / "plots" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert truncate_after(tmp_path / "metrics.jsonl", 0) == 2


def test_eval_plot_has_one_bar_per_task(tmp_path):
    from jaxswe.run.plots import plot_eval

    report = {
        "pass_at_1": 0.375,
        "pass_at_1_ci95": [0.2, 0.55],
        "num_episodes": 16,
        "per_task": {
            "b": {"samples": 8, "successes": 1, "rate": 0.125},
            "a": {"samples": 8, "successes": 5, "rate": 0.625},
        },
    }
    bars = plot_eval(report, tmp_path / "plots" / "eval.png", title="t")
    assert bars == [("a", 0.625), ("b", 0.125)]
    assert (tmp_path / "plots" / "eval.png").read_bytes()[:4] == b"\x89PNG"


def _wandb_history(run_dir) -> list[dict]:
    """The history rows of a W&B offline run, read from its .wandb file: a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks (crc 4 bytes, length 2, type 1: full 1, first 2,
    middle 3, last 4) carry the run's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    data, pos, part, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
    return rows


@pytest.mark.slow
def test_a_stage_logs_to_wandb_and_mlflow_and_refuses_what_cannot_open(
    toy_rl_run, tmp_path, monkeypatch, capsys
):
    """`logging.backends: [tensorboard, wandb, mlflow]`: a real `jaxswe rl` stage sends each
    iteration's scalars to TensorBoard, a W&B run (offline mode, read back from its file) and an
    MLflow run (a file store, read back through MLflow's client), the config as the runs'
    parameters; a tracker that cannot open is refused in one line before the stage starts."""
    import mlflow

    run_dir, uri = toy_rl_run
    stage = run_dir / "rl"  # RUN_DIR/<stage>
    assert list((stage / "tb").glob("events.out.tfevents.*"))
    rows = read_rows(stage / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    history = _wandb_history(stage)
    assert [(h["_step"], h["pass_rate"]) for h in history] == [(r["step"], r["pass_rate"]) for r in rows]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run((stage / "mlflow_run_id").read_text().strip())
    assert run.info.run_name == "toy-rl/rl" and run.data.params["rl.iterations"] == "2"
    logged = client.get_metric_history(run.info.run_id, "pass_rate")
    assert [(m.step, m.value) for m in logged] == [(r["step"], r["pass_rate"]) for r in rows]
    # MLflow with nowhere to log: one line, exit 2, nothing written
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(SystemExit) as exc:
        main(["rl", "--config", str(ROOT / "configs" / "toy-rl.yaml"), "--run-dir", str(tmp_path / "other"),
              "--set", "logging.backends=[tensorboard,wandb,mlflow]"])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "set MLFLOW_TRACKING_URI" in err, err
    assert not (tmp_path / "other").exists()


def test_backends_name_what_is_written(tmp_path):
    """`logging.backends: []`: metrics.jsonl alone, no TensorBoard events."""
    from jaxswe.config import config_from_dict
    from jaxswe.run.loggers import stage_trackers

    cfg = config_from_dict({"logging": {"backends": []}})
    m = MetricsLogger(tmp_path, trackers=stage_trackers(cfg, tmp_path, "rl"))
    m.log(1, {"pass_rate": 0.5})
    m.close()
    assert read_rows(tmp_path / "metrics.jsonl") == [{"step": 1, "pass_rate": 0.5}]
    assert not (tmp_path / "tb").exists()
