"""What every rollout engine (HTTP client, in-process sampler) takes and returns."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

# Sampling seeds are in [0, MAX_SEED): SGLang 0.5.7+ (0.5.9 pinned) holds `sampling_seed` as int64
# (srt/sampling/sampling_batch_info.py); 0.5.6 held it as int32, which these seeds overflow.
MAX_SEED = 2**63


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, sent explicitly on every request (never taken from generation_config)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 1024
    stop_token_ids: tuple[int, ...] = ()
    # SGLang's `sampling_seed`: with a seed, a token depends only on (seed, its position in the
    # sequence) and the logits, never on the other requests in its batch; None: the server's RNG.
    sampling_seed: int | None = None

    @property
    def unbiased(self) -> bool:
        """True when samples come from the model's full softmax at temperature 1."""
        return self.temperature == 1.0 and self.top_p == 1.0 and self.top_k in (-1, 0) and self.min_p == 0.0


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled ids exactly as generated, with their log-probs.

    `weight_versions[i]` is the weight version (SGLang's `meta_info.weight_version`) of the
    server that sampled `output_ids[i]`; None when the engine reports no versions.
    """

    output_ids: list[int]
    logprobs: list[float]  # log p(output_ids[i] | prefix) under the rollout engine
    finish_reason: Literal["stop", "length", "abort"]
    prompt_logprobs: list[float] | None = None  # when asked for (logprob_start_len)
    weight_versions: list[str] | None = None


def derive_seed(*parts: object) -> int:
    """A sampling seed in [0, MAX_SEED) that depends only on `parts` (their reprs, hashed)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % MAX_SEED


def policy_version(weight_version: str | None) -> int:
    """The integer policy version of a weight version string.

    jaxswe sends integer versions with every weight update; SGLang's initial version is
    "default", which is the policy before any update: 0.
    """
    if weight_version is None or weight_version == "default":
        return 0
    try:
        version = int(weight_version)
    except ValueError:
        version = -1
    if version < 0:
        raise ValueError(f"weight_version {weight_version!r} is not a policy version (an integer >= 0)")
    return version


class Engine(Protocol):
    """Anything that turns token ids into a Generation (HTTP client or in-process sampler)."""

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation: ...
