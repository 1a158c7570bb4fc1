"""The character tokenizer of the built-in `tiny` model, and the stop tokens of any model.

One token per character of the arithmetic alphabet, plus four specials. It is a real
`transformers.PreTrainedTokenizerFast`, so it saves and loads like any Hugging Face tokenizer and
`llmrl export` can ship it next to the weights.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
ALPHABET = list("0123456789+-*=() ")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A left-padding, character-level tokenizer: ids 0..3 are pad, bos, eos, unk."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ALPHABET)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )
    return tok


def stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """The ids that end a completion: tokenizer.eos_token_id ∪ model.generation_config.eos_token_id
    (an int or a list: Llama-3-style chat models list <|end_of_text|> and <|eot_id|>), the union
    transformers' `generate` stops on; in that order, without repeats."""
    config = getattr(model, "generation_config", None)
    ids: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        for i in [source] if isinstance(source, int) else list(source or []):
            if int(i) not in ids:
                ids.append(int(i))
    return ids
