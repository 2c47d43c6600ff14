"""The one run context every stage (warmstart, rft, rl, eval) runs with, and opening it:
stage dir, starting policy, tokenizer, tasks, environments, rollout backend."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from jaxswe.agent.episodes import EnvFactory
from jaxswe.config import RunConfig
from jaxswe.errors import UserError
from jaxswe.policy import Policy, load_tokenizer, write_model_file
from jaxswe.rollout.backends import Backend, run_phase
from jaxswe.rollout.types import SamplingParams
from jaxswe.run.layout import StageDir
from jaxswe.stages.runtime import check_servers, env_factory, load_pool, make_backend, resolve_policy
from jaxswe.stages.stage_io import prepare_stage_dir
from jaxswe.stages.toy import is_toy, toy_policy, toy_tasks


class StageBackend:
    """A stage's rollout backend: opened on first use, closed at the stage's end. Every copy of
    the stage's context shares it (`dataclasses.replace`)."""

    def __init__(self, cfg: RunConfig, policy: Policy | None, stage_dir: Path, opened: Backend | None = None):
        self._cfg, self._policy, self._stage_dir = cfg, policy, stage_dir
        self._backend = opened

    def serve(self, params: Any | None = None) -> Backend:
        """The backend, serving `params` (default: the starting policy, policy version 0;
        `params`, the stage's trained policy, is version 1). Opened after the trainer took the
        starting params over (`Policy.hand_over`), it needs `params`."""
        version = 0 if params is None else 1
        served = self._policy.params if params is None else params
        weights = StageDir(self._stage_dir).weights
        if self._backend is None:
            self._backend = make_backend(self._cfg, replace(self._policy, params=served))
            if self._cfg.rollout.engine != "embedded" or params is not None:
                run_phase(self._backend, self._backend.sync_weights(served, weights, version=version))
        elif params is not None:
            run_phase(self._backend, self._backend.sync_weights(params, weights, version=version))
        return self._backend

    @property
    def opened(self) -> Backend:
        """The open backend (`serve` opens it)."""
        if self._backend is None:
            raise RuntimeError("the stage's backend is not open: call serve() first")
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            asyncio.run(self._backend.close())
            self._backend = None


@dataclass(frozen=True)
class StageContext:
    """What a stage runs with: its inputs, fixed once the stage is open, and its rollout backend.
    The trainers stay in the stages that build them, so their optimizer state is freed before the
    final eval."""

    cfg: RunConfig
    stage_dir: Path
    policy: Policy  # the model the stage starts from (its params: the trainer's, once it is built)
    tokenizer: Any
    task_ids: list[str]  # the tasks it trains on (RL: after rl.task_filter)
    eval_ids: list[str]
    make_env: EnvFactory
    tasks: dict[str, Any] = field(default_factory=dict)  # every task it may run (train, eval, held-out)
    heldout_ids: list[str] = field(default_factory=list)  # eval.heldout: evaluated, never trained on
    init_from: str | None = None  # the stage or --init-from it starts from (None: cfg.init_from or new)
    backend: StageBackend = None  # type: ignore[assignment]  # None: a new one, opened on first use

    def __post_init__(self) -> None:
        if self.backend is None:
            object.__setattr__(self, "backend", StageBackend(self.cfg, self.policy, self.stage_dir))

    @property
    def sampling(self) -> SamplingParams:
        """The rollout section's sampling (RFT samples, RL rollouts; eval sets its temperature)."""
        r = self.cfg.rollout
        return SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            min_p=r.min_p,
            max_new_tokens=r.max_new_tokens,
        )


class StageInputs(NamedTuple):
    """A stage's tasks, checked: what it trains on, evaluates, and evaluates as held out."""

    tasks: list[Any]
    eval_tasks: list[Any]
    heldout: list[Any]


def check_settings(cfg: RunConfig) -> None:
    """Cross-section settings no single section can check."""
    if cfg.rl.turn_penalty_threshold >= cfg.agent.max_turns:
        raise UserError(
            f"rl.turn_penalty_threshold ({cfg.rl.turn_penalty_threshold}) must be below "
            f"agent.max_turns ({cfg.agent.max_turns})"
        )
    if cfg.rl.rows_per_step is not None and cfg.rl.rows_per_step % cfg.optimizer.micro_batches:
        raise UserError("rl.rows_per_step must be a multiple of optimizer.micro_batches")


def check_isolation(cfg: RunConfig) -> str:
    """How model commands are isolated, in words; refuses none unless the config allows it."""
    from envs.provision.backends import isolation

    words, isolated = isolation(cfg.env.backend)
    if not isolated and not cfg.env.allow_unisolated:
        raise UserError(
            f"{words}; install bubblewrap, use env.backend=docker, "
            "or pass --set env.allow_unisolated=true to accept unisolated model commands"
        )
    return words


def start_engine_pool(cfg: RunConfig) -> None:
    """Set up the pool of `env.docker_hosts`, say which engines answer; none answering is an error."""
    from jaxswe.agent.swe_env import engine_pool

    pool = engine_pool(cfg)
    up = pool.check()
    for e in pool.engines:
        state = "answers" if e.healthy else f"does NOT answer ({e.last_error[:200]})"
        print(f"jaxswe: Docker engine {e.name} (capacity {e.spec.capacity}) {state}", file=sys.stderr)
    if not up:
        raise UserError(
            "no Docker engine of env.docker_hosts answers: " + ", ".join(e.name for e in pool.engines)
        )


def start_sandboxes(cfg: RunConfig) -> None:
    """Say how model commands are isolated, and reap what dead predecessors left (sandbox
    directories, containers); once a stage's inputs are checked."""
    from envs.provision.backends import isolation, reap

    if is_toy(cfg):  # the toy game runs no commands
        return
    words = check_isolation(cfg)
    warning = "" if isolation(cfg.env.backend)[1] else "WARNING: "
    print(f"jaxswe: {warning}sandbox isolation: {words}", file=sys.stderr)
    from jaxswe.agent.swe_env import engine_pool

    engine_pool(cfg)  # env.docker_hosts: reap every engine of the pool
    removed = reap(cfg.env.backend)
    if removed:
        print(f"jaxswe: removed {len(removed)} sandboxes left by dead runs", file=sys.stderr)


def check_inputs(cfg: RunConfig) -> StageInputs:
    """Validate everything outside the model before work starts: settings, isolation, tasks
    (each task file read once), servers."""
    check_settings(cfg)
    if not is_toy(cfg):  # the toy game runs no commands
        check_isolation(cfg)
        if cfg.env.backend == "docker" and cfg.env.docker_hosts:
            start_engine_pool(cfg)
    pool = toy_tasks(cfg) if is_toy(cfg) else load_pool(cfg.env.tasks)
    eval_pool = load_pool(cfg.env.eval_tasks) if cfg.env.eval_tasks else pool
    tasks, eval_tasks = pool, eval_pool
    if cfg.task_subset:
        known = {t.instance_id for t in [*tasks, *eval_tasks]}
        missing = [t for t in cfg.task_subset if t not in known]
        if missing:
            raise UserError(f"task_subset: unknown instance ids {missing}")
        tasks = [t for t in tasks if t.instance_id in cfg.task_subset]
        eval_tasks = [t for t in eval_tasks if t.instance_id in cfg.task_subset]
    heldout = _heldout(cfg, eval_pool, tasks)
    if cfg.rollout.engine != "embedded":
        check_servers(cfg)
    return StageInputs(tasks, eval_tasks, heldout)


def _heldout(cfg: RunConfig, pool: list[Any], train_tasks: list[Any]) -> list[Any]:
    """The eval.heldout tasks of `pool` (env.eval_tasks, else env.tasks), checked: known ids,
    none of them a task the stages train on."""
    known = {t.instance_id: t for t in pool}
    missing = [t for t in cfg.eval.heldout if t not in known]
    if missing:
        raise UserError(f"eval.heldout: unknown instance ids {missing}")
    trained = sorted(set(cfg.eval.heldout) & {t.instance_id for t in train_tasks})
    if trained:
        raise UserError(
            f"eval.heldout: {trained} are training tasks (task_subset); held-out means never trained on"
        )
    return [known[t] for t in cfg.eval.heldout]


def open_stage(
    cfg: RunConfig,
    stage_dir: Path,
    *,
    init_from: str | None,
    policy: Policy | None = None,
    inputs: StageInputs | None = None,
) -> StageContext:
    """Check inputs (unless `inputs` holds what `check_inputs` returned for this stage), resolve
    the starting policy and write config.yaml + model.json."""
    tasks, eval_tasks, heldout = inputs or check_inputs(cfg)
    if policy is None and is_toy(cfg) and not (init_from or cfg.init_from or cfg.model.path):
        policy = toy_policy(cfg, stage_dir)  # random init over the toy tokenizer it writes
    policy = policy or resolve_policy(cfg, init_from)
    tokenizer = load_tokenizer(policy.tokenizer_dir)
    prepare_stage_dir(stage_dir, cfg)
    write_model_file(stage_dir, policy)
    start_sandboxes(cfg)
    by_id = {t.instance_id: t for t in [*tasks, *eval_tasks, *heldout]}
    eval_ids = [t.instance_id for t in eval_tasks][: cfg.eval.max_tasks]
    return StageContext(
        cfg=cfg,
        stage_dir=stage_dir,
        policy=policy,
        tokenizer=tokenizer,
        task_ids=[t.instance_id for t in tasks],
        eval_ids=eval_ids,
        make_env=env_factory(cfg, list(by_id.values())),
        tasks=by_id,
        heldout_ids=[t.instance_id for t in heldout],
        init_from=init_from,
    )
