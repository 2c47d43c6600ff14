"""YaRN on the training side: stage 2 starts from a stage-1 checkpoint trained with plain RoPE and
turns YaRN on in its own config (the shipped Qwen2.5 configs run it from RFT on). Its trainer's
log-probs on sequences longer than original_max_position_embeddings equal transformers' with the
same YaRN config, and the weights it exports load in transformers with that rope_scaling."""

from __future__ import annotations

import json

import numpy as np
import torch
import transformers
from hf_helpers import reference_logprobs
from rl_toy_helpers import toy_tokenizer

from jaxswe.config import config_from_dict
from jaxswe.model import save_hf
from jaxswe.policy import write_model_file
from jaxswe.rollout.sglang_launcher import stage_sglang_command
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.stages.runtime import make_backend, resolve_policy
from jaxswe.train.trainer import Trainer

ORIGINAL, CONTEXT, VOCAB = 32, 128, 97
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}


def _hf_model(path):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=ORIGINAL,
        rope_theta=10000.0,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path)


def _config(tmp_path, **model):
    base = {"tokenizer": str(tmp_path / "tok"), "dtype": "float32", "remat": "none", "attention_block": 32}
    context = model["max_context"]  # every length the stage uses
    lengths = {
        "agent": {"max_context_tokens": context},
        "sft": {"seq_len": context},
        "rl": {"seq_len": context},
    }
    return {"model": {**base, **model}, "optimizer": {"lr": 1e-6}, **lengths}


def test_stage2_turns_on_yarn_over_a_stage1_checkpoint(tmp_path, capsys):
    _hf_model(tmp_path / "hf")
    toy_tokenizer(2, tmp_path / "tok")
    # stage 1: plain RoPE at the original context, checkpointed as a stage dir
    cfg1 = config_from_dict(_config(tmp_path, path=str(tmp_path / "hf"), max_context=ORIGINAL))
    p1 = resolve_policy(cfg1)
    assert p1.model_cfg.rope_scaling is None
    write_model_file(tmp_path / "rl1", p1)
    Checkpoints(tmp_path / "rl1" / "checkpoints").save(1, {"params": p1.params}, {})

    # stage 2: same weights, YaRN x4 and 4x the context from its own config
    cfg2 = config_from_dict(
        {**_config(tmp_path, max_context=CONTEXT, rope_scaling=YARN), "init_from": str(tmp_path / "rl1")}
    )
    p2 = resolve_policy(cfg2)
    assert p2.model_cfg.max_position_embeddings == CONTEXT
    assert p2.model_cfg.rope_scaling.to_hf()["original_max_position_embeddings"] == ORIGINAL
    assert "WARNING" not in capsys.readouterr().err
    # without YaRN, the same stage is warned about in one line as it loads the checkpoint
    resolve_policy(
        config_from_dict({**_config(tmp_path, max_context=CONTEXT), "init_from": str(tmp_path / "rl1")})
    )
    warned = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert warned == [
        f"jaxswe: WARNING: model.max_context {CONTEXT}, agent.max_context_tokens {CONTEXT}, sft.seq_len "
        f"{CONTEXT}, rl.seq_len {CONTEXT} past the {ORIGINAL} positions the weights' RoPE covers (plain "
        f"RoPE: no rope_scaling); set model.rope_scaling, e.g. {{rope_type: yarn, factor: 4, "
        f"original_max_position_embeddings: {ORIGINAL}}}, or shorten them"
    ]
    trainer = Trainer(p2.model_cfg, p2.params, cfg2.optimizer, mesh_cfg=cfg2.mesh)
    rows, t = trainer.rows_multiple, 96  # positions up to 95 > 32
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(rows, t)).astype(np.int32)
    batch = {"input_ids": ids, "positions": np.tile(np.arange(t, dtype=np.int32), (rows, 1)),
             "segment_ids": np.ones_like(ids)}  # fmt: skip
    logp, *_ = trainer.logprobs(batch)

    # transformers, from the original checkpoint with the same YaRN config set on its side
    hf_cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    hf_cfg.rope_parameters = {**YARN, "rope_theta": 10000.0}
    hf_cfg.max_position_embeddings = CONTEXT
    reference = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "hf", config=hf_cfg).eval()
    expected = reference_logprobs(reference, ids)
    np.testing.assert_allclose(logp, expected, atol=1e-4)
    plain = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert np.abs(reference_logprobs(plain, ids) - expected).max() > 1e-2  # YaRN matters here

    # the exported directory carries the scaling: transformers alone reproduces the trainer
    save_hf(tmp_path / "export", p2.model_cfg, trainer.params, dtype="float32")
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["max_position_embeddings"] == CONTEXT and exported["rope_scaling"]["factor"] == 4.0
    reloaded = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "export").eval()
    rope = reloaded.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == ORIGINAL
    np.testing.assert_allclose(reference_logprobs(reloaded, ids), logp, atol=1e-4)

    # the embedded engine and the SGLang launcher get the same context and scaling
    assert make_backend(cfg2, p2).engine.sampler.cfg.rope_scaling == p2.model_cfg.rope_scaling
    cmd = stage_sglang_command(tmp_path / "export", p2.model_cfg, cfg2.rollout, port=30001)
    override = json.loads(cmd[cmd.index("--json-model-override-args") + 1])
    assert override["rope_scaling"]["factor"] == 4.0 and override["max_position_embeddings"] == CONTEXT
    assert cmd[cmd.index("--context-length") + 1] == str(CONTEXT)
