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
     scaffold usage errors (e.g. a malformed `edit`), limits (context, turns), an empty patch
     (no edit, or a no-op one such as the warm start's decoys), or a wrong patch;
  5. where failing RL episodes leave their task's most frequent success: a slip (a token the policy
     gave < 5%) or a choice, and the commonest such points, decoded;
  6. with --paths: each stage's probability of RL's 3 most frequent successes per task, a
     noise-free skill measure (loads every stage's checkpoint);
  7. with --kl: KL(RL || RFT) per token on RL's evaluation episodes (loads both checkpoints).

    python bench/bench_demo_diagnosis.py runs/demo [--paths] [--kl] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
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
    from jaxswe.stages.stages import paired_comparisons

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
    paired = {}
    for p in paired_comparisons(run_dir, list(STAGES)):  # what summary.json reports
        f = p["these_tasks"]
        unit = (
            f"{f['num_episodes'] // 2} episode pairs"
            if f["method"] == "paired"
            else f"{f['num_episodes']} episodes"
        )
        paired[f"{p['after']}-{p['before']}"] = {"over_tasks": p, "these_tasks": f}
        lines.append(
            f"{p['after']} - {p['before']}: {p['diff']:+.3f}; over {p['num_tasks']} tasks "
            f"{p['ci95'][0]:+.2f} to {p['ci95'][1]:+.2f}; "
            f"on these tasks ({unit}) {f['ci95'][0]:+.2f} to {f['ci95'][1]:+.2f}"
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
    per_task = {t: [int(e.get("reward", 0) >= 1.0) for e in eps] for t, eps in _rl_episodes(run_dir).items()}
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


SLIP_LOGPROB = math.log(0.05)  # a divergence at a token the policy gave < 5% is a slip, else a choice


def _rl_episodes(run_dir: Path) -> dict[str, list[dict]]:
    by_task: dict[str, list[dict]] = {}
    for path in sorted((run_dir / "rl" / "trajectories").glob("iter_*.jsonl")):
        for ep in _rows(path):
            if ep.get("infra_error") is None:
                by_task.setdefault(ep["task_id"], []).append(ep)
    return by_task


def _success_paths(episodes: list[dict], top: int) -> list[tuple[int, ...]]:
    """The `top` most frequent token sequences of a task's successful episodes."""
    return [
        ids
        for ids, _ in Counter(tuple(e["input_ids"]) for e in episodes if e.get("reward", 0) >= 1).most_common(
            top
        )
    ]


def slip_table(run_dir: Path) -> tuple[list[str], dict]:
    """Where each failing RL episode leaves its task's most frequent success: the first token that
    differs, the probability the sampling policy gave it (rollout log-prob), and whether that was a
    slip (p < 5%: a rare token, a different one each time, which a policy gradient can only push
    down one at a time) or a choice (a real alternative, e.g. X against IX in a numeral table)."""
    from jaxswe.policy import load_tokenizer

    by_task = _rl_episodes(run_dir)
    if not by_task:
        return ["(no RL episodes)"], {}
    tok = load_tokenizer(json.loads((run_dir / "rl" / "model.json").read_text())["tokenizer"])
    lines, out = [], {}
    for task, eps in sorted(by_task.items()):
        paths = _success_paths(eps, 1)
        fails = [e for e in eps if not e.get("reward", 0) >= 1]
        if not paths or not fails:
            continue
        canon = paths[0]
        points: Counter = Counter()
        slips = choices = 0
        for e in fails:
            ids = e["input_ids"]
            i = next((i for i, (a, b) in enumerate(zip(ids, canon, strict=False)) if a != b), None)
            if i is None or not e["loss_mask"][i]:
                continue  # a prefix of the success, or a difference the environment made
            lp = e["rollout_logprobs"][i]
            slips, choices = slips + (lp < SLIP_LOGPROB), choices + (lp >= SLIP_LOGPROB)
            points[
                (
                    tok.decode(list(canon[max(0, i - 6) : i]))[-20:],
                    tok.decode([canon[i]]),
                    tok.decode([ids[i]]),
                )
            ] += 1
        name = task.replace("builtin__", "")
        out[name] = {
            "failures": len(fails),
            "slips": int(slips),
            "choices": int(choices),
            "distinct_points": len(points),
        }
        lines.append(f"{name}: {len(fails)} failures leave the success at {len(points)} distinct points; "
                     f"{slips} slips (p < 0.05), {choices} choices")  # fmt: skip
        for (ctx, want, got), n in points.most_common(3):
            lines.append(f"    {n:>3} x after {ctx!r}: {got!r} instead of {want!r}")
    return lines, out


def success_path_table(run_dir: Path) -> tuple[list[str], dict]:
    """A noise-free measure of each stage's skill on the training tasks: the probability each stage's
    policy gives to the 3 most frequent successful episodes of RL (their sampled tokens; the
    environment's are given), summed per task. Evals at 16-48 samples a task cannot see moves of a
    few points; this can. Loads every stage's checkpoint."""
    import jax.numpy as jnp
    import numpy as np

    from jaxswe.model import token_logprobs
    from jaxswe.policy import load_policy

    by_task = _rl_episodes(run_dir)
    paths = {t: _success_paths(eps, 3) for t, eps in sorted(by_task.items())}
    masks = {
        ids: ep["loss_mask"] for eps in by_task.values() for ep in eps for ids in [tuple(ep["input_ids"])]
    }
    stages = [s for s in ("warmstart", "rft", "rl") if (run_dir / s).is_dir()]
    lines = ["stage      mean   " + "  ".join(t.replace("builtin__", "")[:12].rjust(12) for t in paths)]
    out = {}
    for s in stages:
        pol = load_policy(run_dir / s)
        mass = {}
        for t, ids_list in paths.items():
            total = 0.0
            for ids in ids_list:
                lp = np.asarray(token_logprobs(pol.params, pol.model_cfg, jnp.asarray([ids], jnp.int32)))[0]
                total += float(np.exp(lp[np.asarray(masks[ids]) > 0].sum()))
            mass[t] = total
        out[s] = mass
        mean = sum(mass.values()) / max(len(mass), 1)
        lines.append(f"{s:<9}  {mean:.3f}  " + "  ".join(f"{v:12.3f}" for v in mass.values()))
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
    ap.add_argument(
        "--paths",
        action="store_true",
        help="also each stage's probability of RL's successes (loads checkpoints)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    out = {"run_dir": str(args.run_dir)}
    parts = [("pass@1 by stage (after-stage evals)", stage_table), ("RL iterations", rl_table),
             ("failing eval episodes", failure_table),
             ("where failing RL episodes leave the most frequent success", slip_table)]  # fmt: skip
    if args.paths:
        parts.append(("probability of RL's 3 most frequent successes per task, by stage", success_path_table))
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
