"""`jaxswe export`: a stage's checkpoint as a Hugging Face directory that transformers loads with the
same log-probs; `jaxswe serve --model` and `--init-from` take stage directories."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from jaxswe.cli import main
from jaxswe.model import get_preset, init_params, token_logprobs
from jaxswe.policy import Policy, write_model_file
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.stages.toy import toy_tokenizer


@pytest.fixture
def stage(tmp_path):
    """A stage dir as the stages leave it: model.json, a tokenizer dir, checkpoints/<step>."""
    tok = toy_tokenizer(4, tmp_path / "tokenizer")
    cfg = get_preset("tiny", vocab_size=len(tok), attention="dense", tie_word_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
    params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), params)
    stage_dir = tmp_path / "run" / "rl"
    stage_dir.mkdir(parents=True)
    write_model_file(stage_dir, Policy(cfg, params, str(tmp_path / "tokenizer")))
    ckpts = Checkpoints(stage_dir / "checkpoints")
    ckpts.save(2, {"params": params}, {"stage": "rl"})
    ckpts.close()
    return stage_dir, cfg, params, tok


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().err.strip()


@pytest.mark.slow
def test_export_loads_in_transformers_with_same_logprobs(stage, tmp_path, capsys):
    stage_dir, cfg, params, tok = stage
    out = tmp_path / "hf"
    umask = os.umask(0o022)
    try:
        main(["export", str(stage_dir), str(out)])
    finally:
        os.umask(umask)
    # readable by a server running as another user: a plain mkdir's modes, not mkdtemp's 0700
    assert {p.stat().st_mode & 0o777 for p in [out, *out.iterdir()]} == {0o755, 0o644}
    with safe_open(str(out / "model.safetensors"), "np") as f:  # bf16 by default
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (safe_open is not a dict)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    assert gen["pad_token_id"] == tok.pad_token_id
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.get_vocab() == tok.get_vocab() and hf_tok.chat_template == tok.chat_template

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 12))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor(ids)).logits.double(), -1).numpy()
    ref = np.zeros(ids.shape)
    ref[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    ours = np.asarray(token_logprobs(rounded, cfg, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, ref, atol=1e-4)

    capsys.readouterr()
    code, err = _run(["export", str(stage_dir), str(out)], capsys)  # OUT exists: refused, kept
    assert code == 2 and err == f"jaxswe: error: {out}: already exists; choose a new output directory"
    assert (out / "model.safetensors").is_file()


def test_export_of_a_non_stage_is_one_line_and_writes_nothing(tmp_path, capsys):
    code, err = _run(["export", str(tmp_path), str(tmp_path / "hf")], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "no checkpoint found" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_serve_and_init_from_take_a_stage_dir(stage, tmp_path, capsys):
    from jaxswe.rollout.weights import load_model

    stage_dir, cfg, params, _ = stage
    older = stage_dir.parent / "rft" / "checkpoints"  # an earlier stage of the run
    (older / "1").mkdir(parents=True)
    os.utime(older, (0, 0))
    for path in (stage_dir, stage_dir / "checkpoints", stage_dir.parent):  # the run dir: its newest stage
        served_cfg, served = load_model(path, dtype="float32")
        assert served_cfg.remat == "none" and served_cfg.num_layers == cfg.num_layers
        for a, b in zip(jax.tree.leaves(served), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "holds stages; using the newest, rl" in capsys.readouterr().err

    config = tmp_path / "c.yaml"
    config.write_text("stages: [eval]\n")
    argv = ["eval", "--config", str(config), "--run-dir", str(tmp_path / "ev"), "--init-from"]
    code, err = _run([*argv, str(tmp_path / "nope")], capsys)
    assert code == 2 and f"{tmp_path / 'nope'}: no checkpoint found" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "ev").exists()
