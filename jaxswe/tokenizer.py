"""A small byte-level BPE tokenizer trained locally, shaped like Qwen2's (for tests and the CPU demo).

Same pre-tokenization regex, byte-level alphabet, NFC normalization, special tokens
(`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and ChatML chat template as Qwen2/Qwen2.5, with a
vocabulary learned from the given corpus. Byte-level BPE encodes any text losslessly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from jaxswe.errors import UserError

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2's split pattern: contractions, letter runs, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen2.5 renders it (without tool calls): a default system turn when none is given.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


class TokenizerError(UserError):
    """A tokenizer that cannot be built from the given inputs."""


def build_tokenizer(
    corpus_texts: Iterable[str], vocab_size: int, out_dir: str | Path | None = None, *, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a Qwen2-style byte-level BPE on `corpus_texts`; save it to `out_dir` if given.

    The vocabulary holds the 3 special tokens (ids 0..2), the 256 byte symbols and learned merges,
    at most `vocab_size` entries in all. `AutoTokenizer.from_pretrained(out_dir)` loads the result.
    """
    if vocab_size < _MIN_VOCAB:
        raise TokenizerError(f"vocab_size {vocab_size} is below {_MIN_VOCAB} (256 bytes + special tokens)")
    core = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus_texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
