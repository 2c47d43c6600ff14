"""The old-log-prob recompute pass runs the step's micro-batches one after another: XLA's memory
analysis of the compiled pass shows temporaries that follow the micro-batch, not the step."""

import jax
import jax.numpy as jnp
import pytest

from jaxswe.model.config import get_preset
from jaxswe.train import make_compute_logprobs
from jaxswe.train.state import abstract_params
from sharding import make_mesh, make_rules

ROWS, T = 32, 512


def _temp_bytes(num_micro: int) -> int:
    config = get_preset("tiny", vocab_size=512, remat="full", logprob_chunk=128)
    mesh, rules = make_mesh({"fsdp": -1}), make_rules()
    fn = make_compute_logprobs(config, mesh, rules, num_micro, context_attention="ring")
    params = abstract_params(config)
    batch = {k: jax.ShapeDtypeStruct((ROWS, T), jnp.int32) for k in ("input_ids", "positions", "segment_ids")}
    return fn.jitted.lower(params, batch).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_recompute_temporaries_scale_with_the_micro_batch():
    one, four = _temp_bytes(1), _temp_bytes(4)
    # outputs ([B, T] log-probs and entropies) are not temporaries; activations are ~ rows / num_micro
    assert four < one / 2.5, (one, four)
