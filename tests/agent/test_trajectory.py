"""Token-exact trajectories: what the engine saw at every turn, masks, limits, failures, JSONL."""

import asyncio
import math
import random

import numpy as np
import pytest

from envs.base import Step
from envs.toy import ToyEnv
from jaxswe.agent.commands import FormatError, parse_action
from jaxswe.agent.loop import run_episode, run_episodes
from jaxswe.agent.trajectory import ChatFormat, Trajectory, TrajectoryError, Turn, load_jsonl, save_jsonl
from jaxswe.rollout.types import Generation, SamplingParams
from jaxswe.tokenizer import build_tokenizer

CORPUS = [
    "Let me look at the code.\n```\nopen src/app.py 10\n```\n",
    "(Current directory: /repo, current file: n/a) bash-$\n",
    "def f(x):\n    return x * 2  # comment\n",
] * 30


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, 500)


class RecordingEngine:
    """Test double for the model: replies from a script, records every input it was given."""

    def __init__(self, tok, replies, *, length_cut=()):
        self.tok, self.replies, self.length_cut = tok, list(replies), set(length_cut)
        self.inputs, self.outputs, self.params = [], [], []
        self.eot = tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, input_ids, params):
        turn = len(self.inputs)
        self.inputs.append(list(input_ids))
        self.params.append(params)
        ids = self.tok.encode(self.replies[turn], add_special_tokens=False)
        if turn in self.length_cut:
            ids, reason = ids[: params.max_new_tokens], "length"
        else:
            ids, reason = ids[: params.max_new_tokens - 1] + [self.eot], "stop"
        logprobs = [-0.01 * (turn + 1) - 0.001 * i for i in range(len(ids))]
        self.outputs.append(ids)
        return Generation(ids, logprobs, reason)


class UniformEngine:
    """Test double for the model: uniform random tokens over the whole vocabulary."""

    def __init__(self, vocab_size, eot, seed=0):
        self.vocab_size, self.eot, self.rng = vocab_size, eot, random.Random(seed)
        self.inputs = []

    async def generate(self, input_ids, params):
        self.inputs.append(list(input_ids))
        ids = []
        while len(ids) < params.max_new_tokens:
            ids.append(self.rng.randrange(self.vocab_size))
            if ids[-1] in params.stop_token_ids:
                break
        reason = "stop" if ids[-1] in params.stop_token_ids else "length"
        return Generation(ids, [-math.log(self.vocab_size)] * len(ids), reason)


class EchoEnv:
    """Test double for an environment: flags format errors, ends on `submit`, echoes commands."""

    system_prompt = "You fix bugs. One command per reply."
    task_id = "echo-1"

    def __init__(self, fail_at=None, tag=0):
        self.fail_at, self.tag, self.steps, self.closed, self.submitted = fail_at, tag, [], 0, False

    def reset(self):
        return f"Issue {self.tag}: f(2) should be 4.\n(Current directory: /repo, current file: n/a) bash-$"

    def step(self, action_text):
        self.steps.append(action_text)
        if self.fail_at == len(self.steps):
            raise OSError("sandbox died")
        action = parse_action(action_text)
        if isinstance(action, FormatError):
            return Step(f"format error: {action.kind}", format_error=True)
        if action.name == "submit":
            self.submitted = True
            return Step("", done=True, ended_by="submitted", info={"patch": "diff"})
        return Step(f"ran {action.raw!r} → ok ✓\n  indented\n(Current directory: /repo) bash-$")

    def reward(self):
        return 1.0 if self.submitted else 0.0

    def close(self):
        self.closed += 1


REPLIES = [
    "I will open the file.\n```\nopen src/app.py\n```",
    "Two blocks by mistake.\n```\nls\n```\n```\npwd\n```",
    "Fix it.\n```\nedit 2:2\n    return x * 2\n```",
    "Done.\n```\nsubmit\n```",
]
SAMPLING = SamplingParams(max_new_tokens=200)


def play(tok, env, engine, **kw):
    kw = {"max_turns": 10, "max_context_tokens": 4096, **kw}
    return asyncio.run(run_episode(env, engine, tok, sampling=SAMPLING, **kw))


def test_chat_format_pieces_match_the_template(tok):
    chat = ChatFormat.from_tokenizer(tok)
    assert chat.user_prefix == "\n<|im_start|>user\n"
    assert chat.user_suffix == "<|im_end|>\n<|im_start|>assistant\n"
    assert chat.end_of_turn_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_end_of_turn_comes_from_the_template_not_eos(tok):
    base_like = build_tokenizer(CORPUS, 500)
    base_like.eos_token = "<|endoftext|>"  # as in Qwen base models; turns still end in <|im_end|>
    chat = ChatFormat.from_tokenizer(base_like)
    assert chat.end_of_turn == "<|im_end|>" and chat.user_prefix == "\n<|im_start|>user\n"
    base_like.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(TrajectoryError, match="no special token ends"):
        ChatFormat.from_tokenizer(base_like)


def test_engine_saw_exactly_the_trajectory_tokens(tok):
    env, engine = EchoEnv(), RecordingEngine(tok, REPLIES)
    traj = play(tok, env, engine)
    traj.check()
    assert (traj.ended_by, traj.reward, traj.num_turns, traj.patch) == ("submitted", 1.0, 4, "diff")
    assert env.closed == 1 and env.steps == [r for r in REPLIES]
    ids = traj.input_ids
    for k, (seen, out) in enumerate(zip(engine.inputs, engine.outputs, strict=True)):
        assert ids[: len(seen)] == seen  # every turn's input is a prefix of the trajectory
        start, end = traj.turns[k].start, traj.turns[k].end
        assert start == len(seen) and ids[start:end] == out  # sampled ids appended as they are
        assert traj.rollout_logprobs[start:end] == pytest.approx(
            [-0.01 * (k + 1) - 0.001 * i for i in range(len(out))]
        )
    assert engine.inputs[-1] + engine.outputs[-1] == ids
    # the loss mask is exactly the assistant-generated tokens
    mask = np.asarray(traj.loss_mask)
    expected = np.zeros(len(ids), dtype=int)
    for t in traj.turns:
        expected[t.start : t.end] = 1
    np.testing.assert_array_equal(mask, expected)
    assert mask.sum() == sum(len(o) for o in engine.outputs)
    # every engine call asked for unbiased sampling with <|im_end|> as a stop token
    assert all(p.unbiased for p in engine.params)
    assert all(tok.convert_tokens_to_ids("<|im_end|>") in p.stop_token_ids for p in engine.params)


def test_text_equals_the_template_rendering_of_the_conversation(tok):
    traj = play(tok, EchoEnv(), RecordingEngine(tok, REPLIES))
    rendered = tok.apply_chat_template(traj.messages, tokenize=False, add_generation_prompt=False)
    assert tok.decode(traj.input_ids, skip_special_tokens=False) == rendered.removesuffix("\n")
    assert [m["role"] for m in traj.messages] == ["system", "user"] + ["assistant", "user"] * 3 + [
        "assistant"
    ]


def test_format_error_turns_are_flagged_and_masked_for_rft(tok):
    traj = play(tok, EchoEnv(), RecordingEngine(tok, REPLIES))
    assert traj.format_errors == [False, True, False, False]
    rft = traj.rft_loss_mask()
    s, e = traj.turn_spans[1]
    assert rft[s:e].sum() == 0 and np.asarray(traj.loss_mask)[s:e].sum() == e - s
    assert rft.sum() == np.asarray(traj.loss_mask).sum() - (e - s)
    assert "format error: multiple_commands" in traj.messages[5]["content"]


def test_length_stop_appends_an_untrained_end_of_turn(tok):
    engine = RecordingEngine(tok, REPLIES, length_cut={0})
    traj = play(tok, EchoEnv(), engine)
    t0 = traj.turns[0]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert t0.finish_reason == "length" and engine.outputs[0][-1] != eot
    assert traj.input_ids[t0.end - 1] == eot and traj.loss_mask[t0.end - 1] == 0
    assert traj.rollout_logprobs[t0.end - 1] == 0.0 and t0.num_generated == t0.end - t0.start - 1
    assert engine.inputs[1][: t0.end] == traj.input_ids[: t0.end]


def test_max_turns_ends_as_kept_failure(tok):
    env = EchoEnv()
    traj = play(tok, env, RecordingEngine(tok, [REPLIES[0]] * 5), max_turns=3)
    assert (traj.ended_by, traj.reward, traj.num_turns, env.closed) == ("max_turns", 0.0, 3, 1)
    traj.check()


def test_context_limit_ends_as_kept_failure(tok):
    chat = ChatFormat.from_tokenizer(tok)
    prompt_len = len(chat.prompt_ids(EchoEnv.system_prompt, EchoEnv().reset()))
    engine = RecordingEngine(tok, [REPLIES[0]] * 50)
    traj = play(tok, EchoEnv(), engine, max_turns=50, max_context_tokens=prompt_len + 120)
    assert traj.ended_by == "context" and traj.reward == 0.0 and traj.num_turns >= 1
    assert len(traj.input_ids) <= prompt_len + 120
    limit = prompt_len + 120
    assert all(len(x) + p.max_new_tokens < limit for x, p in zip(engine.inputs, engine.params, strict=True))
    traj.check()


def test_context_cut_mid_generation(tok):
    chat = ChatFormat.from_tokenizer(tok)
    prompt_len = len(chat.prompt_ids(EchoEnv.system_prompt, EchoEnv().reset()))
    engine = RecordingEngine(tok, ["x" * 400], length_cut={0})
    traj = play(tok, EchoEnv(), engine, max_context_tokens=prompt_len + 10)
    assert traj.ended_by == "context" and len(traj.input_ids) == prompt_len + 10
    assert traj.turns[0].num_generated == 9


class FailingEngine:
    async def generate(self, input_ids, params):
        raise ConnectionError("server unreachable after 3 retries")


def test_infra_failures_end_as_error_and_close(tok):
    env = EchoEnv()
    traj = play(tok, env, FailingEngine())
    assert traj.ended_by == "error" and traj.reward is None and "unreachable" in traj.infra_error
    assert traj.is_infra_failure and env.closed == 1
    env = EchoEnv(fail_at=2)
    traj = play(tok, env, RecordingEngine(tok, REPLIES))
    assert traj.ended_by == "error" and "sandbox died" in traj.infra_error and env.closed == 1


class EndingEnv(EchoEnv):
    """Ends the episode itself with ended_by "error": blaming the policy, or (with info) itself."""

    def __init__(self, info):
        super().__init__()
        self.info = info

    def step(self, action_text):
        self.steps.append(action_text)
        return Step("bye", done=True, ended_by="error", info=self.info)


def test_environment_ended_errors_are_scored_unless_infra(tok):
    outcome = lambda t: (t.ended_by, t.reward, t.infra_error, t.is_infra_failure)
    traj = play(tok, EndingEnv({}), RecordingEngine(tok, REPLIES))
    assert outcome(traj) == ("error", 0.0, None, False)
    traj = play(tok, EndingEnv({"infra_error": "disk full"}), RecordingEngine(tok, REPLIES))
    assert outcome(traj) == ("error", None, "disk full", True)
    traj.check()


def test_toy_env_format_failures_are_policy_failures(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    trajs = asyncio.run(
        run_episodes([ToyEnv(seed=i) for i in range(3)], UniformEngine(len(tok), eot), tok,
                     sampling=SamplingParams(max_new_tokens=16), max_turns=5, max_context_tokens=2048)
    )  # fmt: skip
    for traj in trajs:
        traj.check()
        assert traj.ended_by == "error" and traj.reward == 0.0 and not traj.is_infra_failure
        assert all(traj.format_errors) and traj.rft_loss_mask().sum() == 0


def test_uniform_random_policy_never_breaks_the_loop(tok):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    engine = UniformEngine(len(tok), eot, seed=3)
    traj = play(tok, EchoEnv(), engine, max_turns=6)
    traj.check()
    assert traj.ended_by in ("max_turns", "submitted", "context") and traj.reward is not None
    for k, seen in enumerate(engine.inputs):
        assert traj.input_ids[: len(seen)] == seen
        assert traj.turns[k].start == len(seen)
    np.testing.assert_allclose(
        np.asarray(traj.rollout_logprobs)[np.asarray(traj.loss_mask) == 1], -math.log(len(tok)), rtol=1e-6
    )


def test_run_episodes_keeps_order_and_limits_concurrency(tok):
    in_flight, peak = [0], [0]

    class SlowEngine(RecordingEngine):
        async def generate(self, input_ids, params):
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            await asyncio.sleep(0.01)
            in_flight[0] -= 1
            return await super().generate(input_ids, params)

    class PerEnvEngine:
        def __init__(self):
            self.by_prompt = {}

        async def generate(self, input_ids, params):
            key = tok.decode(input_ids).split("Issue ")[1].split(":")[0]
            eng = self.by_prompt.setdefault(key, SlowEngine(tok, REPLIES))
            return await eng.generate(input_ids, params)

    envs = [EchoEnv(tag=i) for i in range(5)]
    done = []
    episodes = run_episodes(
        envs, PerEnvEngine(), tok, sampling=SAMPLING, max_turns=10, max_context_tokens=4096, concurrency=2,
        on_done=lambda i, t: done.append(i),
    )  # fmt: skip
    trajs = asyncio.run(episodes)
    assert [t.ended_by for t in trajs] == ["submitted"] * 5 and sorted(done) == list(range(5))
    assert peak[0] <= 2 and all(e.closed == 1 for e in envs)


def test_jsonl_roundtrip(tok, tmp_path):
    traj = play(tok, EchoEnv(), RecordingEngine(tok, REPLIES))
    traj.stage = {"advantage": 0.5}
    path = tmp_path / "t.jsonl"
    save_jsonl(path, [traj, traj])
    back = load_jsonl(path)
    assert len(back) == 2 and back[0] == traj and back[0].task_id == "echo-1"
    assert back[0].messages[0]["content"].startswith("You fix bugs.") and set(traj.timings) >= {"total_s"}
    seq = back[0].rl_sequence(0.5)
    assert seq.input_ids.dtype == np.int32 and seq.rollout_logprobs.dtype == np.float32
    np.testing.assert_array_equal(back[0].sft_sequence().loss_mask, traj.rft_loss_mask())
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1], "loss_mask": []}\n')
    with pytest.raises(TrajectoryError, match="bad.jsonl:1"):
        load_jsonl(tmp_path / "bad.jsonl")


def test_check_rejects_inconsistent_records():
    with pytest.raises(ValueError, match="outside assistant turns"):
        Trajectory(
            input_ids=[1, 2], loss_mask=[1, 0], rollout_logprobs=[0.0, 0.0], policy_versions=[-1, -1]
        ).check()
    traj = Trajectory(turns=[Turn(0, 2)])
    traj.append([1, 2], trained=True, versions=[3, 4])
    traj.check()
    traj.append([5], trained=False)
    assert traj.policy_versions == [3, 4, -1]
    traj.policy_versions[2] = 4
    with pytest.raises(ValueError, match="policy_versions"):
        traj.check()
