"""The one-line result a stage prints when it ends, and the paired stage-vs-stage comparison."""

import pytest

from jaxswe.stages.eval_stats import fixed_task_difference, paired_difference
from jaxswe.stages.stages import result_line


def test_result_line_names_pass_at_1_and_its_interval():
    line = result_line({"pass_at_1": 0.375, "pass_at_1_ci95": [0.2, 0.55], "num_episodes": 32})
    assert line == "pass@1 0.375 (95% interval 0.200-0.550, 32 episodes)"
    assert result_line({"final_pass_rate": 0.5}) == (
        "training-sample pass rate 0.500; not evaluated (eval.after_stage: false)"
    )


def test_paired_difference_over_shared_tasks():
    before = {"a": 0.25, "b": 0.5, "c": 0.0, "only_before": 1.0}
    after = {"a": 0.5, "b": 0.8, "c": 0.35}
    out = paired_difference(before, after)
    diffs = [0.25, 0.3, 0.35]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert out["num_tasks"] == 3 and out["diff"] == pytest.approx(mean)
    assert out["ci95"] == pytest.approx([mean - 4.303 * sd / 3**0.5, mean + 4.303 * sd / 3**0.5])  # t, 2 df
    assert out["significant"]
    assert not paired_difference({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 0.0})["significant"]


def test_t_quantiles():
    from jaxswe.stages.eval_stats import t975

    assert t975(3) == 3.182 and t975(11) == 2.228 and t975(1000) == 1.96


def test_fixed_task_difference_sums_smoothed_binomial_variances():
    before = {"a": (2, 8), "b": (0, 8), "only_before": (8, 8)}
    after = {"a": (6, 8), "b": (8, 8)}
    out = fixed_task_difference(before, after)
    assert out["diff"] == pytest.approx((0.5 + 1.0) / 2) and out["num_episodes"] == 32
    var = sum(p * (1 - p) / 10 for p in (3 / 10, 7 / 10, 1 / 10, 9 / 10))  # (c+1)/(n+2), 4 rates
    centre, half = ((7 / 10 - 3 / 10) + (9 / 10 - 1 / 10)) / 2, 1.96 * var**0.5 / 2
    assert out["ci95"] == pytest.approx([centre - half, centre + half]) and out["significant"]
    # the same gain on 2 samples per task is within noise; 0/n and n/n still carry variance
    assert not fixed_task_difference({"a": (0, 2)}, {"a": (2, 2)})["significant"]
    with pytest.raises(ValueError, match="no samples"):
        fixed_task_difference({"a": (0, 0)}, {"a": (0, 1)})
