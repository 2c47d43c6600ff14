"""Sampling math: unbiased draws, truncation, log-prob semantics, per-row parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxswe.rollout.sampling import row_keys, row_params, sample_tokens, truncation_mask

VOCAB = 16
N = 40_000


def _logits(seed=0, scale=1.5):
    return np.random.default_rng(seed).normal(size=VOCAB) * scale


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def _keys(seed, n):
    """Row i samples the token at position i of a request seeded `seed`."""
    return row_keys(jnp.asarray(np.tile([[0, seed]], (n, 1)), jnp.uint32), jnp.arange(n))


def _draw(logits_v, *, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, n=N, seed=0, jit=True):
    logits_nv = jnp.broadcast_to(jnp.asarray(logits_v, jnp.float32), (n, VOCAB))
    rp = row_params([temperature] * n, [top_p] * n, [top_k] * n, [min_p] * n)
    fn = jax.jit(sample_tokens) if jit else sample_tokens
    tokens, lps = fn(_keys(seed, n), logits_nv, rp)
    return np.asarray(tokens), np.asarray(lps)


def _chi2_pvalue(tokens, probs):
    support = probs > 0
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[~support].sum() == 0, "drew a token outside the allowed set"
    expected = probs[support] * len(tokens)
    return stats.chisquare(counts[support], expected).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("jit", [True, False])
def test_temperature_one_is_unbiased_and_logprobs_are_log_softmax(jit):
    logits = _logits()
    tokens, lps = _draw(logits, jit=jit)
    probs = _softmax64(logits)
    assert _chi2_pvalue(tokens, probs) > 1e-3
    np.testing.assert_allclose(lps, np.log(probs)[tokens], atol=1e-5)


def test_chi_square_detects_a_wrong_distribution():
    # The check above can fail: samples at temperature 0.5 are rejected against the T=1 softmax.
    logits = _logits()
    tokens, _ = _draw(logits, temperature=0.5)
    assert _chi2_pvalue(tokens, _softmax64(logits)) < 1e-6


def test_temperature_scales_the_distribution_and_its_logprobs():
    logits = _logits(1)
    tokens, lps = _draw(logits, temperature=0.7)
    probs = _softmax64(logits / 0.7)
    assert _chi2_pvalue(tokens, probs) > 1e-3
    np.testing.assert_allclose(lps, np.log(probs)[tokens], atol=1e-5)


def _expected_truncated(logits, *, top_k=-1, top_p=1.0, min_p=0.0):
    probs = _softmax64(logits)
    keep = np.ones(VOCAB, bool)
    order = np.argsort(-probs)
    if top_k > 0:
        keep[order[top_k:]] = False
    before = np.cumsum(probs[order]) - probs[order]
    keep[order[before >= top_p]] = False
    keep &= probs >= min_p * probs.max()
    trunc = np.where(keep, probs, 0.0)
    return trunc / trunc.sum(), probs


@pytest.mark.parametrize(
    "kw", [{"top_k": 3}, {"top_p": 0.6}, {"min_p": 0.2}, {"top_k": 5, "top_p": 0.8, "min_p": 0.05}]
)
def test_truncation_draws_from_the_renormalized_set_and_reports_untruncated_logprobs(kw):
    logits = _logits(2)
    tokens, lps = _draw(logits, **kw)
    expected, full = _expected_truncated(logits, **kw)
    assert (expected > 0).sum() < VOCAB  # the case truncates something
    assert _chi2_pvalue(tokens, expected) > 1e-3
    np.testing.assert_allclose(lps, np.log(full)[tokens], atol=1e-5)


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    logits = np.log(np.array([0.5, 0.3, 0.2] + [1e-9] * (VOCAB - 3)))
    lp = jax.nn.log_softmax(jnp.asarray(logits[None], jnp.float32))
    mask = truncation_mask(lp, row_params([1.0], [0.6], [-1], [0.0]))
    assert np.asarray(mask)[0, :3].tolist() == [True, True, False]
    mask = truncation_mask(lp, row_params([1.0], [0.5], [-1], [0.0]))
    assert np.asarray(mask)[0, :3].tolist() == [True, False, False]


def test_greedy_rows_take_argmax_with_temperature_one_logprobs():
    logits = _logits(3)
    tokens, lps = _draw(logits, temperature=0.0, n=4)
    assert (tokens == np.argmax(logits)).all()
    np.testing.assert_allclose(lps, np.log(_softmax64(logits))[tokens], atol=1e-5)


def test_rows_keep_their_own_parameters():
    logits = _logits(4)
    n = 8000
    logits_nv = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (2 * n, VOCAB))
    rp = row_params([1.0] * n + [1.0] * n, [1.0] * 2 * n, [-1] * n + [2] * n, [0.0] * 2 * n)
    tokens, _ = jax.jit(sample_tokens)(_keys(7, 2 * n), logits_nv, rp)
    tokens = np.asarray(tokens)
    assert _chi2_pvalue(tokens[:n], _softmax64(logits)) > 1e-3
    top2, _ = _expected_truncated(logits, top_k=2)
    assert _chi2_pvalue(tokens[n:], top2) > 1e-3


def test_same_key_same_tokens_other_key_other_tokens():
    logits = _logits(5)
    a, _ = _draw(logits, n=256, seed=1)
    b, _ = _draw(logits, n=256, seed=1)
    c, _ = _draw(logits, n=256, seed=2)
    assert (a == b).all() and (a != c).any()
