"""The toy find-the-key game (`envs/toy.py`) as a stage's task set: `env.tasks: toy`.

This is the smoke test a user runs on a new machine before anything expensive
(`jaxswe rl --config configs/toy-rl.yaml --run-dir D`): RL from a random init reaches >= 0.8
success in minutes on a CPU. The game runs with `require_look` and `show_answer` (winning means
looking, then repeating the action the observation spells out; a random policy almost never
wins), every episode draws its own key, and the model reads a word-level tokenizer in which each
action is one token, built into the stage dir.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.toy import ToyEnv
from jaxswe.config import RunConfig

TOY_TASKS = "toy"  # the env.tasks value


@dataclass(frozen=True)
class ToyTask:
    """A task record of the toy game (its id is all the stages need)."""

    instance_id: str


def is_toy(cfg: RunConfig) -> bool:
    return cfg.env.tasks == TOY_TASKS


def toy_tasks(cfg: RunConfig) -> list[ToyTask]:
    return [ToyTask(f"toy-{i}") for i in range(cfg.env.toy_tasks)]


def toy_env_factory(cfg: RunConfig):
    """(task id, episode seed) -> a fresh ToyEnv whose keys follow (run seed, task id, episode
    seed) only, so a resumed run replays the same games."""

    def make(task_id: str, seed: int | None = None) -> ToyEnv:
        env_seed = random.Random(f"{cfg.seed}/{task_id}/{seed}").getrandbits(63)
        values = cfg.env.toy_values
        env = ToyEnv(env_seed, values, max_format_errors=100, require_look=True, show_answer=True)
        env.task_id = task_id  # the episode's name in the agent loop's records and messages
        return env

    return make


def toy_tokenizer(num_values: int, out_dir: Path | None = None, *, single_token_actions: bool = False) -> Any:
    """A word-level ChatML tokenizer over the toy game's words (anything else is [UNK]).

    `submit 2` is two tokens and the observation `key 2` holds the same digit token, so
    answering with the key seen is a copy. With `single_token_actions`, each whole action
    (`look`, `submit 0`, `submit 1`, ...) is one token, so a policy sampling one token per turn
    always emits a well-formed action or an obvious error, and a random policy explores the game.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from jaxswe.tokenizer import CHATML_TEMPLATE, SPECIAL_TOKENS

    words = ["[UNK]", "look", "submit", "key", *(str(i) for i in range(num_values)), "correct", "wrong"]
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if single_token_actions:
        tok.add_tokens([f"submit {i}" for i in range(num_values)])
    tok.chat_template = CHATML_TEMPLATE
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def toy_policy(cfg: RunConfig, stage_dir: Path):
    """A random model of model.preset (+ model.overrides) over the toy tokenizer, which is written
    to `stage_dir/tokenizer` (by process 0); the vocabulary is exactly the tokenizer's."""
    import jax

    from jaxswe.distributed import barrier, is_main
    from jaxswe.model.config import get_preset
    from jaxswe.model.params import init_params
    from jaxswe.policy import Policy, model_knobs
    from jaxswe.run.layout import StageDir

    tokenizer_dir = StageDir(stage_dir).tokenizer
    tok = toy_tokenizer(cfg.env.toy_values, tokenizer_dir if is_main() else None, single_token_actions=True)
    barrier("toy tokenizer")  # written by process 0 alone; the others read it later
    knobs = {**model_knobs(cfg), "vocab_size": len(tok), **cfg.model.overrides}
    model_cfg = get_preset(cfg.model.preset or "tiny", **knobs)
    return Policy(model_cfg, init_params(model_cfg, jax.random.key(cfg.model.seed)), str(tokenizer_dir))
