"""Shared by the dtype/YaRN tests and bench/dtype_update.py: random tiny transformers Qwen2
checkpoints saved as Qwen ships them (bf16 safetensors) and float64 reference log-probs."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import torch
import transformers

VOCAB = 250  # not a multiple of 128


def write_bf16_checkpoint(path: Path, *, hidden=64, heads=6, kv_heads=2, head_dim=16, tied=False, seed=0):
    """A random transformers Qwen2 saved in bfloat16; q/k/v biases drawn N(0, 0.5), norms perturbed.
    Returns the float32 model transformers loads back from that directory (the reference)."""
    torch.manual_seed(seed)
    hf_config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        max_position_embeddings=256,
    )
    model = transformers.Qwen2ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.add_(0.05 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(path)
    return transformers.Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def reference_logprobs(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.double()
    logp = torch.log_softmax(logits, -1).numpy()
    out = np.zeros(ids.shape)
    out[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    return out


def all_vocab_batch(rows: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows whose tokens cover the whole vocabulary (every embedding row gets a gradient)."""
    rng = np.random.default_rng(seed)
    ids = np.stack([np.resize(rng.permutation(VOCAB), seq) for _ in range(rows)]).astype(np.int32)
    return {
        "input_ids": ids,
        "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), ids.shape).copy(),
        "segment_ids": np.ones_like(ids),
        "loss_mask": np.ones(ids.shape, np.float32),
    }


def changed_fraction(before, after) -> float:
    """Fraction of all parameter elements whose value changed."""
    changed = sum(int(np.sum(np.asarray(a) != np.asarray(b))) for a, b in zip(
        jax.tree.leaves(before), jax.tree.leaves(after), strict=True))  # fmt: skip
    return changed / sum(int(np.size(x)) for x in jax.tree.leaves(before))
