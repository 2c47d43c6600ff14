"""Qwen2 / Qwen2.5 decoder in functional JAX: params are a plain pytree, every entry point a pure function."""

from jaxswe.model.attention import attention_from_config, dense_attention
from jaxswe.model.config import ModelConfigError, Qwen2Config, YarnScaling, get_preset
from jaxswe.model.decode import decode_step, init_cache, prefill
from jaxswe.model.hf_io import WeightsError, load_hf, save_hf
from jaxswe.model.logprobs import token_logprobs
from jaxswe.model.params import count_params, init_params, param_logical_axes
from jaxswe.model.transformer import forward, logits

__all__ = [
    "ModelConfigError",
    "Qwen2Config",
    "WeightsError",
    "YarnScaling",
    "attention_from_config",
    "count_params",
    "decode_step",
    "dense_attention",
    "forward",
    "get_preset",
    "init_cache",
    "init_params",
    "load_hf",
    "logits",
    "param_logical_axes",
    "prefill",
    "save_hf",
    "token_logprobs",
]
