"""Config files: validation, overrides, and one-line errors naming the file and the key."""

import pytest
from helpers import ROOT

from jaxswe.config import ConfigError, RunConfig, apply_overrides, dump_config, load_config
from jaxswe.model.config import get_preset
from jaxswe.policy import context_warning

CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def _write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_follow_the_paper():
    cfg = RunConfig()
    assert (cfg.optimizer.b1, cfg.optimizer.b2, cfg.optimizer.eps) == (0.9, 0.999, 1e-8)
    assert cfg.optimizer.weight_decay == 0.1 and cfg.optimizer.grad_clip == 1.0
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k, cfg.rollout.min_p) == (
        1.0,
        1.0,
        -1,
        0.0,
    )
    assert cfg.rl.turn_penalty_threshold == 10 and cfg.rl.group_size == 10


def test_overrides_are_typed(tmp_path):
    path = _write(tmp_path, "optimizer:\n  lr: 1.0e-6\n")
    cfg = load_config(
        path, ["optimizer.lr=5e-6", "rl.eps_high=0.3", "env.backend=docker", "mesh.axes={fsdp: 8}"]
    )
    assert cfg.optimizer.lr == 5e-6 and cfg.rl.eps_high == 0.3
    assert cfg.env.backend == "docker" and cfg.mesh.axes == {"fsdp": 8}


@pytest.mark.parametrize(
    ("text", "overrides", "needle"),
    [
        ("optimizer:\n  lrr: 1\n", [], "optimizer.lrr: unknown key"),
        ("optimizer:\n  lr: fast\n", [], "optimizer.lr:"),
        ("rl:\n  group_size: 1\n", [], "rl.group_size:"),
        ("{}\n", ["rl.nope=3"], "rl.nope: unknown key"),
        ("{}\n", ["env.backend=podman"], "env.backend:"),
        ("optimizer:\n  schedule: cosine\n", [], "total_steps"),
        ("optimizer: [1\n", [], "invalid YAML"),
        ("- 1\n", [], "top level must be a mapping"),
        ("{}\n", ["noequals"], "expected section.key=value"),
    ],
)
def test_errors_are_one_line_naming_file_and_key(tmp_path, text, overrides, needle):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert needle in message and "\n" not in message
    assert f"--set {overrides[-1]}" in message if overrides else str(path) in message


@pytest.mark.parametrize(
    ("text", "overrides", "expect"),
    [
        (
            "rl:\n  eps_high: 0.28\n",
            ["rl.eps_hihg=0.3"],
            "--set rl.eps_hihg=0.3: rl.eps_hihg: unknown key (did you mean rl.eps_high?)",
        ),
        ("{}\n", ["rll.iterations=3"], "--set rll.iterations=3: rll: unknown key (did you mean rl?)"),
        (
            "{}\n",
            ["rl.iterations=many"],
            "--set rl.iterations=many: rl.iterations: Input should be a valid integer",
        ),
        (
            "optimizer:\n  wieght_decay: 1\n",
            ["rl.iterations=3"],
            "c.yaml: optimizer.wieght_decay: unknown key (did you mean optimizer.weight_decay?)",
        ),
        ("{}\n", ["rl.zzzz=1"], "--set rl.zzzz=1: rl.zzzz: unknown key"),
        (
            "rl:\n  iterations: 3\n",
            ["rl.iterations.x=1"],
            "--set rl.iterations.x=1: 'iterations' is not a section",
        ),
    ],
)
def test_errors_name_the_override_and_the_closest_key(tmp_path, text, overrides, expect):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    assert expect in str(info.value), str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_apply_overrides_does_not_mutate():
    base = {"rl": {"iterations": 3}}
    out = apply_overrides(base, ["rl.iterations=5", "model.dtype=float32"])
    assert (
        base == {"rl": {"iterations": 3}}
        and out["rl"]["iterations"] == 5
        and out["model"]["dtype"] == "float32"
    )


def test_dump_round_trips(tmp_path):
    cfg = load_config(_write(tmp_path, "name: x\nrl:\n  iterations: 7\n"))
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


def test_a_task_file_is_named_absolute_in_the_dumped_config(tmp_path, monkeypatch):
    """A relative env.tasks is resolved against the working dir the run starts in, so the run dir's
    config.yaml (read by --resume and `jaxswe inspect`) names the same file from any other dir."""
    (tmp_path / "c.yaml").write_text("env:\n  tasks: mine/tasks.jsonl\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("c.yaml", ["env.eval_tasks=builtin"])
    dump_config(cfg, tmp_path / "run.yaml")
    monkeypatch.chdir("/")
    assert load_config(tmp_path / "run.yaml").env.tasks == str(tmp_path / "mine" / "tasks.jsonl")
    assert cfg.env.eval_tasks == "builtin"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_shipped_config_validates(path):
    load_config(path)


QWEN = [p for p in CONFIGS if p.parent.name.startswith("qwen2.5-")]


def _as_published(preset):
    """Qwen2.5-7B/72B-Instruct as their config.json ships: native at 32,768, no rope_scaling."""
    return get_preset(preset, max_position_embeddings=32768, rope_scaling=None)


@pytest.mark.parametrize("path", QWEN, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_qwen_configs_cover_their_context_with_yarn(path):
    cfg = load_config(path)
    assert cfg.model.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    assert context_warning(_as_published(path.parent.name), cfg) is None


def test_a_context_past_the_weights_rope_is_named_in_one_line():
    rft, stage2 = QWEN[0].parent / "rft.yaml", QWEN[0].parent / "rl-stage2.yaml"
    published = _as_published(QWEN[0].parent.name)
    plain = load_config(rft, ["model.rope_scaling={rope_type: default}", "sft.seq_len=32768"])
    assert context_warning(published, plain) == (
        "model.max_context 65536, agent.max_context_tokens 65536, rl.seq_len 65536 past the 32768 "
        "positions the weights' RoPE covers (plain RoPE: no rope_scaling); set model.rope_scaling, e.g. "
        "{rope_type: yarn, factor: 2, original_max_position_embeddings: 32768}, or shorten them"
    )
    short = load_config(stage2, ["model.rope_scaling.factor=2.0"])
    assert "rl.seq_len 131072 past the 65536 positions the weights' RoPE covers (YaRN x2 over 32768)" in (
        context_warning(published, short)
    )
    # weights a 65K stage saved (max_position_embeddings 65536) cover a plain-RoPE 65K stage
    assert context_warning(published.replace(max_position_embeddings=65536), plain) is None
