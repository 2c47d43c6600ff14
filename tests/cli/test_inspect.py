"""`jaxswe inspect`: the HTML report of a real run (toy RL through the CLI, plus real SWE episodes on
built-in tasks through SWEEnv and the agent loop), its escaping, and what a headless chromium renders."""

import asyncio
import contextlib
import io
import json
import re
import shutil
from html import escape
from pathlib import Path

import pytest
import yaml
from agent_helpers import ScriptRouter
from browser_helpers import assert_screenshot_not_blank, dump_dom, rendered_episodes

from envs import load_tasks
from jaxswe.agent.demos import command_reply, gold_patch_to_commands
from jaxswe.agent.loop import run_episodes
from jaxswe.agent.swe_env import SWEEnv
from jaxswe.agent.trajectory import Trajectory, load_jsonl, save_jsonl
from jaxswe.cli import main
from jaxswe.cli.report import curves_html, episode_html, outcome, pick_episodes, pick_spread, svg_curve
from jaxswe.rollout.types import SamplingParams
from jaxswe.tokenizer import build_tokenizer

NEEDLE = "needle-7f3a"
HOSTILE = "<script>document.body.setAttribute('data-pwned','1')</script> I will look."
HOSTILE_OBS = "<img src=x onerror=alert(1)>"
WEAK = "builtin__stack-1"  # its record stores a surviving wrong fix (envs.grading.strength)


def _inspect(*args: str) -> str:
    """`jaxswe inspect ARGS` in this process: what it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["inspect", *args])
    return out.getvalue()


def _swe_episodes():
    """Two graded episodes: the gold fix typed as commands (resolved), and a hostile reply whose
    command echoes markup and the search needle (failed) on a task whose tests accept a wrong fix."""
    builtin = load_tasks("builtin")
    tasks = [builtin[0], next(t for t in builtin if t.instance_id == WEAK)]
    tok = build_tokenizer([t.problem_statement for t in tasks] + [t.patch for t in tasks], 1000)
    submit = command_reply("submit", "Done.")
    gold = [command_reply(c, "Apply the fix.") for c in gold_patch_to_commands(tasks[0].patch)] + [submit]
    hostile = [command_reply(f"echo '{HOSTILE_OBS}' {NEEDLE}", HOSTILE), submit]
    scripts = {t.problem_statement.strip(): s for t, s in zip(tasks, [gold, hostile], strict=True)}
    engine = ScriptRouter(tok, scripts, version="3")
    envs = [SWEEnv(t, backend="local", window_lines=20, command_timeout_s=60) for t in tasks]
    sampling = SamplingParams(max_new_tokens=2048)
    return asyncio.run(
        run_episodes(envs, engine, tok, sampling=sampling, max_turns=12, max_context_tokens=16384)
    )


@pytest.fixture(scope="module")
def run(shared_dir, toy_rl_run):
    """(RUN_DIR, its SWE episodes, its report): RUN_DIR with two stages, rl (a copy of the session's
    2 iterations of the toy game through `jaxswe rl`) and eval (the SWE episodes, saved by the
    stages' own writer); then `jaxswe inspect RUN_DIR`. Built once, shared by the xdist workers."""
    from filelock import FileLock

    root = shared_dir / "inspect_run"
    with FileLock(shared_dir / "inspect_run.lock"):
        if not (root / "report.html").is_file():
            _build_run(root, toy_rl_run[0] / "rl")
    return root, load_jsonl(root / "eval" / "trajectories" / "eval.jsonl"), (root / "report.html").read_text()


def _build_run(root: Path, rl_stage: Path) -> None:
    shutil.copytree(rl_stage, root / "rl")
    config = yaml.safe_load((root / "rl" / "config.yaml").read_text())
    (root / "config.yaml").write_text(yaml.safe_dump({**config, "stages": ["rl", "eval"]}))  # as a pipeline's
    episodes = _swe_episodes()
    assert [t.resolved for t in episodes] == [True, False], [t.to_json() for t in episodes]
    save_jsonl(root / "eval" / "trajectories" / "eval.jsonl", episodes)
    eval_config = {**config, "env": {**config["env"], "tasks": "builtin"}}  # as an eval stage writes it
    (root / "eval" / "config.yaml").write_text(yaml.safe_dump(eval_config))
    assert _inspect(str(root)).strip() == str(root / "report.html")


@pytest.mark.slow
def test_report_holds_stages_curves_turns_tests_and_versions(run):
    root, episodes, html = run
    assert html.index("<h2>rl ") < html.index("<h2>eval ")
    assert html.count('<svg class="curve"') >= 8 and "pass_rate" in html
    gold = episodes[0]
    assert gold.tests and all(s == "PASSED" for s in gold.tests.values()), gold.tests
    for test_id in gold.tests:
        assert f"<td>PASSED</td><td>{test_id}</td>" in html
    assert f"tests: {len(gold.tests)}/{len(gold.tests)} passing" in html
    assert "policy v3" in html  # the engine's weight version on every sampled token
    assert "iter_0001.jsonl" in html and "iter_0002.jsonl" in html
    assert re.search(r"(\d+ resolved, )?\d+ failed; 24 of 64 episodes shown \(left out: \d+ failed\)", html)


def test_report_shows_the_surviving_wrong_fixes_of_the_tasks_it_shows(run):
    """The eval stage's tasks (its config's env.tasks): each one's test strength, and the diff of
    each wrong fix its tests accept, escaped and collapsed."""
    _, episodes, html = run
    (weak,) = [t for t in load_tasks("builtin") if t.instance_id == WEAK]
    assert weak.strength is not None and weak.strength < 1.0 and weak.survivors, weak
    assert f"test strength of the 2 tasks shown: 1 below 1.0 ({WEAK})" in html
    assert f"<tr><td>{WEAK}</td><td>{weak.strength:.2f}</td><td>{len(weak.survivors)}" in html
    for fix in weak.survivors:
        assert f"</summary><pre>{escape(fix['patch'])}</pre></details>" in html
    assert f"<tr><td>{episodes[0].task_id}</td><td>1.00</td><td>0</td></tr>" in html
    assert '<details class="patch" open' not in html


def test_unreadable_task_records_are_named_in_the_report(tmp_path):
    """A stage whose config names a task file that is gone: the report says so and shows the rest."""
    from jaxswe.cli.report import load_stage, stage_html

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"tasks": str(tmp_path / "gone.jsonl")}}))
    report = {"pass_at_1": 0.5, "per_task": {"a": {"samples": 2, "successes": 1}}}
    (tmp_path / "eval.json").write_text(json.dumps(report))
    stage = load_stage(tmp_path, episodes=1, files=1)
    assert stage.tasks == {} and stage.tasks_error is not None
    page = stage_html(stage, 100)
    assert f'<p class="flag">task records of {tmp_path / "gone.jsonl"} not read: task file ' in page
    assert "eval.json: pass@1 0.5 over 1 tasks" in page


def test_report_loads_nothing_and_escapes_the_run(run):
    _, _, html = run
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"@import|url\(", html)
    assert html.count("<script") == 1  # the report's own; the model's is text
    assert (
        "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)&lt;/script&gt;"
        in html
    )
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html


def test_stage_dir_bounded_report(run, tmp_path):
    root, _, _ = run
    target = tmp_path / "r.html"
    printed = _inspect(str(root / "rl"), "--out", str(target), "--episodes", "3", "--files", "1")
    assert printed.strip() == str(target)
    html = target.read_text()
    assert "1 of 2 trajectory files shown" in html and "iter_0002.jsonl" in html and "iter_0001" not in html
    counts = re.findall(r'<p class="counts">([^<]*)', html)
    assert re.fullmatch(
        r"(\d+ resolved, )?\d+ failed; 3 of 64 episodes shown \(left out: [^)]*\)", counts[1]
    ), counts
    assert html.count('<details class="ep"') == 3 and "run summary" not in html


def test_not_a_run_dir_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _inspect(str(tmp_path))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.strip().count("\n") == 0 and "no stage found" in err, err
    assert not (tmp_path / "report.html").exists()


def test_outcomes_and_bounds():
    infra = Trajectory(task_id="a", ended_by="error", infra_error="sandbox died")
    tampered = Trajectory(
        task_id="b", ended_by="submitted", reward=0.0, tamper=["forged result: <t1> FAILED"]
    )
    resolved = Trajectory(task_id="c", ended_by="submitted", reward=1.0, flags=["registers an exit hook"])
    failed = Trajectory(task_id="d", ended_by="max_turns", reward=0.0)
    assert [outcome(t) for t in (infra, tampered, resolved, failed)] == [
        "infra error",
        "tampered",
        "resolved",
        "failed",
    ]
    assert 'data-outcome="tampered"' in episode_html(tampered, 100)
    assert "tamper flags: forged result: &lt;t1&gt; FAILED" in episode_html(tampered, 100)
    assert "infrastructure error: sandbox died" in episode_html(infra, 100)
    assert "grading tripwires (reward unchanged): registers an exit hook" in episode_html(resolved, 100)
    many = [failed] * 20 + [resolved] + [failed] * 20 + [infra]
    kept = pick_episodes(many, 4)
    assert len(kept) == 4 and resolved in kept and infra in kept  # the rare outcomes survive the cap
    assert pick_spread(10, 4) == [0, 3, 6, 9] and pick_spread(3, 5) == [0, 1, 2] and pick_spread(5, 1) == [4]


def test_browser_runs_the_search_and_the_filters(run):
    root, _, _ = run
    dom = dump_dom(root / "report.html", f"q={NEEDLE}")
    assert 'data-ready="1"' in dom and 'data-pwned="' not in dom and dom.count("<script") == 1
    eps = rendered_episodes(dom)
    assert len(eps) > 20
    hits = [e for e in eps if NEEDLE in e]
    assert len(hits) == 1
    hit = hits[0]
    assert "hidden" not in hit.split(">", 1)[0] and " open" in hit.split(">", 1)[0]
    turns = re.findall(r'<div class="turn( hit)?"( hidden="")?>', hit)
    assert turns.count((" hit", "")) == 1 and turns.count(("", ' hidden=""')) == len(turns) - 1, turns
    assert all('hidden=""' in e.split(">", 1)[0] for e in eps if e is not hit)
    assert f"1 of {len(eps)} episodes shown, 1 turns match" in dom

    dom = dump_dom(root / "report.html", "outcome=resolved")
    eps = rendered_episodes(dom)
    visible = [e for e in eps if 'hidden=""' not in e.split(">", 1)[0]]
    assert visible and all('data-outcome="resolved"' in e.split(">", 1)[0] for e in visible)
    assert len(visible) < len(eps) and f"{len(visible)} of {len(eps)} episodes shown" in dom


def test_curves_are_labelled_with_the_real_range():
    one = svg_curve("loss", [(2.0, 0.5)])
    assert ">step 2<" in one and ">0.5<" in one and "step 3" not in one and "step 1" not in one
    two = svg_curve("<b>", [(1.0, 0.0), (4.0, 1.0)])
    assert ">1<" in two and ">step 4<" in two and "&lt;b&gt;" in two and "<b>" not in two
    assert curves_html([{"step": 1, "loss": float("nan")}, {"step": 2, "pass_rate": True}]) == ""


def test_an_interrupted_stage_shows_its_partial_summary(tmp_path):
    """A stage stopped by Ctrl-C has summary_partial.json, not summary.json: the report shows it."""
    from jaxswe.cli.report import load_stage
    from jaxswe.run.metrics import MetricsLogger
    from jaxswe.stages.stage_io import write_partial_summary

    metrics = MetricsLogger(tmp_path, start_step=1)
    for step in (1, 2):
        metrics.log(step, {"pass_rate": step / 4})
    metrics.close()
    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir()  # a save the interrupt cut short
    write_partial_summary("rl", tmp_path)
    stage = load_stage(tmp_path, episodes=1, files=1)
    assert stage.name == "rl" and stage.summary["interrupted"] is True, stage.summary
    assert stage.summary["steps_done"] == 2 and stage.summary["resume_from_checkpoint"] == 2
    assert stage.summary["last_metrics"]["pass_rate"] == 0.5


def test_browser_screenshot_is_not_blank(run, tmp_path):
    root, _, _ = run
    assert_screenshot_not_blank(root / "report.html", tmp_path / "report.png")
