"""Under context parallelism each rank takes the log-probs of its own chunk: the compiled
recompute pass on {fsdp 2, context 4} does about the FLOPs per device of {fsdp 8} (same tokens
per device), not the 4x an LM head over the whole gathered sequence on every context rank costs."""

import jax
import jax.numpy as jnp

from jaxswe.model.config import get_preset
from jaxswe.train import make_compute_logprobs
from jaxswe.train.state import abstract_params
from sharding import make_mesh, make_rules

# A vocabulary-heavy model: the LM head is most of the work.
CONFIG = get_preset("tiny", vocab_size=8192, logprob_chunk=128, attention_block=128)


def _flops_per_device(axes: dict[str, int]) -> float:
    fn = make_compute_logprobs(CONFIG, make_mesh(axes), make_rules(), context_attention="ring")
    batch = {k: jax.ShapeDtypeStruct((8, 1024), jnp.int32) for k in ("input_ids", "positions", "segment_ids")}
    cost = fn.jitted.lower(abstract_params(CONFIG), batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def test_context_ranks_compute_their_own_chunk():
    context, data = _flops_per_device({"fsdp": 2, "context": 4}), _flops_per_device({"fsdp": 8})
    assert context < 1.3 * data, (context, data)
