"""Why RL does (not) move pass@1 in a demo run: the diagnosis table of a finished run dir.

Reads what the stages wrote (no rerun): each stage's after-stage evaluation (final_eval.json and
its decoded episodes), RL's metrics.jsonl and per-iteration trajectories. Prints
  1. pass@1 per stage and task, and each stage against the one before (paired, 95% intervals:
     over tasks, and on these tasks with episodes as the unit, as summary.json reports them);
  2. per RL iteration: training pass rate, kept groups (mixed outcomes), advantage spread, optimizer
     steps, clip fraction, approx KL to the sampling policy, entropy, submit ratio, seconds;
  3. which tasks ever succeed during RL (a task never solved gives no signal; one always solved,
     none either);
  4. what failing episodes do, per stage: format errors (no / several / unclosed fenced blocks),
     scaffold usage errors (e.g. a malformed `edit`), limits (context, turns), or a wrong patch;
  5. with --kl: KL(RL || RFT) per token on RL's evaluation episodes (loads both checkpoints).

    python bench/bench_demo_diagnosis.py runs/demo [--kl] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

STAGES = ("warmstart", "rft", "rl", "eval")


def _rows(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


def _eval_report(stage_dir: Path) -> dict | None:
    for name in ("final_eval.json", "eval.json"):
        if (stage_dir / name).is_file():
            return json.loads((stage_dir / name).read_text())
    return None


def _eval_episodes(stage_dir: Path) -> list[dict]:
    for name in ("final_eval.jsonl", "eval.jsonl"):
        if (stage_dir / "trajectories" / name).is_file():
            return _rows(stage_dir / "trajectories" / name)
    return []


def failure_kind(ep: dict) -> str:
    """What a failing episode did: the first thing that went wrong, else how it ended."""
    if ep.get("infra_error"):
        return "infra"
    turns = ep.get("turns", [])
    observations = [m["content"] for m in ep.get("messages", [])[2:] if m.get("role") == "user"]
    if any(t.get("format_error") for t in turns):
        return "format error"
    if any(o.lstrip().startswith("Error:") for o in observations):
        return "usage error"
    if ep.get("ended_by") in ("context", "max_turns"):
        return f"limit ({ep['ended_by']})"
    if not (ep.get("patch") or "").strip():
        return "empty patch"
    return "wrong patch"


def stage_table(run_dir: Path) -> tuple[list[str], dict]:
    from jaxswe.stages.eval_stats import fixed_task_difference, paired_difference

    lines, reports = [], {}
    for s in STAGES:
        rep = _eval_report(run_dir / s)
        if rep is not None:
            reports[s] = rep
    tasks = sorted({t for r in reports.values() for t in r["per_task"]})
    lines.append(
        "stage      pass@1  (95%)          "
        + "  ".join(t.replace("builtin__", "")[:12].rjust(12) for t in tasks)
    )
    for s, r in reports.items():
        lo, hi = r["pass_at_1_ci95"]
        cells = "  ".join(
            (
                f"{r['per_task'][t]['successes']}/{r['per_task'][t]['samples']}"
                if t in r["per_task"]
                else "-"
            ).rjust(12)
            for t in tasks
        )
        lines.append(f"{s:<9}  {r['pass_at_1']:.3f}  ({lo:.2f}-{hi:.2f})  {cells}")
    trained = [s for s in ("warmstart", "rft", "rl") if s in reports]
    paired = {}
    for a, b in zip(trained, trained[1:], strict=False):
        ra, rb = reports[a]["per_task"], reports[b]["per_task"]
        p = paired_difference({t: v["rate"] for t, v in ra.items()}, {t: v["rate"] for t, v in rb.items()})
        f = fixed_task_difference(
            {t: (v["successes"], v["samples"]) for t, v in ra.items()},
            {t: (v["successes"], v["samples"]) for t, v in rb.items()},
        )
        paired[f"{b}-{a}"] = {"over_tasks": p, "these_tasks": f}
        lines.append(
            f"{b} - {a}: {p['diff']:+.3f}; over {p['num_tasks']} tasks "
            f"{p['ci95'][0]:+.2f} to {p['ci95'][1]:+.2f}; "
            f"on these tasks ({f['num_episodes']} episodes) {f['ci95'][0]:+.2f} to {f['ci95'][1]:+.2f}"
            f"{'  SIGNIFICANT' if f['significant'] else ''}"
        )
    return lines, {"stages": {s: r["pass_at_1"] for s, r in reports.items()}, "paired": paired}


RL_COLS = (
    ("iter", "step", "{:>4}"),
    ("pass", "pass_rate", "{:5.2f}"),
    ("kept", None, "{:>5}"),
    ("adv_sd", "adv_std", "{:6.2f}"),
    ("steps", "optimizer_steps", "{:>5}"),
    ("clip", "clip_fraction", "{:6.3f}"),
    ("kl_old", "approx_kl", "{:7.4f}"),
    ("entropy", "entropy", "{:7.3f}"),
    ("submit", "submit_ratio", "{:6.2f}"),
    ("grad", "grad_norm", "{:5.2f}"),
    ("secs", "time_iteration_s", "{:5.0f}"),
)


def rl_table(run_dir: Path) -> tuple[list[str], dict]:
    rows = [r for r in _rows(run_dir / "rl" / "metrics.jsonl") if r.get("step", 0) > 0]
    if not rows:
        return ["(no RL metrics)"], {}
    lines = ["  ".join(f"{h:>{max(len(h), 4)}}" for h, _, _ in RL_COLS)]
    for r in rows:
        cells = []
        for h, key, fmt in RL_COLS:
            val = f"{r.get('groups_kept', 0)}/{r.get('groups_total', 0)}" if key is None else r.get(key)
            cells.append((fmt.format(val) if val is not None else "-").rjust(max(len(h), 4)))
        lines.append("  ".join(cells))
    kept = sum(r.get("groups_kept", 0) for r in rows)
    total = sum(r.get("groups_total", 0) for r in rows)
    # which tasks succeed during RL, from the episodes
    per_task: dict[str, list[int]] = {}
    for path in sorted((run_dir / "rl" / "trajectories").glob("iter_*.jsonl")):
        for ep in _rows(path):
            if ep.get("infra_error") is None:
                per_task.setdefault(ep["task_id"], []).append(int(ep.get("reward", 0) >= 1.0))
    ever = sorted(t for t, v in per_task.items() if any(v))
    always = sorted(t for t, v in per_task.items() if v and all(v))
    lines.append(
        f"kept groups {kept}/{total}; {len(ever)}/{len(per_task)} tasks ever solved in RL, "
        f"{len(always)} always; per task (solved/episodes): "
        + ", ".join(f"{t.replace('builtin__', '')} {sum(v)}/{len(v)}" for t, v in sorted(per_task.items()))
    )
    out = {
        "iterations": len(rows),
        "groups_kept": kept,
        "groups_total": total,
        "tasks_ever_solved": len(ever),
        "tasks_seen": len(per_task),
        "first_pass_rate": rows[0]["pass_rate"],
        "last_pass_rate": rows[-1]["pass_rate"],
        "entropy_first_last": [rows[0].get("entropy"), rows[-1].get("entropy")],
        "sum_approx_kl": sum(r.get("approx_kl") or 0 for r in rows),
        "mean_clip_fraction": sum(r.get("clip_fraction") or 0 for r in rows) / len(rows),
        "optimizer_steps": sum(r.get("optimizer_steps") or 0 for r in rows),
        "rl_seconds": sum(r.get("time_iteration_s") or 0 for r in rows),
    }
    return lines, out


def failure_table(run_dir: Path) -> tuple[list[str], dict]:
    lines, out = [], {}
    for s in STAGES:
        eps = _eval_episodes(run_dir / s)
        if not eps:
            continue
        fails = [e for e in eps if not (e.get("reward", 0) >= 1.0)]
        kinds = Counter(failure_kind(e) for e in fails)
        out[s] = dict(kinds)
        lines.append(
            f"{s:<9} {len(fails):>3}/{len(eps)} failed: "
            + ", ".join(f"{k} {v}" for k, v in kinds.most_common())
        )
    return lines, out


def kl_to_rft(run_dir: Path) -> tuple[list[str], dict]:
    """KL(RL || RFT) per assistant token, estimated on RL's own evaluation episodes (sampled from
    RL at temperature 1): mean of log p_rl - log p_rft over the sampled tokens."""
    import jax.numpy as jnp
    import numpy as np

    from jaxswe.config import load_config
    from jaxswe.model import token_logprobs
    from jaxswe.policy import load_policy

    cfg = load_config(run_dir / "rl" / "config.yaml", [])
    pols = {s: load_policy(run_dir / s, cfg) for s in ("rft", "rl")}
    eps, where = _eval_episodes(run_dir / "rl"), "RL's eval episodes"
    if not eps:  # a stopped RL stage: its last iteration's episodes (sampled one version earlier)
        last = sorted((run_dir / "rl" / "trajectories").glob("iter_*.jsonl"))[-1]
        eps, where = _rows(last), f"{last.name} (a stopped stage: the policy one iteration earlier)"
    diffs, ents = [], []
    for ep in eps:
        ids = jnp.asarray([ep["input_ids"]])
        mask = np.asarray(ep["loss_mask"]) > 0
        lp = {s: np.asarray(token_logprobs(p.params, p.model_cfg, ids))[0] for s, p in pols.items()}
        diffs.append((lp["rl"] - lp["rft"])[mask])
        ents.append(-lp["rl"][mask])
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    kl = float(d.mean()) if d.size else 0.0
    return [
        f"KL(RL || RFT) on {d.size} sampled tokens of {where}: {kl:.4f} nats/token; "
        f"RL surprisal {float(np.concatenate(ents).mean()) if ents else 0:.3f} nats/token"
    ], {"kl_rl_rft": kl}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--kl", action="store_true", help="also KL(RL || RFT) (loads both checkpoints)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    out = {"run_dir": str(args.run_dir)}
    parts = [("pass@1 by stage (after-stage evals)", stage_table), ("RL iterations", rl_table),
             ("failing eval episodes", failure_table)]  # fmt: skip
    if args.kl:
        parts.append(("distance from RFT", kl_to_rft))
    for title, fn in parts:
        lines, figures = fn(args.run_dir)
        out[fn.__name__] = figures
        print(f"== {title}")
        print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
