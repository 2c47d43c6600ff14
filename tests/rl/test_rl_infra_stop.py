"""An RL stage whose sandboxes keep failing stops with one error naming the cause, not after its
last iteration with a pass rate learned from almost nothing."""

from dataclasses import replace

import pytest
from rl_toy_helpers import toy_config, toy_context, toy_policy

from jaxswe.errors import UserError
from jaxswe.run.metrics import read_rows
from jaxswe.stages.rl import run_rl

NV = 2


@pytest.mark.slow
def test_rl_stops_after_iterations_in_a_row_of_infrastructure_failures(tmp_path):
    rl = {"iterations": 6, "infra_stop_iterations": 2, "problems_per_iteration": 4, "group_size": 2}
    cfg = toy_config(mesh={"devices": 1}, rl=rl)
    policy, tok = toy_policy(tmp_path, NV)
    ctx = toy_context(cfg, tmp_path / "rl", policy, tok, NV, num_tasks=4)
    make_env = ctx.make_env

    def failing(task_id: str, seed: int | None = None):  # 3 of the 4 tasks: no sandbox opens
        if task_id == "toy-0":
            return make_env(task_id, seed)
        raise OSError(f"[Errno 28] No space left on device: '/var/tmp/{task_id}'")

    ctx = replace(ctx, make_env=failing)
    with pytest.raises(UserError, match=r"in 2 RL iterations in a row .*No space left on device"):
        run_rl(ctx, resume=False)
    rows = read_rows(tmp_path / "rl" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # stopped at once, rows written, checkpoints kept
    assert all(r["infra_failures"] == 6 and r["episodes"] == 8 for r in rows)
    ctx.backend.close()
