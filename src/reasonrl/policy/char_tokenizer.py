"""A character-level tokenizer that is a standard ``PreTrainedTokenizerFast``.

Built from the ``tokenizers`` library so that ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` work exactly as for a real model: the
embedded model has no private code path.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
ARITHMETIC_CHARS = "0123456789+-*()=;#"
# The messages' texts in order, a system message left out: a chat request (an environment that
# speaks the OpenAI API) renders to the very text a plain prompt of the task is.
PLAIN_CHAT_TEMPLATE = "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"


def build_char_tokenizer(chars: str = ARITHMETIC_CHARS) -> PreTrainedTokenizerFast:
    if len(set(chars)) != len(chars):
        raise ValueError(f"duplicate characters in tokenizer alphabet {chars!r}")
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tok.padding_side = "left"
    tok.chat_template = PLAIN_CHAT_TEMPLATE
    return tok


def unknown_characters(tokenizer, texts: Iterable[str]) -> tuple[Counter, int]:
    """(count of each character of ``texts`` that ``tokenizer`` maps to its unknown token, the
    number of characters in all): the embedded model's tokenizer knows only its alphabet, so a
    prompt in words reaches it as a row of ``<unk>``. Each distinct character is tokenised once,
    alone; a tokenizer without an unknown token (byte-level BPE) knows every character: (empty, 0)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return Counter(), 0
    counts: Counter = Counter()
    for text in texts:
        counts.update(text)
    total = sum(counts.values())
    if not counts:
        return Counter(), total
    chars = sorted(counts)
    ids = tokenizer(chars, add_special_tokens=False)["input_ids"]
    return Counter({c: counts[c] for c, i in zip(chars, ids) if unk in i}), total
