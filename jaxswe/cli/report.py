"""`jaxswe inspect`'s report: one self-contained HTML page of a run's stages (summary, curves, eval
tables) and decoded episodes, with outcome filters and a turn search.

`load_stage` reads a stage dir (and the records of the tasks it shows: their test strength and
surviving wrong fixes); everything else is a pure function from those records to HTML.
Every string from the run (model replies above all) goes through `html.escape`; the page loads
nothing: inline CSS and JS, curves as inline SVG.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from jaxswe.agent.commands import Command, UsageError, parse_action
from jaxswe.agent.trajectory import Trajectory, TrajectoryError, load_jsonl
from jaxswe.run.layout import StageDir
from jaxswe.run.metrics import read_rows
from jaxswe.run.plots import MAIN_CURVES

if TYPE_CHECKING:
    from envs.tasks.records import Task

OUTCOMES = ("resolved", "failed", "infra error", "tampered")
_PASSING = ("PASSED", "XFAIL")


@dataclass
class TrajectoryFile:
    """One trajectory file of a stage (an RL iteration, RFT's samples, an evaluation)."""

    name: str
    episodes: list[Trajectory] = field(default_factory=list)  # the ones shown
    total: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # over all `total` episodes
    error: str | None = None  # why the file could not be read


@dataclass
class Stage:
    name: str
    path: str
    summary: dict[str, Any] | None
    rows: list[dict[str, Any]]
    evals: dict[str, dict[str, Any]]  # eval.json / final_eval.json: name -> report
    files: list[TrajectoryFile]
    files_total: int = 0
    tasks: dict[str, Task] = field(default_factory=dict)  # records of the tasks shown (env.tasks)
    tasks_error: str | None = None  # why the task records could not be read


# ------------------------------------------------------------------------------------- reading
def outcome(traj: Trajectory) -> str:
    """One of OUTCOMES: an infrastructure failure first, then tampering (scored 0), then the reward."""
    if traj.is_infra_failure:
        return "infra error"
    if traj.tampered:
        return "tampered"
    return "resolved" if traj.resolved else "failed"


def pick_spread(n: int, limit: int) -> list[int]:
    """`limit` indices of range(n) spread evenly, first and last included (all when n <= limit)."""
    if n <= limit:
        return list(range(n))
    if limit == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def pick_episodes(trajs: list[Trajectory], limit: int) -> list[Trajectory]:
    """Up to `limit` episodes in file order, taken in turn from each outcome so rare ones are kept."""
    by_outcome: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        by_outcome.setdefault(outcome(t), []).append(i)
    queues = [list(reversed(v)) for v in by_outcome.values()]
    chosen: list[int] = []
    while len(chosen) < limit and any(queues):
        for q in queues:
            if q and len(chosen) < limit:
                chosen.append(q.pop())
    return [trajs[i] for i in sorted(chosen)]


def read_trajectory_file(path: Path, limit: int) -> TrajectoryFile:
    try:
        trajs = load_jsonl(path)
    except TrajectoryError as err:
        return TrajectoryFile(path.name, error=str(err))
    counts = {o: 0 for o in OUTCOMES}
    for t in trajs:
        counts[outcome(t)] += 1
    return TrajectoryFile(path.name, pick_episodes(trajs, limit), len(trajs), counts)


def read_json(path: Path) -> Any:
    """The file's JSON, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_task_records(stage_dir: Path, task_ids: set[str]) -> tuple[dict[str, Task], str | None]:
    """The records of `task_ids` from the task files the stage's config.yaml names (else its run
    dir's): env.tasks and env.eval_tasks; and why they could not be read (None when they could)."""
    from envs import load_tasks
    from envs.errors import EnvError

    config = None
    for path in (StageDir(stage_dir).config, StageDir(stage_dir.parent).config):
        try:
            config = yaml.safe_load(path.read_text())
            break
        except (OSError, yaml.YAMLError):
            continue
    env = config.get("env") if isinstance(config, dict) else None
    env = env if isinstance(env, dict) else {}
    sources = [s for s in (env.get("tasks"), env.get("eval_tasks")) if isinstance(s, str) and s != "toy"]
    found: dict[str, Task] = {}
    for source in dict.fromkeys(sources) if task_ids else ():
        try:
            found.update({t.instance_id: t for t in load_tasks(source) if t.instance_id in task_ids})
        except (OSError, EnvError) as err:
            return found, f"task records of {source} not read: {err}"
    return found, None


def load_stage(stage_dir: Path, *, episodes: int, files: int) -> Stage:
    """A stage dir's summary, metrics rows, eval reports, trajectory files (`files` of them spread
    over the run, `episodes` episodes each) and the records of the tasks they show."""
    stage_dir, stage = Path(stage_dir), StageDir(stage_dir)
    # summary.json when the stage finished, else an interrupted one's (jaxswe.stages.stage_io)
    summary = read_json(stage.summary) or read_json(stage.partial_summary)
    evals = {}
    for name in ("eval", "final_eval"):
        report = read_json(stage.eval_report(name))
        if isinstance(report, dict):
            evals[name] = report
    paths = sorted(stage.trajectories.glob("*.jsonl"))
    shown = [read_trajectory_file(paths[i], episodes) for i in pick_spread(len(paths), files)]
    task_ids = {t.task_id for f in shown for t in f.episodes}
    task_ids |= {t for r in evals.values() if isinstance(r.get("per_task"), dict) for t in r["per_task"]}
    tasks, tasks_error = read_task_records(stage_dir, task_ids)
    return Stage(
        name=(summary or {}).get("name") or stage_dir.name,
        path=str(stage_dir),
        summary=summary if isinstance(summary, dict) else None,
        rows=read_rows(stage.metrics),
        evals=evals,
        files=shown,
        files_total=len(paths),
        tasks=tasks,
        tasks_error=tasks_error,
    )


# ------------------------------------------------------------------------------------- pieces
def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({len(text) - limit} more characters not shown)"


def command_of(reply: str, format_error: bool) -> str:
    """The command a reply issued: its fenced block; the reply itself when the environment took it
    whole (no block, no format error: e.g. the toy game's one-word actions)."""
    action = parse_action(reply)
    if isinstance(action, Command):
        return action.raw.strip()
    if isinstance(action, UsageError):
        return f"{action.name} (usage error: {action.message})"
    if format_error:
        return f"(no command: format error, {action.kind})"
    return reply.strip()


def _versions(traj: Trajectory, start: int, end: int) -> list[int]:
    return sorted({v for v in traj.policy_versions[start:end] if v >= 0})


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return clip(json.dumps(value), 400)
    return str(value)


def svg_curve(key: str, points: list[tuple[float, float]], *, width: int = 270, height: int = 130) -> str:
    """One metric against step as an inline SVG line chart, labelled with its real range and last
    value (one point sits in the middle)."""
    pad_l, pad_r, pad_t, pad_b = 58, 8, 22, 20
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys), max(ys)
    span_x, span_y = (hi_x - lo_x) or 2.0, (hi_y - lo_y) or 2.0
    base_x = lo_x if hi_x > lo_x else lo_x - 1.0
    base_y = lo_y if hi_y > lo_y else lo_y - 1.0
    xy = [(pad_l + (x - base_x) / span_x * w, pad_t + h - (y - base_y) / span_y * h) for x, y in points]
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2"/>' for x, y in xy)
    y_labels = [(pad_t + 8, hi_y), (pad_t + h, lo_y)] if hi_y > lo_y else [(pad_t + h / 2 + 4, lo_y)]
    x_labels = [(pad_l, "start", f"{lo_x:g}")] if hi_x > lo_x else []
    x_labels.append((pad_l + w, "end", f"step {hi_x:g}"))
    axes = "".join(
        f'<text x="{pad_l - 4}" y="{y:.0f}" class="ax" text-anchor="end">{v:.3g}</text>' for y, v in y_labels
    )
    axes += "".join(
        f'<text x="{x}" y="{height - 6}" class="ax" text-anchor="{a}">{t}</text>' for x, a, t in x_labels
    )
    return (
        f'<svg class="curve" width="{width}" height="{height}" role="img" aria-label="{escape(key)}">'
        f'<text x="6" y="14" class="t">{escape(key)} <tspan class="v">last {ys[-1]:.4g}</tspan></text>'
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" class="frame"/>{axes}'
        f'<polyline points="{coords}" class="line"/><g class="dots">{dots}</g></svg>'
    )


def curves_html(rows: list[dict[str, Any]]) -> str:
    out = []
    for key in MAIN_CURVES:
        pts = [
            (float(r["step"]), float(r[key])) for r in rows if _number(r.get(key)) and _number(r.get("step"))
        ]
        if pts:
            out.append(svg_curve(key, pts))
    return f'<div class="curves">{"".join(out)}</div>' if out else ""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def table_html(pairs: list[tuple[str, Any]], cls: str = "kv") -> str:
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(_fmt(v))}</td></tr>" for k, v in pairs)
    return f'<table class="{cls}">{body}</table>'


def eval_html(name: str, report: dict[str, Any]) -> str:
    per_task = report.get("per_task") or {}
    if not isinstance(per_task, dict):
        return ""
    rows = "".join(
        f"<tr><td>{escape(str(task))}</td><td>{escape(str(r.get('successes', '')))}/"
        f"{escape(str(r.get('samples', '')))}</td><td>{escape(_fmt(r.get('rate', '')))}</td></tr>"
        for task, r in sorted(per_task.items())
        if isinstance(r, dict)
    )
    head = f"{name}.json: pass@1 {_fmt(report.get('pass_at_1', '?'))} over {len(per_task)} tasks"
    return (
        f'<details class="eval"><summary>{escape(head)}</summary><table class="grid">'
        f"<tr><th>task</th><th>resolved</th><th>rate</th></tr>{rows}</table></details>"
    )


def survivor_html(fix: dict[str, str], max_chars: int) -> str:
    """One surviving wrong fix, collapsed: what it changes and where, then its diff."""
    what = f"{fix.get('kind', '')}: {fix.get('change', '')} ({fix.get('where', '')})"
    diff = escape(clip(fix.get("patch", ""), max_chars))
    return f'<details class="patch"><summary>{escape(what)}</summary><pre>{diff}</pre></details>'


def strength_html(tasks: dict[str, Task], max_chars: int) -> str:
    """The test strength of the tasks shown and, collapsed, each surviving wrong fix's diff (a fix
    derived from gold that the task's tests accept; envs.grading.strength)."""
    if not tasks:
        return ""
    rows = []
    for task_id, task in sorted(tasks.items()):
        figure = "not measured" if task.strength is None else f"{task.strength:.2f}"
        fixes = "".join(survivor_html(s, max_chars) for s in task.survivors)
        rows.append(
            f"<tr><td>{escape(task_id)}</td><td>{figure}</td><td>{len(task.survivors)}{fixes}</td></tr>"
        )
    weak = [t for t, task in sorted(tasks.items()) if task.strength is not None and task.strength < 1.0]
    head = f"test strength of the {len(tasks)} tasks shown: {len(weak)} below 1.0"
    head += f" ({', '.join(weak)})" if weak else ""
    return (
        f'<details class="strength"><summary>{escape(head)}</summary><table class="grid"><tr><th>task</th>'
        f"<th>test strength</th><th>surviving wrong fixes</th></tr>{''.join(rows)}</table></details>"
    )


def tests_html(tests: dict[str, str], limit: int = 200) -> str:
    """Graded tests, the ones not passing first."""
    if not tests:
        return ""
    items = sorted(tests.items(), key=lambda kv: kv[1] in _PASSING)
    passing = sum(s in _PASSING for s in tests.values())
    rows = "".join(
        f'<tr class="{"pass" if s in _PASSING else "fail"}"><td>{escape(s)}</td><td>{escape(t)}</td></tr>'
        for t, s in items[:limit]
    )
    more = f"<p>{len(items) - limit} more tests not shown</p>" if len(items) > limit else ""
    return (
        f'<details class="tests"><summary>tests: {passing}/{len(tests)} passing</summary>'
        f'<table class="grid">{rows}</table>{more}</details>'
    )


def _block(label: str, text: str, cls: str, max_chars: int) -> str:
    return (
        f'<div class="{cls}"><span class="lbl">{label}</span><pre>{escape(clip(text, max_chars))}</pre></div>'
    )


def turn_html(traj: Trajectory, i: int, reply: str, observation: str | None, max_chars: int) -> str:
    turn = traj.turns[i] if i < len(traj.turns) else None
    bits = [f"turn {i + 1}"]
    if turn is not None:
        versions = _versions(traj, turn.start, turn.end)
        if versions:
            bits.append("policy v" + ",".join(map(str, versions)))
        bits.append(f"{turn.num_generated} tokens, {turn.finish_reason}")
        if turn.format_error:
            bits.append("format error")
    command = command_of(reply, bool(turn and turn.format_error))
    parts = [
        f'<div class="turn-head">{escape(" · ".join(bits))}</div>',
        _block("reply", reply, "reply", max_chars),
        _block("command", command, "command", max_chars),
    ]
    if observation is not None:
        parts.append(_block("observation", observation, "obs", max_chars))
    return f'<div class="turn">{"".join(parts)}</div>'


def episode_html(traj: Trajectory, max_chars: int) -> str:
    """One episode: a summary line, then its prompt, turns, tests, flags and patch."""
    kind = outcome(traj)
    msgs = traj.messages
    prompt = "\n\n".join(f"[{m.get('role', '')}]\n{m.get('content', '')}" for m in msgs[:2])
    rest = msgs[2:]
    replies: list[tuple[str, str | None]] = []
    for j, m in enumerate(rest):
        if m.get("role") == "assistant":
            nxt = rest[j + 1] if j + 1 < len(rest) and rest[j + 1].get("role") == "user" else None
            replies.append((m.get("content", ""), None if nxt is None else nxt.get("content", "")))
    versions = _versions(traj, 0, len(traj.policy_versions))
    reward = "none" if traj.reward is None else f"{traj.reward:g}"
    head = [
        f'<span class="badge {kind.replace(" ", "-")}">{escape(kind)}</span>',
        f'<span class="task">{escape(traj.task_id)}</span>',
        f"reward {escape(reward)}",
        f"{traj.num_turns} turns",
        f"ended by {escape(str(traj.ended_by))}",
    ]
    if versions:
        head.append("policy v" + escape(",".join(map(str, versions))))
    extra = list(traj.stage.items())
    flags = ""
    if traj.tamper:
        flags += f'<p class="flag">tamper flags: {escape("; ".join(traj.tamper))}</p>'
    if traj.flags:
        flags += f'<p class="flag">grading tripwires (reward unchanged): {escape("; ".join(traj.flags))}</p>'
    if traj.infra_error:
        flags += f'<p class="flag">infrastructure error: {escape(clip(traj.infra_error, max_chars))}</p>'
    turns = "".join(turn_html(traj, i, r, o, max_chars) for i, (r, o) in enumerate(replies))
    patch = ""
    if traj.patch:
        text = escape(clip(traj.patch, max_chars))
        patch = f'<details class="patch"><summary>patch</summary><pre>{text}</pre></details>'
    timings = [(k, f"{v:.2f}") for k, v in traj.timings.items() if _number(v)]
    meta = [*extra, ("resolved", traj.resolved), ("tokens sampled", traj.num_generated), *timings]
    info = (
        '<p class="meta">'
        + " · ".join(f"<b>{escape(str(k))}</b> {escape(_fmt(v))}" for k, v in meta)
        + "</p>"
    )
    return (
        f'<details class="ep" data-outcome="{escape(kind)}"><summary>{" · ".join(head)}</summary>'
        f'<div class="body">{flags}{info}<details class="prompt"><summary>prompt</summary>'
        f"<pre>{escape(clip(prompt, max_chars))}</pre></details>{turns}"
        f"{tests_html(traj.tests)}{patch}</div></details>"
    )


def file_html(stage: Stage, f: TrajectoryFile, max_chars: int) -> str:
    if f.error is not None:
        return (
            f'<section class="file"><h3>{escape(f.name)}</h3><p class="flag">{escape(f.error)}</p></section>'
        )
    counts = ", ".join(f"{n} {o}" for o, n in f.outcomes.items() if n)
    shown = len(f.episodes)
    note = f"all {f.total} episodes shown" if shown == f.total else f"{shown} of {f.total} episodes shown"
    if shown < f.total:
        left = {o: n for o, n in f.outcomes.items()}
        for t in f.episodes:
            left[outcome(t)] -= 1
        note += " (left out: " + ", ".join(f"{n} {o}" for o, n in left.items() if n) + ")"
    eps = "".join(episode_html(t, max_chars) for t in f.episodes)
    return (
        f'<section class="file"><h3>{escape(stage.name)} / {escape(f.name)}</h3>'
        f'<p class="counts">{escape(counts or "no episodes")}; {escape(note)}</p>{eps}</section>'
    )


def stage_html(stage: Stage, max_chars: int) -> str:
    summary = (
        table_html(list(stage.summary.items())) if stage.summary else "<p>no summary.json (not finished)</p>"
    )
    evals = "".join(eval_html(n, r) for n, r in stage.evals.items())
    if stage.tasks_error is not None:
        evals += f'<p class="flag">{escape(stage.tasks_error)}</p>'
    evals += strength_html(stage.tasks, max_chars)
    files_note = ""
    if len(stage.files) < stage.files_total:
        files_note = (
            f'<p class="counts">{len(stage.files)} of {stage.files_total} trajectory files shown '
            f"(spread from first to last)</p>"
        )
    files = "".join(file_html(stage, f, max_chars) for f in stage.files)
    return (
        f'<section class="stage"><h2>{escape(stage.name)} <small>{escape(stage.path)}</small></h2>'
        f"{summary}{curves_html(stage.rows)}{evals}{files_note}{files}</section>"
    )


def render_report(title: str, stages: list[Stage], run_summary: Any = None, *, max_chars: int = 20000) -> str:
    """The whole page: controls, the run's own summary, then each stage."""
    total = {o: sum(f.outcomes.get(o, 0) for s in stages for f in s.files) for o in OUTCOMES}
    boxes = "".join(
        f'<label><input type="checkbox" name="outcome" value="{o}" checked> {o} '
        f'<span class="n">({total[o]})</span></label>'
        for o in OUTCOMES
    )
    run = ""
    if run_summary is not None:
        run = (
            '<section class="stage"><h2>run summary</h2>'
            f"<pre>{escape(clip(json.dumps(run_summary, indent=2), max_chars))}</pre></section>"
        )
    body = "".join(stage_html(s, max_chars) for s in stages) or "<p>no stages found</p>"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><div class="controls">{boxes}'
        '<input id="q" type="search" placeholder="search turns (reply, command, observation)" size="40">'
        '<span id="status"></span></div></header>'
        f"<main>{run}{body}</main><script>{_JS}</script></body></html>"
    )


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;
color:#1d2330;background:#f6f7f9}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #d5d9e0;padding:8px 16px;z-index:2}
h1{font-size:18px;margin:0 0 6px}h2{font-size:17px;margin:0 0 8px}
h2 small{color:#667;font-weight:normal;font-size:12px}
h3{font-size:15px;margin:14px 0 4px}
.controls{display:flex;flex-wrap:wrap;gap:12px;align-items:center}.controls .n{color:#667}
#q{padding:4px 8px;border:1px solid #b8bfcb;border-radius:4px}#status{color:#445;font-size:13px}
main{padding:12px 16px;max-width:1200px}
.stage{background:#fff;border:1px solid #d5d9e0;border-radius:6px;padding:12px 14px;margin-bottom:14px}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
th,td{text-align:left;padding:2px 10px 2px 0;vertical-align:top}.kv th{color:#556;font-weight:600}
.grid td,.grid th{border-bottom:1px solid #eceef2}
.curves{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}
.curve{background:#fbfcfd;border:1px solid #e3e6eb;border-radius:4px}
.curve .t{font-size:12px;font-weight:600;fill:#1d2330}.curve .v{font-weight:normal;fill:#667}
.curve .ax{font-size:10px;fill:#667}.curve .frame{fill:none;stroke:#e3e6eb}
.curve .line{fill:none;stroke:#2f6fdb;stroke-width:1.5}.curve .dots{fill:#2f6fdb}
.counts{color:#445;margin:2px 0 6px}
details.ep{border:1px solid #e0e3e8;border-radius:4px;margin:4px 0;background:#fff}
details.ep>summary{padding:4px 8px;cursor:pointer}details.ep[open]>summary{background:#f0f3f7}
.ep .body{padding:6px 10px}.task{font-family:ui-monospace,Menlo,Consolas,monospace}
.badge{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;font-weight:600;color:#fff}
.badge.resolved{background:#1e8a4c}.badge.failed{background:#8a909c}
.badge.infra-error{background:#b26b00}.badge.tampered{background:#c0392b}
.turn{border-left:3px solid #c9d3e3;margin:8px 0;padding:2px 0 2px 10px}
.turn.hit{border-left-color:#e0a800;background:#fffbea}
.turn-head{font-size:12px;color:#556;font-weight:600}
.lbl{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:#778}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0 6px;padding:6px 8px;background:#f4f6f9;
border-radius:3px;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:420px;overflow:auto}
.command pre{background:#eef4ff}.obs pre{background:#f7f7f2}
.flag{color:#c0392b;font-weight:600}.meta{color:#556;font-size:12px;margin:2px 0 6px}.meta b{color:#334}
tr.pass td:first-child{color:#1e8a4c}tr.fail td:first-child{color:#c0392b;font-weight:600}
[hidden]{display:none!important}
"""

# Filters and search; state in the URL fragment (#q=TEXT&outcome=resolved,failed) so a link keeps it.
_JS = """
(function(){
  var eps=[].slice.call(document.querySelectorAll('details.ep'));
  var boxes=[].slice.call(document.querySelectorAll('input[name=outcome]'));
  var q=document.getElementById('q'), status=document.getElementById('status');
  function apply(){
    var want={}, text=q.value.trim().toLowerCase(), shown=0, hits=0;
    boxes.forEach(function(b){want[b.value]=b.checked;});
    eps.forEach(function(ep){
      var turns=[].slice.call(ep.querySelectorAll('.turn')), found=0;
      turns.forEach(function(t){
        var hit=text!=='' && t.textContent.toLowerCase().indexOf(text)>=0;
        t.classList.toggle('hit',hit); t.hidden=text!=='' && !hit; if(hit) found++;
      });
      var show=want[ep.dataset.outcome] && (text==='' || found>0);
      ep.hidden=!show; if(show){shown++; hits+=found;}
      if(text!=='' && found) ep.open=true;
    });
    eps.forEach(function(ep){
      var sec=ep.closest('section.file');
      if(sec) sec.hidden=!sec.querySelector('details.ep:not([hidden])') && !!sec.querySelector('details.ep');
    });
    status.textContent=shown+' of '+eps.length+' episodes shown'+(text?', '+hits+' turns match':'');
    var off=boxes.filter(function(b){return !b.checked;}).length;
    var frag=[];
    if(text) frag.push('q='+encodeURIComponent(q.value.trim()));
    var on=boxes.filter(function(b){return b.checked;}).map(function(b){return b.value;});
    if(off) frag.push('outcome='+encodeURIComponent(on.join(',')));
    var url=frag.length?'#'+frag.join('&'):location.pathname+location.search;
    if(history.replaceState) history.replaceState(null,'',url);
  }
  var params={};
  location.hash.replace(/^#/,'').split('&').forEach(function(kv){
    var i=kv.indexOf('='); if(i>0) params[kv.slice(0,i)]=decodeURIComponent(kv.slice(i+1));
  });
  if(params.q) q.value=params.q;
  if(params.outcome!==undefined){
    var on=params.outcome.split(',');
    boxes.forEach(function(b){b.checked=on.indexOf(b.value)>=0;});
  }
  boxes.forEach(function(b){b.addEventListener('change',apply);});
  q.addEventListener('input',apply);
  apply();
  document.body.setAttribute('data-ready','1');
})();
"""
