"""Building what a stage runs with from its config: policy weights, tokenizer, rollout backend,
task pool and environment factory. Every check that can fail on user input runs here, before any
work starts, and fails with one UserError naming what is wrong."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from jaxswe.agent.episodes import EnvFactory
from jaxswe.config import RunConfig
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.policy import Policy, init_sharded, load_policy, load_tokenizer, model_knobs, stage_model
from jaxswe.rollout.backends import Backend, EmbeddedBackend, HttpBackend


def resolve_policy(cfg: RunConfig, init_from: str | None = None) -> Policy:
    """The starting weights: a stage checkpoint (`init_from`), a Hugging Face dir (`model.path`),
    or a random init of `model.preset`."""
    init_from = init_from or cfg.init_from
    if init_from:
        return load_policy(init_from, cfg)
    m = cfg.model
    if m.path:
        path = Path(m.path)
        if not (path / "config.json").is_file():
            raise UserError(f"model.path {path}: not a Hugging Face model directory (no config.json)")
        tok = m.tokenizer or m.path
        load_tokenizer(tok)
        return replace(load_policy(path, cfg), tokenizer_dir=tok)
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
        from jaxswe.rollout.backends import sampler_copy
        from jaxswe.rollout.engine import EmbeddedEngine
        from jaxswe.rollout.sampler import Sampler

        params = sampler_copy(policy.params)
        if not is_main():  # rollouts run on process 0
            return EmbeddedBackend(None, policy.model_cfg)
        # Batch and decode budget fixed at their maxima: the sampler compiles one shape per
        # prompt-length bucket instead of one per (batch size, prompt, budget) combination; with
        # rollout.deterministic_inference a batch holds one prompt bucket, so timing and load never
        # change a request's numbers (jaxswe.rollout.engine).
        sampler = Sampler(
            policy.model_cfg,
            params,
            max_context=cfg.agent.max_context_tokens,
            seed=r.seed,
            min_batch_bucket=r.max_batch,
            min_new_bucket=r.max_new_tokens,
        )
        engine = EmbeddedEngine(sampler, max_batch=r.max_batch, batch_invariant=r.deterministic_inference)
        return EmbeddedBackend(engine, policy.model_cfg)
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
