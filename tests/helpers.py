"""Shared builders for tests: a tiny untrained policy and small recipes."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from reasonrl.config import recipe_from_dict
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.tiny import TinySpec, new_tiny_model

# A model small enough that building it (with a token warm-up) takes a second.
MINI_TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
             "warmup_steps": 30, "warmup_batch": 16}


def mini_policy(seed: int = 0, pad_is_eos: bool = False, decoder: str = "hf") -> HFPolicy:
    """An untrained mini policy; ``pad_is_eos`` gives it a tokenizer whose padding token is its
    EOS, as SmolLM2's is, so tests see the real-model case that the char tokenizer hides;
    ``decoder`` is its sampling decode step (``rollout.decoder``)."""
    tok = build_char_tokenizer()
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    spec = TinySpec(**{**MINI_TINY, "seed": seed})
    pol = HFPolicy(new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), tok)
    pol.decoder = decoder
    return pol


def mini_recipe(**sections):
    """A fast recipe on the mini model; ``sections`` override whole sections or keys."""
    raw = {
        "model": {"backend": "tiny", "tiny": dict(MINI_TINY)},
        "rollout": {"num_generations": 4, "max_new_tokens": 24},
        "train": {"steps": 4, "prompts_per_step": 4, "checkpoint_every": 2, "micro_batch_size": 8},
        "eval": {"size": 16},
        "log": {"plots": False, "progress": False},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return recipe_from_dict(raw, "test recipe")


@contextmanager
def crash_at_step(monkeypatch, step: int):
    """Inside the block, ``Trainer.train_step`` raises at ``step`` (a simulated crash after the
    checkpoints before it were written); the block must end in that crash."""
    from reasonrl.train.trainer import Trainer

    original = Trainer.train_step

    def crashing(self, s):
        if s == step:
            raise RuntimeError("simulated crash")
        return original(self, s)

    monkeypatch.setattr(Trainer, "train_step", crashing)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            yield
    finally:
        monkeypatch.setattr(Trainer, "train_step", original)


class FakeInbox:
    """A sampler's inbox (``SamplerWorker.loop``) that delivers ``weights()`` as version 7,
    published after step 1, on its ``at_call``-th non-blocking read (a weight update
    mid-generation), and then only ``("stop",)`` to a blocking one."""

    def __init__(self, weights, at_call: int):
        self.weights, self.at_call, self.calls = weights, at_call, 0

    def get_nowait(self):
        import queue

        self.calls += 1
        if self.calls == self.at_call:
            return ("weights", 7, 1, self.weights())
        raise queue.Empty

    def get(self, timeout=None):
        return ("stop",)


def straight_and_resumed(recipe, tmp_path, monkeypatch):
    """Run ``recipe`` straight (``a``) and crashed at a random step, then resumed (``b``); assert
    equal metrics (``perf/*`` aside) and bit-identical final weights; return a's metric rows."""
    import random

    import torch
    from safetensors.torch import load_file

    from reasonrl.train.metrics import read_metrics
    from reasonrl.train.trainer import Trainer

    Trainer(recipe, tmp_path / "a", log=lambda m: None).run()
    # A crash before the first checkpoint leaves nothing to resume from (a fresh run is the right
    # response to that, and --resume refuses it): crash after one.
    crash = random.Random().randint(recipe.train.checkpoint_every, recipe.train.steps - 1)
    with crash_at_step(monkeypatch, crash):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()
    a, b = ([{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(tmp_path / d)]
            for d in ("a", "b"))
    assert a == b, f"crashed at step {crash}"
    wa, wb = (load_file(str(tmp_path / d / "final_model" / "model.safetensors")) for d in ("a", "b"))
    assert set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa), f"crashed at step {crash}"
    return a


def episode_batch(policy, prompts, parts, tags, rewards=None, meta=None):
    """A hand-built RolloutBatch of episodes: row i is ``prompts[i]`` and the completion
    ``parts[i]``, a list of (text, kind) in order. Kind ``"m"`` is the model's own tokens (in
    the loss mask, channel 0); any other kind is an observation whose tokens get channel
    ``tags[kind]`` in ``aux["env_channel"]`` and are left out of the loss mask. ``"</s>"`` is
    EOS. One group; ``rewards`` default to 0."""
    import torch

    from reasonrl.batch import RolloutBatch

    tok = policy.tokenizer
    prompt_ids, prompt_mask = policy.encode_prompts(list(prompts))
    comp = []
    for row in parts:
        ids, loss, ch = [], [], []
        for text, kind in row:
            t = tok(text, add_special_tokens=False)["input_ids"] if text != "</s>" else [tok.eos_token_id]
            ids += t
            loss += [int(kind == "m")] * len(t)
            ch += [0 if kind == "m" else tags[kind]] * len(t)
        comp.append((ids, loss, ch))
    width = max(len(c[0]) for c in comp)

    def pad(xs, v=0):
        return torch.tensor([x + [v] * (width - len(x)) for x in xs])

    n = len(comp)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=pad([c[0] for c in comp], tok.pad_token_id), completion_mask=pad([[1] * len(c[0]) for c in comp]),
        group_ids=torch.zeros(n, dtype=torch.long),
        rewards=torch.zeros(n) if rewards is None else torch.tensor(rewards, dtype=torch.float32),
        truncated=torch.zeros(n, dtype=torch.bool), loss_mask=pad([c[1] for c in comp]),
        meta=dict(meta or {}), aux={"env_channel": pad([c[2] for c in comp])})


def scripted_samples(ids, mask, rows, tokenizer):
    """The ``Samples`` a stand-in for ``sample_completions`` returns: the prompts ``ids`` /
    ``mask`` as given and one completion per row of token ids (``rows``), right-padded, each
    token at log-prob −0.5."""
    import torch

    from reasonrl.policy.sampling import Samples

    width = max(len(t) for t in rows)
    out = torch.full((len(rows), width), tokenizer.pad_token_id)
    cmask = torch.zeros_like(out)
    for r, t in enumerate(rows):
        out[r, :len(t)], cmask[r, :len(t)] = torch.tensor(t), 1
    return Samples(prompt_ids=ids, prompt_mask=mask, completion_ids=out, completion_mask=cmask,
                   sample_logprobs=-0.5 * cmask.float(), truncated=torch.zeros(len(rows), dtype=torch.bool),
                   texts=[tokenizer.decode(t, skip_special_tokens=True) for t in rows])


def flower_replies(monkeypatch, contents):
    """Flower ``Message``s carrying ``contents`` (RecordDicts) from nodes 1, 2, ..., as a
    strategy's ``aggregate_train`` receives them; outside a run Flower needs its task identity set."""
    from flwr.app import Message
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    return [Message(c, dst_node_id=i + 1, message_type="train") for i, c in enumerate(contents)]
