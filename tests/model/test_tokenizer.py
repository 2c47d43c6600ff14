"""The locally trained Qwen2-style tokenizer: lossless, special tokens, ChatML, loads with AutoTokenizer."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from jaxswe.tokenizer import SPECIAL_TOKENS, TokenizerError, build_tokenizer

CORPUS = [
    "def add(a, b):\n    return a + b\n\n",
    "The function returns the wrong value when the list is empty.\n",
    "(Current directory: /repo, current file: n/a) bash-$\n",
    "```\nopen src/parser.py 12\n```\n",
] * 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return build_tokenizer(CORPUS, 400, out), out


def test_vocab_size_and_special_tokens(saved):
    tok, _ = saved
    assert 259 <= len(tok) <= 400
    ids = tok.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert len(set(ids)) == 3
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # a special token in text is one id, never split into bytes
    assert tok.encode("a<|im_end|>b", add_special_tokens=False)[1] == ids[2]


def test_merges_were_learned(saved):
    tok, _ = saved
    text = "def add(a, b):\n    return a + b\n"
    assert len(tok.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_chatml_template(saved):
    tok, _ = saved
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_system = tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=False)
    assert no_system.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_auto_tokenizer_loads_the_same(saved):
    tok, out = saved
    loaded = AutoTokenizer.from_pretrained(out)
    text = "héllo <|im_start|>user\n  x = [1, 2]\r\n\t😀<|im_end|>"
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert loaded.chat_template == tok.chat_template
    assert loaded.eos_token_id == tok.eos_token_id


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_roundtrip_is_lossless(saved, text):
    tok, _ = saved
    text = text.replace("<|", "< |")  # literal special-token text is covered above

    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == unicodedata.normalize("NFC", text)


def test_too_small_vocab_is_a_clear_error():
    with pytest.raises(TokenizerError, match="vocab_size 100"):
        build_tokenizer(CORPUS, 100)
