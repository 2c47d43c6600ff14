"""`jaxswe plan`: per-GPU memory, FLOPs and step time of a config's training stage, before launch."""

from __future__ import annotations

from pathlib import Path

from jaxswe.config import RunConfig
from jaxswe.errors import UserError
from jaxswe.losses import LossSettings
from jaxswe.model.config import PRESETS as MODEL_PRESETS
from jaxswe.model.config import ModelConfigError, Qwen2Config, get_preset
from jaxswe.model.hf_io import read_hf_config
from jaxswe.packing import batch_bytes_per_token, step_fields
from sharding import ShardingError
from sharding.mesh import resolve_axis_sizes
from sharding.planner import Plan, PlanInput, plan


class PlanError(UserError):
    """A config the planner cannot size (model shape unknown, mesh or batch that does not split)."""


def model_config_of(cfg: RunConfig) -> tuple[Qwen2Config, str]:
    """The model's shape: config.json under model.path if present, else model.preset (with
    model.overrides), else the preset whose name starts the path's last component (e.g.
    .../Qwen2.5-72B-Instruct)."""
    path = Path(cfg.model.path) if cfg.model.path else None
    if path is not None and (path / "config.json").is_file():
        return read_hf_config(path), str(path / "config.json")
    name = cfg.model.preset
    if name is None and path is not None:
        matches = [p for p in MODEL_PRESETS if path.name.lower().startswith(p)]
        name = max(matches, key=len) if matches else None
    if name is None:
        raise PlanError(f"model.path {cfg.model.path!r} has no config.json here and no model.preset is set")
    try:
        return get_preset(name, **cfg.model.overrides), f"preset {name}"
    except ModelConfigError as err:
        raise PlanError(str(err)) from None


def plan_input(cfg: RunConfig, stage: str | None = None) -> tuple[PlanInput, str]:
    """The PlanInput of a config's training stage (rl if present, else rft/warmstart; or `stage`)."""
    mc, source = model_config_of(cfg)
    stage = stage or ("rl" if "rl" in cfg.stages else "rft")
    if stage not in ("rl", "rft"):
        raise PlanError(f"stage {stage!r}: plan sizes a training stage, 'rl' or 'rft'")
    seq_len, rows = (
        (cfg.rl.seq_len, cfg.rl.trajectories_per_step)
        if stage == "rl"
        else (cfg.sft.seq_len, cfg.sft.batch_size)
    )
    m = cfg.mesh
    try:
        sizes = resolve_axis_sizes(m.axes, m.num_hosts * m.devices_per_host)
    except ShardingError as err:
        raise PlanError(str(err)) from None
    num_micro = cfg.optimizer.micro_batches
    if cfg.optimizer.micro_batch_rows is not None:  # token-budget batching: size the fullest step
        row_shards = sizes.get("data", 1) * sizes.get("fsdp", 1)
        num_micro = max(rows // (cfg.optimizer.micro_batch_rows * row_shards), 1)
    inp = PlanInput(
        model=mc.planner_shape(),
        mesh=sizes,
        seq_len=seq_len,
        rows=rows,
        num_micro=num_micro,
        remat=cfg.model.remat,
        param_dtype=cfg.model.param_dtype,
        compute_dtype=cfg.model.dtype,
        grad_reduce_dtype=cfg.optimizer.grad_reduce_dtype,
        rules=m.rules,
        attention_block=cfg.model.attention_block,
        logprob_chunk=cfg.model.logprob_chunk,
        batch_token_bytes=batch_bytes_per_token(
            step_fields("dapo", off_policy=LossSettings.from_rl(cfg.rl).off_policy)
            if stage == "rl"
            else step_fields("sft")
        ),
        device_memory_bytes=int(m.gpu_memory_gb * 1e9),
        headroom_fraction=m.memory_headroom,
        peak_flops=m.peak_tflops * 1e12,
        mfu=m.mfu,
    )
    return inp, f"{stage} stage, model from {source}"


def plan_config(cfg: RunConfig, stage: str | None = None) -> tuple[Plan, PlanInput, str]:
    inp, what = plan_input(cfg, stage)
    try:
        return plan(inp), inp, what
    except ShardingError as err:
        raise PlanError(str(err)) from None


def _gb(n: float) -> str:
    return f"{n / 1e9:8.2f} GB"


def render(p: Plan, inp: PlanInput, what: str) -> str:
    """The human table of a plan."""
    mesh = " x ".join(f"{k} {v}" for k, v in inp.mesh.items() if v > 1) or "1 device"
    lines = [
        f"{what}: {p.params_total / 1e9:.2f}B params on {p.devices} GPUs ({mesh})",
        f"step: {inp.rows} rows x {inp.seq_len} tokens, {inp.num_micro} micro-batches, "
        f"{p.tokens_per_device} tokens per GPU per micro-batch, remat {inp.remat}",
        "per GPU:",
    ]
    for k, v in p.per_device_bytes.items():
        if k == "total":
            continue
        note = f"  (largest: {p.largest_transient})" if k == "transient" else ""
        lines.append(f"  {k:<12}{_gb(v)}{note}")
    rc = p.recompute_bytes
    lines += [
        f"  {'total':<12}{_gb(p.per_device_bytes['total'])} of {_gb(p.usable_bytes).strip()} usable "
        f"({_gb(p.device_memory_bytes).strip()} minus {inp.headroom_fraction:.0%} headroom)",
        f"  {'recompute':<12}{_gb(rc['total'])}  (old log-probs: params + "
        f"{(rc['total'] - rc['params']) / 1e9:.2f} GB)",
        f"fits: {'yes' if p.fits else 'NO'} — {p.advice}",
        f"FLOPs per step: {p.model_flops:.3e} model, {p.hardware_flops:.3e} with recompute; "
        f"~{p.step_time_s:.0f} s per step at {p.mfu:.0%} MFU",
    ]
    return "\n".join(lines)


__all__ = ["PlanError", "model_config_of", "plan_config", "plan_input", "render"]
