"""Text-model tokens with character offsets: the token side of the frame grid.

``full`` uses Qwen3's own tokenizer (``AutoTokenizer``). ``tiny`` trains a small byte-level BPE
with the same pre-tokenization as Qwen2/3 (their split regex, then bytes) on a built-in
multilingual corpus, so offsets behave like Qwen's: a leading space belongs to the token, and
a character outside the vocabulary becomes several byte pieces sharing one character span.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from speechdata.profiles import TINY_CORPUS

# Qwen2/Qwen3's pre-tokenizer split pattern (tokenizer.json of Qwen/Qwen3-1.7B).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TINY_VOCAB_SIZE = 512


@dataclass(frozen=True)
class TokenizedText:
    ids: list[int]
    offsets: list[tuple[int, int]]
    """Character ``[start, end)`` of each token in the text."""


def build_tiny_tokenizer(corpus: Iterable[str] = (TINY_CORPUS,), vocab_size: int = TINY_VOCAB_SIZE):
    """A deterministic Qwen-style byte-level BPE tokenizer, trained in well under a second."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    return build_tiny_tokenizer()


def load_text_tokenizer(model_id: str, revision: str | None = None, local_files_only: bool = False):
    from speechdata.hub_access import hub_model_access

    local_files_only = hub_model_access(model_id, revision, local_files_only=local_files_only)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_id, revision=revision, local_files_only=local_files_only)


def tokenize_with_offsets(tokenizer, text: str) -> TokenizedText:
    """Token ids of ``text`` (no special tokens) with their character offsets."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return TokenizedText(list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]])


def tokenize_many(tokenizer, texts: Sequence[str]) -> list[TokenizedText]:
    """Batch tokenization (the fast tokenizer runs the batch in Rust, in parallel)."""
    if not texts:
        return []
    encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    return [
        TokenizedText(list(ids), [tuple(o) for o in offsets])
        for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)
    ]
