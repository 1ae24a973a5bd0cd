"""A character-level tokenizer that is a standard ``PreTrainedTokenizerFast``.

Built from the ``tokenizers`` library so that ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` work exactly as for a real model: the
embedded model has no private code path.
"""

from __future__ import annotations

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
