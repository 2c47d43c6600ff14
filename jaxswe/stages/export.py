"""A trained stage as a Hugging Face model directory (`jaxswe export RUN_DIR/STAGE OUT`).

The directory holds what transformers and SGLang load: safetensors (bf16 by default), config.json
(`save_hf`), generation_config.json with the end-of-turn/eos ids, and the stage's tokenizer files.
It is assembled in a temporary directory next to OUT and renamed into place, so a failure leaves
nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jaxswe.errors import UserError
from jaxswe.policy import load_policy, load_tokenizer
from jaxswe.run.layout import TOKENIZER_FILES


def eos_token_ids(tokenizer: Any) -> list[int]:
    """The ids that end generation: the chat template's end-of-turn token first, then the
    tokenizer's eos and `<|endoftext|>` (Qwen2.5-Instruct: [151645, 151643])."""
    from jaxswe.agent.trajectory import ChatFormat

    ids = [ChatFormat.from_tokenizer(tokenizer).end_of_turn_id, tokenizer.eos_token_id]
    if "<|endoftext|>" in tokenizer.get_vocab():
        ids.append(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    return list(dict.fromkeys(i for i in ids if i is not None))


def write_generation_config(out: str | Path, tokenizer: Any) -> None:
    """generation_config.json with the eos and pad ids (sampling settings stay the caller's)."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id
    GenerationConfig(eos_token_id=eos_token_ids(tokenizer), pad_token_id=pad).save_pretrained(str(out))


def export_stage(
    stage: str | Path, out: str | Path, *, dtype: str = "bfloat16", max_shard_bytes: int = 5 * 1024**3
) -> Path:
    """Write the newest checkpoint of `stage` to the new Hugging Face directory `out`."""
    import jax
    import jax.numpy as jnp

    from jaxswe.model.hf_io import save_hf

    out = Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists; choose a new output directory")
    if dtype not in ("bfloat16", "float32"):
        raise UserError(f"--dtype must be bfloat16 or float32, got {dtype!r}")
    policy = load_policy(stage, dtype=dtype)  # read as written, not cast after
    model_cfg, tokenizer_dir = policy.model_cfg, policy.tokenizer_dir
    tokenizer = load_tokenizer(tokenizer_dir)
    params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), policy.params)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_hf(tmp / "model", model_cfg, params, dtype=dtype, max_shard_bytes=max_shard_bytes)
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy2(Path(tokenizer_dir) / name, tmp / "model" / name)
        write_generation_config(tmp / "model", tokenizer)
        os.replace(tmp / "model", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
