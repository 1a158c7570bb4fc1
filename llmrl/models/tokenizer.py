"""The character tokenizer of the built-in `tiny` model.

One token per character of the arithmetic alphabet, plus four specials. It is a real
`transformers.PreTrainedTokenizerFast`, so it saves and loads like any Hugging Face tokenizer and
`llmrl export` can ship it next to the weights.
"""

from __future__ import annotations

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
