import json

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
