"""A policy (model config, weights, tokenizer dir) and `load_policy`, the one way to read one.

`load_policy(path)` takes whatever holds weights: a jaxswe stage dir (or its checkpoints/ dir)
restores its newest readable checkpoint; a Hugging Face dir (config.json + safetensors) and an
Orbax params dir (`jaxswe convert --to orbax`) load as they are. Stages start from it, `jaxswe
export` and `jaxswe serve` read through it, and the embedded engine's weight updates too.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
from jax import ShapeDtypeStruct
from jax.sharding import SingleDeviceSharding

from jaxswe.config import RunConfig
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.model.config import Qwen2Config
from jaxswe.model.hf_io import load_hf, read_hf_config
from jaxswe.model.orbax_io import PARAMS_DIR, load_params_orbax
from jaxswe.model.params import init_params
from jaxswe.run.checkpoint import Checkpoints, find_checkpoint_dir
from jaxswe.run.files import read_json, write_json
from jaxswe.run.layout import TOKENIZER_MAIN, StageDir
from jaxswe.train.state import abstract_params
from jaxswe.train.trainer import params_placement


@dataclass
class Policy:
    """A model as stages hand it on: its config (at the stage's context and RoPE), weights and
    tokenizer dir; what a stage starts from and what a stage checkpoint restores to."""

    model_cfg: Any
    params: Any  # None once handed over to a trainer
    tokenizer_dir: str

    def hand_over(self) -> Any:
        """The params, which this policy then no longer holds: a Trainer built from them keeps the
        only copy, instead of the starting weights staying alive beside the trainer's state."""
        params, self.params = self.params, None
        return params


def model_knobs(cfg: RunConfig) -> dict[str, Any]:
    """Runtime fields of Qwen2Config that come from the config's model and optimizer sections."""
    m = cfg.model
    return {
        "dtype": m.dtype,
        "param_dtype": m.param_dtype,
        "grad_reduce_dtype": cfg.optimizer.grad_reduce_dtype,
        "remat": m.remat,
        "attention": m.attention,
        "attention_block": m.attention_block,
        "logprob_chunk": m.logprob_chunk,
    }


def stage_model(model_cfg: Any, cfg: RunConfig) -> Any:
    """The starting model at this stage's context (`model.max_context`) and RoPE scaling
    (`model.rope_scaling`; unset keeps the checkpoint's): what the trainer, the embedded engine,
    the exported config.json and the SGLang launcher all use. A config turns YaRN on here."""
    return model_cfg.with_context(cfg.model.max_context, cfg.model.rope_scaling)


def context_warning(model_cfg: Qwen2Config, cfg: RunConfig) -> str | None:
    """One line when a length `cfg` uses (the stage model's context, an episode's, a packed row's)
    passes the positions the weights' RoPE covers: the checkpoint's max_position_embeddings, or
    with YaRN (`model.rope_scaling`, else the checkpoint's) its original context x factor."""
    yarn = model_cfg.with_context(model_cfg.max_position_embeddings, cfg.model.rope_scaling).rope_scaling
    native = yarn.original_max_position_embeddings if yarn else model_cfg.max_position_embeddings
    covered = int(native * yarn.factor) if yarn else native
    lengths = {
        "model.max_context": cfg.model.max_context,
        "agent.max_context_tokens": cfg.agent.max_context_tokens,
        "sft.seq_len": cfg.sft.seq_len,
        "rl.seq_len": cfg.rl.seq_len,
    }
    over = {k: v for k, v in lengths.items() if v > covered}
    if not over:
        return None
    rope = f"YaRN x{yarn.factor:g} over {native}" if yarn else "plain RoPE: no rope_scaling"
    factor = 2.0 ** math.ceil(math.log2(max(over.values()) / native))
    return (
        f"{', '.join(f'{k} {v}' for k, v in over.items())} past the {covered} positions the weights' "
        f"RoPE covers ({rope}); set model.rope_scaling, e.g. {{rope_type: yarn, factor: {factor:g}, "
        f"original_max_position_embeddings: {native}}}, or shorten them"
    )


def write_model_file(stage_dir: Path, policy: Policy) -> None:
    write_json(  # process 0 only, like every stage file
        StageDir(stage_dir).model,
        {"hf_config": policy.model_cfg.to_hf_dict(), "tokenizer": str(Path(policy.tokenizer_dir).absolute())},
    )


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer  # transformers is slow to import: only when used

    path = Path(path)
    if not any((path / name).is_file() for name in TOKENIZER_MAIN):
        raise UserError(f"{path}: no tokenizer found (tokenizer.json); set model.tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


def load_policy(path: str | Path, cfg: RunConfig | None = None, *, dtype: str = "float32") -> Policy:
    """The policy stored at `path` (see the module doc). With `cfg`: each array read straight into
    its shard of `cfg`'s trainer mesh, with `cfg`'s model knobs (compute dtype, master dtype,
    remat, attention) at `cfg`'s context and RoPE (`stage_model`), with a one-line warning on
    stderr when `cfg` runs past the positions the weights' RoPE covers (`context_warning`).
    Without: on one device, params and compute in `dtype` (read as such, not cast after),
    Qwen2Config's other defaults, at the context the weights were stored with (an Orbax params dir
    keeps its saved dtype). The tokenizer dir is the stage's, else `path` itself."""
    path = Path(path)
    knobs = model_knobs(cfg) if cfg else {"dtype": dtype, "param_dtype": dtype}

    def placement(model_cfg: Qwen2Config) -> Any:  # None: the loaders' default, the first device
        return params_placement(model_cfg, cfg.mesh) if cfg else None

    def policy(model_cfg: Qwen2Config, params: Any, tokenizer_dir: str | Path) -> Policy:
        if cfg is None:
            return Policy(model_cfg, params, str(tokenizer_dir))
        warning = context_warning(model_cfg, cfg)
        if warning and is_main():
            print(f"jaxswe: WARNING: {warning}", file=sys.stderr)
        return Policy(stage_model(model_cfg, cfg), params, str(tokenizer_dir))

    if (path / PARAMS_DIR).is_dir():
        model_cfg = read_hf_config(path, **knobs)
        return policy(model_cfg, load_params_orbax(path, model_cfg, placement(model_cfg)), path)
    if (path / "config.json").is_file():  # dtype: compute; param_dtype: masters
        return policy(*load_hf(path, shardings=placement, **knobs), path)
    ckpt_dir = find_checkpoint_dir(path)  # a stage dir or its checkpoints/, else one clear error
    model_file = StageDir(ckpt_dir.parent).model
    if not model_file.is_file():
        raise UserError(
            f"{ckpt_dir.parent}: no {model_file.name} next to the checkpoints; not a jaxswe stage dir"
        )
    meta = read_json(model_file)
    model_cfg = Qwen2Config.from_hf_dict(meta["hf_config"], **knobs)
    shapes = abstract_params(model_cfg)
    first = SingleDeviceSharding(jax.devices()[0])
    shardings = placement(model_cfg) or jax.tree.map(lambda _: first, shapes)
    abstract = jax.tree.map(lambda a, sh: ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), shapes, shardings)
    restored = Checkpoints(ckpt_dir, max_to_keep=None).restore_latest({"params": abstract})
    if restored is None:
        raise UserError(f"{ckpt_dir}: no readable checkpoint")
    return policy(model_cfg, restored[1]["params"], meta["tokenizer"])


def init_sharded(model_cfg: Any, seed: int, cfg: RunConfig) -> Any:
    """A random init of `model_cfg` created directly in the trainer's shardings."""
    init = jax.jit(
        lambda key: init_params(model_cfg, key), out_shardings=params_placement(model_cfg, cfg.mesh)
    )
    return init(jax.random.key(seed))
