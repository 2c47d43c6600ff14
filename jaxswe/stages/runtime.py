"""Building what a stage runs with from its config: policy weights, tokenizer, rollout backend,
task pool and environment factory. Every check that can fail on user input runs here, before any
work starts, and fails with one UserError naming what is wrong."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from jaxswe.config import RunConfig
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.run.checkpoint import Checkpoints, find_checkpoint_dir
from jaxswe.stages.rollouts import Backend, EmbeddedBackend, EnvFactory, HttpBackend
from jaxswe.stages.stage_io import read_json, write_json

MODEL_FILE = "model.json"  # in every stage dir: the model's HF config and its tokenizer dir


@dataclass
class Policy:
    """A model as stages hand it on: its config (at the stage's context and RoPE), weights and
    tokenizer dir; what a stage starts from and what a stage checkpoint restores to."""

    model_cfg: Any
    params: Any
    tokenizer_dir: str


def model_knobs(cfg: RunConfig) -> dict[str, Any]:
    """Runtime fields of Qwen2Config that come from the config's model section."""
    m = cfg.model
    return {
        "dtype": m.dtype,
        "param_dtype": m.param_dtype,
        "remat": m.remat,
        "attention": m.attention,
        "attention_block": m.attention_block,
        "logprob_chunk": m.logprob_chunk,
    }


def stage_model(model_cfg: Any, cfg: RunConfig) -> Any:
    """The starting model at this stage's context (`model.max_context`) and RoPE scaling
    (`model.rope_scaling`; unset keeps the checkpoint's): what the trainer, the embedded engine,
    the exported config.json and the SGLang launcher all use. Stage 2 turns YaRN on here."""
    return model_cfg.with_context(cfg.model.max_context, cfg.model.rope_scaling)


def write_model_file(stage_dir: Path, policy: Policy) -> None:
    write_json(  # process 0 only, like every stage file
        stage_dir / MODEL_FILE,
        {"hf_config": policy.model_cfg.to_hf_dict(), "tokenizer": str(Path(policy.tokenizer_dir).absolute())},
    )


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise UserError(f"{path}: no tokenizer found (tokenizer.json); set model.tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


def policy_from_checkpoint(cfg: RunConfig, source: str | Path) -> Policy:
    """Params of the newest readable checkpoint of a stage dir (or its checkpoints/)."""
    from jaxswe.model.config import Qwen2Config
    from jaxswe.stages.trainer import params_placement
    from jaxswe.train.state import abstract_params

    ckpt_dir = find_checkpoint_dir(source)
    model_file = ckpt_dir.parent / MODEL_FILE
    if not model_file.is_file():
        raise UserError(f"{ckpt_dir.parent}: no {MODEL_FILE} next to the checkpoints; not a jaxswe stage dir")
    meta = read_json(model_file)
    model_cfg = stage_model(Qwen2Config.from_hf_dict(meta["hf_config"], **model_knobs(cfg)), cfg)
    placement = params_placement(model_cfg, cfg.mesh)  # each array read straight into its shards
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params(model_cfg), placement
    )
    restored = Checkpoints(ckpt_dir, max_to_keep=None).restore_latest({"params": abstract})
    if restored is None:
        raise UserError(f"{ckpt_dir}: no readable checkpoint")
    _, items, _ = restored
    return Policy(model_cfg, items["params"], meta["tokenizer"])


def init_sharded(model_cfg: Any, seed: int, cfg: RunConfig) -> Any:
    """A random init of `model_cfg` created directly in the trainer's shardings."""
    from jaxswe.model.params import init_params
    from jaxswe.stages.trainer import params_placement

    init = jax.jit(
        lambda key: init_params(model_cfg, key), out_shardings=params_placement(model_cfg, cfg.mesh)
    )
    return init(jax.random.key(seed))


def resolve_policy(cfg: RunConfig, init_from: str | None = None) -> Policy:
    """The starting weights: a stage checkpoint (`init_from`), a Hugging Face dir (`model.path`),
    or a random init of `model.preset`."""
    init_from = init_from or cfg.init_from
    if init_from:
        return policy_from_checkpoint(cfg, init_from)
    m = cfg.model
    if m.path:
        from jaxswe.model.hf_io import load_hf
        from jaxswe.stages.trainer import params_placement

        path = Path(m.path)
        if not (path / "config.json").is_file():
            raise UserError(f"model.path {path}: not a Hugging Face model directory (no config.json)")
        tok = m.tokenizer or m.path
        load_tokenizer(tok)
        model_cfg, params = load_hf(  # dtype: compute; param_dtype: masters; read into their shards
            path, shardings=lambda c: params_placement(c, cfg.mesh), **model_knobs(cfg)
        )
        return Policy(stage_model(model_cfg, cfg), params, tok)
    if m.preset:
        from jaxswe.model.config import get_preset

        if not m.tokenizer:
            raise UserError("model.preset needs model.tokenizer (a tokenizer directory)")
        tokenizer = load_tokenizer(m.tokenizer)
        model_cfg = stage_model(get_preset(m.preset, **model_knobs(cfg), **m.overrides), cfg)
        if len(tokenizer) > model_cfg.vocab_size:
            model_cfg = model_cfg.replace(vocab_size=-(-len(tokenizer) // 64) * 64)
        return Policy(model_cfg, init_sharded(model_cfg, m.seed, cfg), m.tokenizer)
    raise UserError("no model: set model.path, model.preset or init_from")


def check_servers(cfg: RunConfig) -> None:
    """Fail now, with one message, when no configured rollout server answers /health."""
    from jaxswe.rollout.client import RolloutClient

    if not cfg.rollout.urls:
        raise UserError(
            f"rollout.engine {cfg.rollout.engine!r} needs rollout.urls "
            "(every worker, also those behind rollout.router)"
        )

    async def probe() -> None:
        client = RolloutClient(cfg.rollout.urls, timeout=10.0, max_retries=0)  # the workers, not the router
        try:
            await client.check_health()
        finally:
            await client.close()

    asyncio.run(probe())


def make_backend(cfg: RunConfig, policy: Policy, *, allow_biased: bool = False) -> Backend:
    """The rollout engine for this stage (embedded sampler, or HTTP servers already checked)."""
    r = cfg.rollout
    if r.engine == "embedded":
        from jaxswe.rollout.engine import EmbeddedEngine
        from jaxswe.rollout.sampler import Sampler
        from jaxswe.stages.rollouts import sampler_copy

        params = sampler_copy(policy.params)
        if not is_main():  # rollouts run on process 0
            return EmbeddedBackend(None, policy.model_cfg)
        # Batch and decode budget fixed at their maxima: the sampler compiles one shape per
        # prompt-length bucket instead of one per (batch size, prompt, budget) combination.
        sampler = Sampler(
            policy.model_cfg,
            params,
            max_context=cfg.agent.max_context_tokens,
            seed=r.seed,
            min_batch_bucket=r.max_batch,
            min_new_bucket=r.max_new_tokens,
        )
        return EmbeddedBackend(EmbeddedEngine(sampler, max_batch=r.max_batch), policy.model_cfg)
    from jaxswe.rollout.client import RolloutClient

    client = RolloutClient(
        r.urls,
        timeout=r.request_timeout_s,
        max_retries=r.max_retries,
        allow_biased_sampling=allow_biased or r.allow_biased_sampling,
        seed=r.seed,
        router=r.router,
    )
    return HttpBackend(
        client,
        policy.model_cfg,
        policy.tokenizer_dir,
        export_dtype=r.export_dtype,
        partial_rollouts=cfg.rl.max_staleness > 0,  # episodes in flight at every weight sync
    )


def load_pool(path: str) -> list[Any]:
    """Tasks of a task file (or "builtin"); an empty file is an error."""
    from envs import load_tasks

    tasks = load_tasks(path)
    if not tasks:
        raise UserError(f"task file {path}: holds no tasks")
    return tasks


def env_factory(cfg: RunConfig, tasks: list[Any]) -> EnvFactory:
    """(task id, episode seed) -> a fresh SWE environment (or toy game) for one episode."""
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.stages.toy import is_toy, toy_env_factory

    if is_toy(cfg):
        return toy_env_factory(cfg)

    by_id = {t.instance_id: t for t in tasks}
    return lambda task_id, seed=None: SWEEnv.from_config(by_id[task_id], cfg)  # a task is deterministic
