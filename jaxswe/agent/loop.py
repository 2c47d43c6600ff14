"""The agent loop: an environment and a rollout engine, turn by turn, into a token-exact Trajectory.

Each turn the engine sees exactly the trajectory's ids so far and its sampled ids are appended as
they are. Environment calls (which block on subprocesses and containers) run in worker threads.
Limits end an episode as a kept failure ("max_turns", "context", reward 0); anything that breaks
outside the policy (sandbox, server, grading, or a Step with `info["infra_error"]`) ends it as
"error" with `infra_error` set, so RL can exclude it instead of scoring it 0. An environment that
ends an episode with ended_by "error" and no `infra_error` (e.g. too many format errors) blamed
the policy: the episode keeps its reward from `env.reward()`.

Seeds: `run_episodes` takes one seed per episode (or derives them from `sampling.sampling_seed`,
task id and which sample of the task it is) and `run_episode` gives each turn one from (the
episode's seed, turn number), so an episode's tokens do not depend on which episodes run beside it,
in which order, or how the engine batched them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from envs.base import Environment
from jaxswe.agent.trajectory import ChatFormat, Trajectory, Turn
from jaxswe.rollout.types import Engine, Generation, SamplingParams, derive_seed, policy_version

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _call(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    if executor is None:
        return await asyncio.to_thread(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))


def _check_generation(gen: Generation, max_new_tokens: int) -> None:
    if gen.finish_reason == "abort":
        raise RuntimeError(f"generation aborted after {len(gen.output_ids)} tokens")
    if len(gen.output_ids) != len(gen.logprobs):
        raise RuntimeError(f"engine returned {len(gen.output_ids)} ids but {len(gen.logprobs)} logprobs")
    if gen.weight_versions is not None and len(gen.weight_versions) != len(gen.output_ids):
        raise RuntimeError(
            f"engine returned {len(gen.output_ids)} ids but {len(gen.weight_versions)} versions"
        )
    if len(gen.output_ids) > max_new_tokens:
        raise RuntimeError(f"engine returned {len(gen.output_ids)} ids for max_new_tokens={max_new_tokens}")


def _turn_params(sampling: SamplingParams, end_of_turn_id: int, budget: int, turn: int) -> SamplingParams:
    stops = tuple(sampling.stop_token_ids)
    if end_of_turn_id not in stops:
        stops = (*stops, end_of_turn_id)
    seed = None if sampling.sampling_seed is None else derive_seed("turn", sampling.sampling_seed, turn)
    return replace(
        sampling,
        max_new_tokens=min(sampling.max_new_tokens, budget),
        stop_token_ids=stops,
        sampling_seed=seed,
    )


def episode_seeds(task_ids: Sequence[object], seed: int | None) -> list[int | None]:
    """One seed per episode from (`seed`, its task id, how many episodes of that task came before)."""
    if seed is None:
        return [None] * len(task_ids)
    seen: dict[object, int] = {}
    out = []
    for task in task_ids:
        k = seen[task] = seen.get(task, -1) + 1
        out.append(derive_seed("episode", seed, task, k))
    return out


async def run_episode(
    env: Environment,
    engine: Engine,
    tokenizer: Any,
    *,
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    chat: ChatFormat | None = None,
    executor: Executor | None = None,
) -> Trajectory:
    """Play one episode; never raises for environment or engine failures (see module doc)."""
    chat = chat or ChatFormat.from_tokenizer(tokenizer)
    traj = Trajectory(task_id=str(getattr(env, "task_id", None) or ""))
    timing = {"env_s": 0.0, "model_s": 0.0, "reward_s": 0.0}
    t_start = time.perf_counter()

    async def env_call(fn: Callable[..., T], *args: Any, key: str = "env_s") -> T:
        t0 = time.perf_counter()
        try:
            return await _call(executor, fn, *args)
        finally:
            timing[key] += time.perf_counter() - t0

    try:
        first_message = await env_call(env.reset)
        system = env.system_prompt
        traj.messages = [{"role": "system", "content": system}, {"role": "user", "content": first_message}]
        prompt = chat.prompt_ids(system, first_message)
        traj.append(prompt, trained=False)
        traj.prompt_len = len(prompt)
        trained_first = getattr(env, "trained_first_message", None)
        while traj.ended_by is None:
            budget = max_context_tokens - len(traj.input_ids) - 1  # keep room for a closing end-of-turn
            if budget < 1:
                traj.ended_by = "context"
                break
            params = _turn_params(sampling, chat.end_of_turn_id, budget, traj.num_turns)
            t0 = time.perf_counter()
            gen = await engine.generate(list(traj.input_ids), params)
            timing["model_s"] += time.perf_counter() - t0
            _check_generation(gen, params.max_new_tokens)

            start = len(traj.input_ids)
            versions = (
                None if gen.weight_versions is None else [policy_version(v) for v in gen.weight_versions]
            )
            traj.append(gen.output_ids, trained=True, logprobs=gen.logprobs, versions=versions)
            if not gen.output_ids or gen.output_ids[-1] != chat.end_of_turn_id:
                traj.append([chat.end_of_turn_id], trained=False)  # closes the turn; never sampled
            turn = Turn(
                start, len(traj.input_ids), finish_reason=gen.finish_reason, num_generated=len(gen.output_ids)
            )
            traj.turns.append(turn)
            action = chat.action_text(gen.output_ids)
            traj.messages.append({"role": "assistant", "content": action})
            if gen.finish_reason == "length" and params.max_new_tokens < sampling.max_new_tokens:
                traj.ended_by = "context"  # cut by the context budget, not the per-turn limit
                break

            step = await env_call(env.step, action)
            turn.format_error = step.format_error
            if step.done:
                traj.ended_by = step.ended_by or "submitted"
                traj.patch = step.info.get("patch")
                if step.info.get("infra_error"):  # the environment broke: excluded, not scored
                    traj.ended_by, traj.infra_error = "error", str(step.info["infra_error"])
                break
            if traj.num_turns >= max_turns:
                traj.ended_by = "max_turns"
                break
            obs_ids = chat.observation_ids(step.observation)
            if len(traj.input_ids) + len(obs_ids) >= max_context_tokens:
                traj.ended_by = "context"  # the observation would leave no room for another turn
                break
            traj.append(obs_ids, trained=False)
            traj.messages.append({"role": "user", "content": step.observation})

        if traj.infra_error is None and traj.ended_by in ("submitted", "error"):
            # the environment ended the episode (an "error" here is the policy's, e.g. too many
            # format errors): it scores it
            traj.reward = float(await env_call(env.reward, key="reward_s"))
            traj.tamper = list(getattr(env, "tamper", ()))
            traj.flags = list(getattr(env, "flags", ()))
            traj.tests = dict(getattr(env, "test_statuses", None) or {})
        elif traj.ended_by in ("max_turns", "context"):
            traj.reward = 0.0
        if trained_first is not None:  # sampled with a demonstration, trained without it
            traj.replace_prompt(chat.prompt_ids(system, trained_first))
            traj.messages[1]["content"] = trained_first
    except Exception as err:  # any failure outside the policy: keep the record, exclude it from RL
        log.warning("episode %s failed: %s", traj.task_id, err, exc_info=True)
        traj.ended_by, traj.reward = "error", None
        traj.infra_error = f"{type(err).__name__}: {err}"
    finally:
        try:
            await env_call(env.close)
        except Exception as err:
            log.warning("closing the environment of %s failed: %s", traj.task_id, err)
    timing["total_s"] = time.perf_counter() - t_start
    traj.timings = timing
    return traj


async def run_episodes(
    envs: Sequence[Environment],
    engine: Engine,
    tokenizer: Any,
    *,
    sampling: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    concurrency: int = 8,
    on_done: Callable[[int, Trajectory], None] | None = None,
    seeds: Sequence[int | None] | None = None,
) -> list[Trajectory]:
    """Run episodes with at most `concurrency` in flight; results come back in the order of `envs`.
    `seeds`: each episode's sampling seed (default: `episode_seeds` of the envs' task ids).

    Environment calls use a pool of 2 x `concurrency` threads (an episode in flight uses one; a
    cancelled one closes its environment in a second), so slow sandboxes never wait on a shared
    default pool.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    chat = ChatFormat.from_tokenizer(tokenizer)
    gate = asyncio.Semaphore(concurrency)
    if seeds is None:
        tasks = [getattr(env, "task_id", None) or f"#{i}" for i, env in enumerate(envs)]
        seeds = episode_seeds(tasks, sampling.sampling_seed)
    # two threads an episode: a cancelled episode's close never waits behind a command still running
    # (its own, which the close then kills, or another episode's)
    with ThreadPoolExecutor(max_workers=2 * concurrency, thread_name_prefix="jaxswe-env") as pool:

        async def one(i: int, env: Environment) -> Trajectory:
            async with gate:
                traj = await run_episode(
                    env,
                    engine,
                    tokenizer,
                    sampling=replace(sampling, sampling_seed=seeds[i]),
                    max_turns=max_turns,
                    max_context_tokens=max_context_tokens,
                    chat=chat,
                    executor=pool,
                )
            if on_done is not None:
                on_done(i, traj)
            return traj

        return list(await asyncio.gather(*(one(i, env) for i, env in enumerate(envs))))
