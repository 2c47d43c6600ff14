"""Qwen2 / Qwen2.5 model shape and runtime knobs, Hugging Face config.json round trip, presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxswe.errors import UserError
from sharding.planner import ModelShape

ATTENTION_KINDS = ("auto", "blockwise", "pallas", "dense", "cudnn")  # see jaxswe.model.attention
REMAT_POLICIES = ("none", "full", "save_projections")
DTYPES = ("float32", "bfloat16", "float16")


class ModelConfigError(UserError):
    """A model config (preset name, config.json, field value) that cannot be used."""


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling, with transformers' defaults for every optional field."""

    factor: float
    original_max_position_embeddings: int
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, rope: Mapping[str, Any], max_position_embeddings: int) -> YarnScaling:
        """Parse a `rope_scaling` / `rope_parameters` dict of rope_type yarn."""
        if rope.get("factor") is None:
            raise ModelConfigError("rope_scaling: yarn needs 'factor'")
        return cls(
            factor=float(rope["factor"]),
            original_max_position_embeddings=int(
                rope.get("original_max_position_embeddings") or max_position_embeddings
            ),
            attention_factor=_opt_float(rope.get("attention_factor")),
            beta_fast=float(rope.get("beta_fast") or 32.0),
            beta_slow=float(rope.get("beta_slow") or 1.0),
            mscale=_opt_float(rope.get("mscale")),
            mscale_all_dim=_opt_float(rope.get("mscale_all_dim")),
            truncate=bool(rope.get("truncate", True)),
        )

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rope_type": "yarn",
            "type": "yarn",
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }
        optional = {
            "attention_factor": self.attention_factor,
            "mscale": self.mscale,
            "mscale_all_dim": self.mscale_all_dim,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.beta_fast != 32.0:
            out["beta_fast"] = self.beta_fast
        if self.beta_slow != 1.0:
            out["beta_slow"] = self.beta_slow
        if not self.truncate:
            out["truncate"] = False
        return out


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def parse_rope_scaling(rope: Mapping[str, Any] | None, max_position_embeddings: int) -> YarnScaling | None:
    """A `rope_scaling` dict (or None) -> YarnScaling or None; other rope types are errors."""
    if not rope:
        return None
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ModelConfigError(f"rope_scaling: rope_type {kind!r} is not supported (only 'yarn' or default)")
    return YarnScaling.from_hf(rope, max_position_embeddings)


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Shape of a Qwen2 decoder plus how it computes. Hashable: usable as a jit static argument.

    `rope_scaling` accepts a YarnScaling or a Hugging Face style dict ({"rope_type": "yarn", ...}).
    Runtime knobs: `dtype` (compute dtype; softmax, norms and log-probs are float32 regardless),
    `param_dtype` (init_params), `grad_reduce_dtype` (weight gradients are formed and summed across
    devices in it: jaxswe.model.precision), `remat` (none | full | save_projections), `attention`
    (auto | blockwise | pallas | dense | cudnn: see jaxswe.model.attention), `attention_block`
    (tokens per q/kv block), `logprob_chunk` (tokens per chunk of the vocabulary projection).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # defaults to hidden_size // num_heads
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    rope_scaling: YarnScaling | None = None
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    grad_reduce_dtype: str = "float32"
    remat: str = "full"
    attention: str = "auto"
    attention_block: int = 512
    logprob_chunk: int = 1024

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(
                self, "rope_scaling", parse_rope_scaling(self.rope_scaling, self.max_position_embeddings)
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "attention_block", "logprob_chunk"):  # fmt: skip
            if int(getattr(self, name)) <= 0:
                raise ModelConfigError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"model config: num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"model config: head_dim {self.head_dim} must be even for RoPE")
        for name, allowed in (("dtype", DTYPES), ("param_dtype", DTYPES), ("grad_reduce_dtype", DTYPES),
                              ("remat", REMAT_POLICIES), ("attention", ATTENTION_KINDS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ModelConfigError(f"model config: {name} {getattr(self, name)!r} not in {allowed}")

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.num_heads // self.num_kv_heads

    def planner_shape(self) -> ModelShape:
        """The memory planner's view of this model (`sharding` does not import `jaxswe`)."""
        return ModelShape(
            vocab=self.vocab_size,
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            layers=self.num_layers,
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            tie=self.tie_word_embeddings,
        )

    def replace(self, **changes: Any) -> Qwen2Config:
        return dataclasses.replace(self, **changes)

    def with_context(
        self, max_position_embeddings: int, rope_scaling: Mapping[str, Any] | None = None
    ) -> Qwen2Config:
        """This model at another context length and, when `rope_scaling` is given, another RoPE
        scaling (a Hugging Face dict; {"rope_type": "default"} removes it). A YaRN dict without
        original_max_position_embeddings takes this config's max_position_embeddings (the context
        the weights were trained at), not the new one."""
        rope = self.rope_scaling
        if rope_scaling is not None:
            rope = parse_rope_scaling(rope_scaling, self.max_position_embeddings)
        return self.replace(max_position_embeddings=int(max_position_embeddings), rope_scaling=rope)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **runtime: Any) -> Qwen2Config:
        """Build from a Hugging Face config.json dict (`rope_scaling` or transformers 5 `rope_parameters`)."""
        archs = hf.get("architectures") or ["Qwen2ForCausalLM"]
        model_type = hf.get("model_type", "qwen2")
        if model_type != "qwen2" or not any(a in ("Qwen2ForCausalLM", "Qwen2Model") for a in archs):
            raise ModelConfigError(
                f"config.json: unsupported architecture {archs} (model_type {model_type!r}); "
                "only Qwen2ForCausalLM (model_type 'qwen2') is supported"
            )
        if hf.get("use_sliding_window"):
            raise ModelConfigError("config.json: use_sliding_window true is not supported")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in hf]  # fmt: skip
        if missing:
            raise ModelConfigError(f"config.json: missing key(s) {missing}")
        if hf.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported (silu)")
        rope_params = dict(hf.get("rope_parameters") or {})
        rope_scaling = hf.get("rope_scaling") or rope_params or None
        theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        max_pos = int(hf.get("max_position_embeddings", 32768))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=int(hf["num_attention_heads"]),
            num_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            head_dim=hf.get("head_dim"),
            rope_theta=float(theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=max_pos,
            rope_scaling=parse_rope_scaling(rope_scaling, max_pos),
            **runtime,
        )

    def to_hf_dict(self, torch_dtype: str = "bfloat16") -> dict[str, Any]:
        """config.json contents readable by transformers 4 and 5 and SGLang."""
        rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope_parameters.update(self.rope_scaling.to_hf())
        out: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf(),
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_sliding_window": False,
            "sliding_window": None,
            "attention_dropout": 0.0,
            "torch_dtype": torch_dtype,
            "dtype": torch_dtype,
        }
        if self.head_dim != self.hidden_size // self.num_heads:
            out["head_dim"] = self.head_dim
        return out


_QWEN25_LARGE_VOCAB = 152064
_QWEN25_SMALL_VOCAB = 151936

PRESETS: dict[str, Qwen2Config] = {
    "tiny": Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        dtype="float32",
        remat="none",
        attention_block=64,
        logprob_chunk=64,
    ),  # fmt: skip
    "qwen2.5-0.5b": Qwen2Config(
        vocab_size=_QWEN25_SMALL_VOCAB,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        tie_word_embeddings=True,
    ),  # fmt: skip
    "qwen2.5-1.5b": Qwen2Config(
        vocab_size=_QWEN25_SMALL_VOCAB,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        tie_word_embeddings=True,
    ),  # fmt: skip
    "qwen2.5-7b": Qwen2Config(
        vocab_size=_QWEN25_LARGE_VOCAB,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
    ),  # fmt: skip
    "qwen2.5-32b": Qwen2Config(
        vocab_size=_QWEN25_LARGE_VOCAB,
        hidden_size=5120,
        intermediate_size=27648,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
    ),  # fmt: skip
    "qwen2.5-72b": Qwen2Config(
        vocab_size=_QWEN25_LARGE_VOCAB,
        hidden_size=8192,
        intermediate_size=29568,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        max_position_embeddings=131072,
        rope_scaling=YarnScaling(factor=4.0, original_max_position_embeddings=32768),
    ),  # fmt: skip
}


def get_preset(name: str, **changes: Any) -> Qwen2Config:
    """A named model shape (see PRESETS), with optional field changes."""
    if name not in PRESETS:
        raise ModelConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **changes)
