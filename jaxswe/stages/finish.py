"""The end of every stage: the optional eval of its final weights, its plots and summary.json."""

from __future__ import annotations

from typing import Any

from jaxswe.distributed import barrier, is_main
from jaxswe.run.files import write_json
from jaxswe.run.layout import StageDir
from jaxswe.run.plots import plot_metrics
from jaxswe.stages.context import StageContext
from jaxswe.stages.evaluate import run_eval_stage


def finish_stage(ctx: StageContext, summary: dict[str, Any], params: Any | None = None) -> dict[str, Any]:
    """Optional eval of the final weights, plots, summary.json; closes the backend."""
    if ctx.cfg.eval.after_stage and summary.get("name") != "eval":
        ctx.backend.serve(params)
        report = run_eval_stage(ctx, name="final_eval")
        summary["pass_at_1"] = report["pass_at_1"]
        summary["pass_at_1_ci95"] = report["pass_at_1_ci95"]
        if ctx.heldout_ids:
            samples = ctx.cfg.eval.heldout_samples or ctx.cfg.eval.samples_per_task
            held = run_eval_stage(ctx, name="heldout_eval", ids=ctx.heldout_ids, samples=samples)
            summary["heldout_pass_at_1"] = held["pass_at_1"]
            summary["heldout_pass_at_1_ci95"] = held["pass_at_1_ci95"]
    files = StageDir(ctx.stage_dir)
    if is_main() and files.metrics.exists() and summary.get("name") != "eval":  # eval plots its bars itself
        plot_metrics(files.metrics, files.curves(summary["name"]), title=summary["name"])
    ctx.backend.close()
    write_json(files.summary, summary)
    if is_main():
        files.partial_summary.unlink(missing_ok=True)  # an interrupted attempt's
    barrier(f"{summary['name']} finished")  # process 0's plots and files are done before anyone exits
    return summary
