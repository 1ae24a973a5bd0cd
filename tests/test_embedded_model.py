"""The default embedded model ships inside the package: the same weights on every machine.

``tiny_spec.json`` names the spec key the shipped weights were built for; a change to
``TinySpec``'s defaults or to ``WARMUP_VERSION`` without regenerating them fails here.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from reasonrl.embedded import heldout_accuracy
from reasonrl.policy.tiny import EMBEDDED_DIR, REBUILD_COMMAND, SPEC_FILE, TinySpec, embedded_key, load_tiny_policy

from helpers import MINI_TINY

STALE = f"the shipped embedded model is stale or missing: run `{REBUILD_COMMAND}` (or `make embedded`)"


def test_shipped_files_exist():
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", SPEC_FILE):
        assert (EMBEDDED_DIR / name).is_file(), f"{EMBEDDED_DIR / name} is missing; {STALE}"


def test_the_shipped_tokenizers_chat_template_renders_a_task_prompt_as_itself():
    """An environment that speaks chat (docs/environments.md) asks the embedded model with the
    very text of a task prompt: the system message is left out, the others follow in order."""
    from transformers import AutoTokenizer

    from reasonrl.policy.char_tokenizer import PLAIN_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    assert tok.chat_template == PLAIN_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "(1+2)*3;"},
                {"role": "assistant", "content": "1+2=3;3*3=9;####9"}, {"role": "user", "content": "4+4;"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "(1+2)*3;1+2=3;3*3=9;####94+4;"


def test_shipped_key_is_the_default_spec_key():
    meta = json.loads((EMBEDDED_DIR / SPEC_FILE).read_text())
    assert meta["key"] == TinySpec().key(), (
        f"shipped key {meta['key']} != TinySpec().key() {TinySpec().key()} (the default spec or WARMUP_VERSION "
        f"changed); {STALE}")
    assert TinySpec(**meta["spec"]) == TinySpec(), STALE


def test_shipped_weights_match_the_default_architecture():
    spec = TinySpec()
    state = load_file(str(EMBEDDED_DIR / "model.safetensors"))
    assert sum(v.numel() for v in state.values()) > 600_000
    assert state["model.embed_tokens.weight"].shape[1] == spec.hidden_size
    assert sum(k.endswith("self_attn.q_proj.weight") for k in state) == spec.num_layers


def test_default_spec_loads_the_shipped_weights_without_building(tmp_path):
    cache = tmp_path / "cache"
    said: list[str] = []
    policy = load_tiny_policy(cache_dir=cache, log=said.append)
    assert not any("building" in m for m in said), said
    assert not cache.exists() or not any(cache.iterdir())
    shipped = load_file(str(EMBEDDED_DIR / "model.safetensors"))
    params = dict(policy.model.named_parameters())
    loaded = [(k, v) for k, v in shipped.items() if k in params]
    assert loaded, "no shipped tensor is a parameter of the loaded model"
    assert all((params[k].detach() == v).all() for k, v in loaded)
    # Through $REASONRL_CACHE too (no cache_dir given), as the trainer calls it.
    said.clear()
    load_tiny_policy(TinySpec(), log=said.append)
    assert not said


def test_a_non_default_spec_still_builds_and_caches(tmp_path):
    cache = tmp_path / "cache"
    said: list[str] = []
    spec = TinySpec(**MINI_TINY)
    assert spec.key() != embedded_key()
    load_tiny_policy(spec, cache_dir=cache, log=said.append)
    assert any("building" in m for m in said)
    assert (cache / f"tiny-arith-{spec.key()}" / "config.json").is_file()
    said.clear()
    load_tiny_policy(spec, cache_dir=cache, log=said.append)  # the second time from the cache
    assert not any("building" in m for m in said)


@pytest.mark.slow
def test_a_rebuild_reaches_the_shipped_models_accuracy(tmp_path):
    """A fresh build of TinySpec() (about a minute on 2 cores) lands within 0.05 of the shipped
    model's held-out greedy accuracy: reduction order differs between machines, the model does not."""
    cache = tmp_path / "cache"
    said: list[str] = []
    rebuilt = load_tiny_policy(TinySpec(), cache_dir=cache, log=said.append, use_embedded=False)
    assert any("building" in m for m in said)
    shipped = heldout_accuracy(load_tiny_policy())
    new = heldout_accuracy(rebuilt)
    assert abs(new - shipped) <= 0.05, f"rebuilt {new:.3f} vs shipped {shipped:.3f}"
