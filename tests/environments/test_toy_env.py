"""The find-the-hidden-key toy environment (envs/toy.py)."""

from __future__ import annotations

import math
import random
import re

import pytest

from envs.base import ENDED_ERROR, ENDED_SUBMITTED, Environment
from envs.errors import EnvError
from envs.toy import ToyEnv, make_toy_envs


def seen_key(observation: str) -> int:
    match = re.fullmatch(r"key (\d+)", observation)
    assert match, observation
    return int(match[1])


def play_optimal(env: ToyEnv) -> tuple[float, int]:
    """Look, then submit what was seen; returns (reward, turns)."""
    env.reset()
    look = env.step("look")
    assert not look.done and not look.format_error
    end = env.step(f"submit {seen_key(look.observation)}")
    assert end.done and end.ended_by == ENDED_SUBMITTED and end.observation == "correct"
    return env.reward(), 2


def test_implements_the_environment_protocol():
    env = ToyEnv(seed=0)
    assert isinstance(env, Environment)
    assert env.system_prompt.isascii() and "key" in env.system_prompt
    first = env.reset()
    assert first.isascii() and "look" in first and "submit" in first


@pytest.mark.parametrize("num_values", [2, 8, 10])
def test_optimal_policy_always_wins(num_values: int):
    for env in make_toy_envs(50, seed=1, num_values=num_values):
        for _ in range(4):  # several episodes per environment
            assert play_optimal(env) == (1.0, 2)


def test_wrong_submission_gets_zero():
    env = ToyEnv(seed=3)
    for _ in range(20):
        env.reset()
        key = seen_key(env.step("look").observation)
        end = env.step(f"submit {(key + 1) % env.num_values}")
        assert end.done and end.ended_by == ENDED_SUBMITTED and end.observation == "wrong"
        assert not end.format_error
        assert env.reward() == 0.0


def test_blind_random_policy_wins_about_one_in_num_values():
    rng = random.Random(0)
    for num_values in (4, 8):
        episodes = 4000
        wins = 0
        for env in make_toy_envs(episodes, seed=7, num_values=num_values):
            env.reset()
            assert env.step(f"submit {rng.randrange(num_values)}").done
            wins += env.reward()
        p = 1 / num_values
        assert abs(wins / episodes - p) < 4 * math.sqrt(p * (1 - p) / episodes), (num_values, wins)


def test_keys_vary_per_episode_and_cover_all_values():
    env = ToyEnv(seed=11)
    keys = []
    for _ in range(400):
        env.reset()
        keys.append(seen_key(env.step("look").observation))
    assert set(keys) == set(range(8))
    assert max(keys.count(k) for k in range(8)) < 2 * 400 / 8


def test_same_seed_same_keys_and_factory_is_reproducible():
    def keys(env: ToyEnv, episodes: int = 5) -> list[int]:
        out = []
        for _ in range(episodes):
            env.reset()
            out.append(seen_key(env.step("look").observation))
        return out

    assert keys(ToyEnv(seed=5)) == keys(ToyEnv(seed=5))
    first = [keys(env) for env in make_toy_envs(6, seed=2)]
    again = [keys(env) for env in make_toy_envs(6, seed=2)]
    other = [keys(env) for env in make_toy_envs(6, seed=3)]
    assert first == again and first != other
    assert len({tuple(k) for k in first}) == 6  # the factory's environments differ


def test_looking_twice_and_whitespace_are_fine():
    env = ToyEnv(seed=4)
    env.reset()
    a = env.step("  look\n")
    b = env.step("look")
    assert a.observation == b.observation and not a.format_error
    assert env.step(f"\nsubmit {seen_key(a.observation)}  ").observation == "correct"
    assert env.reward() == 1.0


BAD_REPLIES = ["hello", "", "LOOK", "submit", "submit x", "submit 8", "look look", "submit -1"]


@pytest.mark.parametrize("bad", BAD_REPLIES)
def test_format_error_flagged_and_second_one_ends_episode(bad: str):
    env = ToyEnv(seed=9)
    env.reset()
    first = env.step(bad)
    assert first.format_error and not first.done and first.observation.startswith("error:")
    assert not env.step("look").format_error  # still playable after one bad reply
    second = env.step(bad)
    assert second.format_error and second.done and second.ended_by == ENDED_ERROR
    assert env.reward() == 0.0
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("look")


def test_reset_starts_a_fresh_episode():
    env = ToyEnv(seed=6, max_format_errors=1)
    env.reset()
    assert env.step("nonsense").done  # one error is enough with max_format_errors=1
    env.reset()
    assert play_optimal(env)[0] == 1.0
    env.reset()
    assert env.reward() == 0.0  # the previous episode's win does not carry over


def test_misuse_and_bad_arguments_raise_env_error():
    with pytest.raises(EnvError, match="before reset"):
        ToyEnv(seed=0).step("look")
    with pytest.raises(EnvError, match="num_values"):
        ToyEnv(seed=0, num_values=1)
    with pytest.raises(EnvError, match="max_format_errors"):
        ToyEnv(seed=0, max_format_errors=0)
    with pytest.raises(EnvError, match="n >= 0"):
        make_toy_envs(-1, seed=0)
    assert make_toy_envs(0, seed=0) == []


def test_require_look_makes_blind_submissions_format_errors():
    blind = ToyEnv(seed=8, num_values=2, max_format_errors=3, require_look=True)
    twin = ToyEnv(seed=8, num_values=2, require_look=True)  # same seed: same keys
    blind.reset()
    twin.reset()
    key = seen_key(twin.step("look").observation)
    first = blind.step(f"submit {key}")  # the right key, but blind
    assert first.format_error and not first.done and first.observation == "error: look first"
    assert blind.reward() == 0.0
    assert seen_key(blind.step("look").observation) == key  # still playable: look, then win
    end = blind.step(f"submit {key}")
    assert end.done and end.ended_by == ENDED_SUBMITTED and end.observation == "correct"
    assert blind.reward() == 1.0
    # a look in an earlier episode does not count; blind submits count toward max_format_errors
    blind.reset()
    assert blind.step("submit 0").format_error and blind.step("submit 1").format_error
    last = blind.step("submit 0")
    assert last.done and last.ended_by == ENDED_ERROR and blind.reward() == 0.0
    for seed in range(20):
        assert play_optimal(ToyEnv(seed, require_look=True)) == (1.0, 2)


def test_show_answer_spells_out_the_winning_action():
    plain, shown = ToyEnv(seed=2, num_values=5), ToyEnv(seed=2, num_values=5, show_answer=True)
    for _ in range(5):
        plain.reset()
        shown.reset()
        key = seen_key(plain.step("look").observation)
        observation = shown.step("look").observation
        assert observation == f"key {key} -> submit {key}"
        answer = observation.split(" -> ")[1]
        end = shown.step(answer)  # repeating the shown text wins
        assert end.done and end.observation == "correct" and shown.reward() == 1.0
