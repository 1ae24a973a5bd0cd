"""Shared builders and checks for tests: a tiny untrained policy and small recipes, runs and their
metric rows, hand-built batches, scripted and spied-on sampling, a local chat server, FSG problems.
Test modules import what they share from here, never from one another."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.config import flatten, load_recipe, recipe_from_dict
from reasonrl.registry import REWARDS
from reasonrl.methods.fsg.task import KINDS, build_problem
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.sampling import Samples, right_pad
from reasonrl.policy.tiny import TinySpec, new_tiny_model

# A model small enough that building it (with a token warm-up) takes a second.
MINI_TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
             "warmup_steps": 30, "warmup_batch": 16}


def require_interpreter(python: str | None, what: str, install: str, venv: str) -> str:
    """The interpreter of a side environment (``make test`` builds each: ``venv``): skip with the
    reason where there is none, or fail under CI, where its absence is a broken set-up."""
    import os

    if python is None or not os.access(python, os.X_OK):
        why = f"no {what} interpreter ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; `make test` installs it ({venv}), so CI must have it")
        pytest.skip(why)
    return python


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


def gqa_policy(seed: int = 0) -> HFPolicy:
    """A random Llama with grouped key/value heads (SmolLM2's attention: several query heads a
    key/value head), pad == EOS."""
    tok = build_char_tokenizer()
    tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return HFPolicy(LlamaForCausalLM(cfg), tok)


def recipe_diff(a: str, b: str, overrides: tuple[str, ...] = ()) -> set[str]:
    """The flattened keys in which recipes/<a>.yaml (with ``--set`` ``overrides``) and
    recipes/<b>.yaml differ: a comparison's arms must differ in the method alone."""
    fa = flatten(load_recipe(f"recipes/{a}.yaml", list(overrides)).to_dict())
    fb = flatten(load_recipe(f"recipes/{b}.yaml").to_dict())
    return {k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}


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

    from safetensors.torch import load_file

    from reasonrl.metrics_log import read_metrics
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


# -- runs: the CLI, metric rows, final weights ---------------------------------------------------

QUIET = {"log": lambda m: None}


def run_cli(*args, cwd):
    """``python -m reasonrl.cli *args`` in ``cwd``; the completed process, output captured."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "reasonrl.cli", *args], cwd=cwd, capture_output=True, text=True)


def comparable(rows):
    """Metric rows without their ``perf/*`` keys (timings differ between equal runs)."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def comparable_across_sources(rows, drop=("perf/", "offpolicy/", "async/")):
    """Metric rows without the keys that start with any of ``drop``: by default also the
    ``offpolicy/*`` and ``async/*`` keys, which a sync run does not log."""
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


def weights(run_dir):
    """The final weights a run wrote."""
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def same_weights(a, b):
    """Whether the runs in ``a`` and ``b`` wrote bit-identical final weights."""

    wa, wb = weights(a), weights(b)
    return set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


def per_step(rows, key):
    """The value of ``key`` at each training step; the key must be logged at least once."""
    found = {r["step"]: r[key] for r in rows if key in r}
    assert found, f"{key} was never logged"
    return found


# -- rollout sources -------------------------------------------------------------------------------

def learning_recipe(**sections):
    """The shipped embedded model, whose groups disagree on rewards, so every step moves the weights."""
    rollout = {"max_new_tokens": 32, **sections.pop("rollout", {})}
    return mini_recipe(model={"backend": "tiny", "tiny": {}}, rollout=rollout, optim={"lr": 1e-3},
                       **sections)


def train_killing_a_sampler(recipe, run_dir, monkeypatch, worker: int = 0):
    """Train ``recipe``, SIGKILL-ing sampler ``worker`` when step 2 asks for its batch (while it
    samples ahead); return the metric rows, the log lines and each step's trained prompts."""
    from reasonrl.metrics_log import read_metrics
    from reasonrl.rollout.async_source import AsyncSource
    from reasonrl.train.trainer import Trainer

    original = AsyncSource.next_batch
    prompts, logs = {}, []

    def next_batch(self, step, version, watch):
        if step == 2 and "killed" not in prompts:
            self.endpoints[worker].kill()
            prompts["killed"] = True
        batch, every, stats = original(self, step, version, watch)
        prompts[step] = sorted(set(batch.meta["prompt"]))
        return batch, every, stats

    monkeypatch.setattr(AsyncSource, "next_batch", next_batch)
    Trainer(recipe, run_dir, log=logs.append).run()
    return read_metrics(run_dir), logs, prompts


def assert_each_step_trained_its_own_prompts(recipe, prompts):
    """No batch lost (a step would show a later step's prompts) and none trained twice."""
    from reasonrl.tasks.base import build_task

    task = build_task(recipe)
    n = recipe.train.prompts_per_step
    for step in range(recipe.train.steps):
        assert prompts[step] == sorted({p.prompt for p in task.train_problems(step, n, recipe.train.seed)}), step


# -- batches ----------------------------------------------------------------------------------------

def make(n, p, t, offset=0):
    """A RolloutBatch of ``n`` rows (prompts of ``p`` tokens, completions of ``t``) in groups of
    two from group ``offset`` on, policy version ``offset``."""

    from reasonrl.batch import RolloutBatch

    return RolloutBatch(
        prompt_ids=torch.arange(n * p).view(n, p) + 1,
        prompt_mask=torch.ones(n, p, dtype=torch.long),
        completion_ids=torch.arange(n * t).view(n, t) + 1,
        completion_mask=torch.ones(n, t, dtype=torch.long),
        group_ids=torch.arange(n) // 2 + offset,
        rewards=torch.arange(n, dtype=torch.float32),
        truncated=torch.zeros(n, dtype=torch.bool),
        policy_version=offset,
        meta={"prompt": [f"p{i}" for i in range(n)]},
    )


# -- the table policy: a free logit per (row, position, token) ------------------------------------

TABLE_VOCAB = 5  # vocabulary of the table policy


class TablePolicy:
    """``HFPolicy.completion_logprobs`` over a free logit table [rows, T, V]: row r of a batch
    is looked up by its first prompt token, so a micro-batch or a selection of a batch sees
    the same parameters as the whole batch did."""

    def __init__(self, rows: int, width: int, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(rows, width, TABLE_VOCAB, generator=g))

    def parameters(self):
        return iter([self.table])

    def distribution(self, batch):
        return self.table[batch.prompt_ids[:, 0]][:, : batch.completion_ids.shape[1]].log_softmax(-1)

    def completion_logprobs(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids=None,
                            temperature=1.0, with_entropy=False):
        logp_all = (self.table[prompt_ids[:, 0]][:, : completion_ids.shape[1]] / temperature).log_softmax(-1)
        logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        return logp, entropy


def table_batch(n: int = 6, t: int = 5, seed: int = 0, truncated=None):
    """n rows with right padding (row 0 full, every row at least one token) and random,
    nonzero per-token advantages."""

    from reasonrl.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[0] = t
    mask = (torch.arange(t) < lengths[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.arange(n)[:, None], prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.randint(0, TABLE_VOCAB, (n, t), generator=g) * mask, completion_mask=mask,
        group_ids=torch.arange(n) // 2, rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool) if truncated is None else torch.tensor(truncated),
        advantages=(torch.randn(n, t, generator=g) + 0.1) * mask)


def cfg(kl: float = 0.0, in_reward: bool = False, entropy: float = 0.0, **kw):
    """A LossConfig with a k3 KL of coefficient ``kl`` and an entropy bonus ``entropy``."""
    from reasonrl.config import KLConfig, LossConfig

    return LossConfig(kl=KLConfig(coef=kl, estimator="k3", in_reward=in_reward), entropy_coef=entropy, **kw)


def loss_and_grad(policy, batch, config, tot, skip_zero_advantage: bool = False):
    """The micro-batch loss of a TablePolicy on ``batch``, its stats and the table's gradient."""
    from reasonrl.train.objective import micro_batch_loss

    policy.table.grad = None
    loss, stats = micro_batch_loss(policy, batch, config, tot, 1.0, True, skip_zero_advantage=skip_zero_advantage)
    loss.backward()
    return loss.detach(), stats, policy.table.grad.clone()


# -- sampling: scripted, spied on, checked -------------------------------------------------------

def joined(s):
    """The prompt and completion ids (and masks) of samples ``s``, side by side."""

    return torch.cat([s.prompt_ids, s.completion_ids], 1), torch.cat([s.prompt_mask, s.completion_mask], 1)


def assert_every_masked_token_was_sampled(pol, samples, stop, atol=2e-5):
    """The completion mask covers exactly the tokens the sampler drew, for each way a row can end:
    at EOS, at a stop string, at the token budget. Returns how many rows ended each way."""

    eos = pol.tokenizer.eos_token_id
    budget = samples.completion_ids.shape[1]
    ids, mask = joined(samples)
    logp, _ = pol.token_logprobs(ids, mask, budget, temperature=1.0)
    m = samples.completion_mask.bool()
    # Sampling and scoring agree on every token that counts: none of them is a padding token the
    # model never drew (its sampling log-prob would be 0, its scoring log-prob anything).
    torch.testing.assert_close(logp[m], samples.sample_logprobs[m], atol=atol, rtol=1e-5)
    assert (samples.sample_logprobs[m] < 0).all()
    ends = {"eos": 0, "stop": 0, "budget": 0}
    for row, k, trunc in zip(samples.completion_ids, samples.completion_mask.sum(-1).tolist(), samples.truncated):
        tokens = row[:k]
        assert k >= 1 and not (tokens[:-1] == eos).any()  # no EOS inside a completion
        text = pol.tokenizer.decode(tokens, skip_special_tokens=True)
        if tokens[-1] == eos:
            ends["eos"] += 1
            assert not trunc
        elif stop and any(text.endswith(s) for s in stop):
            ends["stop"] += 1
            assert not trunc
            # The stop string is completed by the last masked token, not before it.
            before = pol.tokenizer.decode(tokens[:-1], skip_special_tokens=True)
            assert not any(s in before for s in stop)
        else:
            ends["budget"] += 1
            assert trunc and k == budget
    return ends


def scripted(turns: list[str], tok, seen: list):
    """A stand-in for ``sample_completions`` that writes ``turns`` in order, one per call (every
    row the same), recording the contexts it was given."""
    calls = iter(turns)

    def sample(model, tokenizer, ids, mask, g, max_new_tokens, *args, **kwargs):
        seen.append([row[m.bool()].tolist() for row, m in zip(ids, mask)])
        text = next(calls)
        t = tokenizer(text, add_special_tokens=False)["input_ids"]
        eos = text.endswith("</s>")
        if eos:
            t = tokenizer(text[:-4], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        n = len(ids)
        row = torch.tensor(t[:max_new_tokens])
        return Samples(prompt_ids=ids, prompt_mask=mask, completion_ids=row.repeat(n, 1),
                       completion_mask=torch.ones(n, len(row), dtype=torch.long),
                       sample_logprobs=torch.full((n, len(row)), -0.5), truncated=torch.full((n,), False),
                       texts=[text] * n)
    return sample


def spy_on_sampling(monkeypatch) -> list:
    """Record (context ids, drawn tokens) for every row of every turn the episode sampler samples."""
    import reasonrl.policy.hf as hf_policy  # the module whose sample_completions an episode turn calls

    drawn = []
    real = hf_policy.sample_completions

    def spy(model, tokenizer, ids, mask, *args, **kwargs):
        out = real(model, tokenizer, ids, mask, *args, **kwargs)
        for row, m, c, cm in zip(ids, mask, out.completion_ids, out.completion_mask):
            drawn.append((row[m.bool()].tolist(), c[cm.bool()].tolist()))
        return out

    monkeypatch.setattr(hf_policy, "sample_completions", spy)
    return drawn


def assert_trained_ids_were_sampled(policy, s, drawn, atol=1e-4) -> dict[str, int]:
    """Every run of model tokens in the episodes ``s`` is what the sampler drew after exactly the
    ids before it; teacher-forced log-probs of the batch equal the sampling log-probs there; EOS
    only ends a row. Returns how many rows re-tokenising would have changed, and the turns seen."""

    tok = policy.tokenizer
    merged = turns = 0
    for i in range(len(s.texts)):
        m = int(s.completion_mask[i].sum())
        prompt = s.prompt_ids[i][s.prompt_mask[i].bool()].tolist()
        ids, loss = s.completion_ids[i, :m].tolist(), s.loss_mask[i, :m].tolist()
        assert tok.eos_token_id not in ids[:-1] and not s.completion_mask[i, m:].any()
        retokenised = tok(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
        merged += retokenised != [t for t in ids if t != tok.eos_token_id]
        t = 0
        while t < m:
            if not loss[t]:
                t += 1
                continue
            end = next((u for u in range(t, m) if not loss[u]), m)
            assert ids[t:end] in [d[:end - t] for ctx, d in drawn if ctx == prompt + ids[:t]]
            turns += 1
            t = end
    policy.model.eval()
    with torch.no_grad():
        lp = policy.completion_logprobs(s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)[0]
    torch.testing.assert_close(lp * s.loss_mask, s.sample_logprobs, atol=atol, rtol=atol)
    return {"merged": merged, "turns": turns}


# -- a local OpenAI chat-completions server --------------------------------------------------------

class Stub:
    """A local OpenAI chat-completions server: records each request; ``status``, ``reply`` and
    ``delay_s`` say how it answers (``fail_first``: that many 503s first)."""

    def __init__(self, status=200, reply="The answer is 472.", delay_s=0.0, fail_first=0):
        import json
        import threading
        import time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.status, self.reply, self.delay_s, self.fail_first = status, reply, delay_s, fail_first
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((self.path, dict(self.headers), body))
                time.sleep(stub.delay_s)
                status = 503 if len(stub.requests) <= stub.fail_first else stub.status
                out = (json.dumps({"choices": [{"message": {"role": "assistant", "content": stub.reply}}]})
                       if status == 200 else json.dumps({"error": {"message": "model overloaded"}})).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# -- FSG-RL: the function_graph task's problems and solutions -------------------------------------

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PENS = build_problem(KINDS["pens"], {"a": 3, "b": 4, "c": 5})  # 3 boxes of 4 pens, 5 lost: 7 left
IDS = ["main", "f1", "f2"]
RIGHT = "<main>def main():return f2(f1(3,4),5)#12;7</main><f1>def f1(a,b):return a*b</f1><f2>def f2(x,c):return x-c</f2>"
WRONG_F2 = RIGHT.replace("x-c", "x+c").replace("#12;7", "#12;17")  # the careless solution: consistent, wrong
BAD_TAG = RIGHT.replace("</main>", "</mian>")


def fsg_batch(tok, problem, completions, groups):
    """A RolloutBatch of ``completions`` (each + EOS) to ``problem`` in ``groups``, rewards 9."""

    from reasonrl.batch import RolloutBatch

    ids = [tok(c)["input_ids"] + [tok.eos_token_id] for c in completions]
    width = max(map(len, ids))
    comp = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        comp[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    prompt = torch.tensor([tok(problem.prompt)["input_ids"]] * len(ids))
    return RolloutBatch(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), completion_ids=comp,
                        completion_mask=mask, group_ids=torch.tensor(groups), rewards=torch.full((len(ids),), 9.0),
                        truncated=torch.zeros(len(ids), dtype=torch.bool),
                        meta={"completion": completions, "problem": [problem] * len(ids)})


class FSGPolicy:
    """The policy ``FSGVerifier.setup`` needs: only its tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


def fsg_scripted_samples(monkeypatch):
    """Sampling returns the reference solution for even rows and the careless one for odd rows,
    so two steps on a mini model exercise the sandbox, the span map and the span advantage."""

    from reasonrl.rollout import collect

    original = collect.sample_problems

    def scripted(policy, problems, g, *args, **kwargs):
        s = original(policy, problems, g, *args, **kwargs)
        tok = policy.tokenizer
        texts = [p.solution if i % 2 == 0 else build_problem(KINDS[p.meta["form"]], p.meta["values"], careless=True).solution
                 for p in problems for i in range(g)]
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
        width = max(map(len, ids))
        s.completion_ids = torch.full((len(ids), width), tok.pad_token_id)
        s.completion_mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, row in enumerate(ids):
            s.completion_ids[i, :len(row)], s.completion_mask[i, :len(row)] = torch.tensor(row), 1
        s.sample_logprobs = torch.zeros(len(ids), width)
        s.truncated = torch.zeros(len(ids), dtype=torch.bool)
        s.texts = texts
        return s

    monkeypatch.setattr(collect, "sample_problems", scripted)


@contextmanager
def registered(**fns):
    """Register reward functions under test-only names, and remove them afterwards."""
    for name, fn in fns.items():
        REWARDS._items[name] = fn
    try:
        yield
    finally:
        for name in fns:
            del REWARDS._items[name]


def assert_shared_pass_equals_row_pass(pol: HFPolicy, s, groups, **kw):
    """``pol.completion_logprobs`` on samples ``s`` with ``group_ids=groups`` (the shared paths;
    ``kw`` e.g. ``length_buckets``) against the row-by-row pass: log-probs and entropies on the
    mask, and the gradients of Σ logp. Returns the shared pass's (log-probs, entropies)."""
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    results = []
    for group_ids in (None, groups):
        pol.model.zero_grad(set_to_none=True)
        logp, ent = pol.completion_logprobs(*args, group_ids=group_ids, temperature=0.8, with_entropy=True,
                                            **(kw if group_ids is not None else {}))
        (logp * s.completion_mask).sum().backward()
        results.append((logp.detach(), ent.detach(), [p.grad.clone() for p in pol.parameters()]))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    m = s.completion_mask.bool()
    torch.testing.assert_close(lp_b[m], lp_a[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b[m], ent_a[m], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    return lp_b, ent_b


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer and chat template (ChatML, pad == EOS); skip where
    it is not installed."""
    from transformers import AutoTokenizer

    from reasonrl.policy.loading import resolve_model_path

    try:
        folder = resolve_model_path("smollm2-135m", None, "float32", None)
    except Exception as exc:  # noqa: BLE001 — no GGUF here
        pytest.skip(f"SmolLM2 is not installed: {exc}")
    return AutoTokenizer.from_pretrained(folder)


def char_ids(tok, text: str) -> list[int]:
    """``text`` as one token per character: ids the tokenizer would never produce for it."""
    return [tok.convert_tokens_to_ids(tok.tokenize(c)[0]) for c in text]


class Scripted:
    """A sampler (what ``PolicyServer`` serves) whose reply to a context is
    ``reply(context_text)``, sampled as one id per character, then EOS (``eos=False``: cut at
    ``max_new_tokens`` instead). Records every call's contexts and temperature."""

    def __init__(self, tok, reply, eos=True, delay=0.0, fail=False):
        self.tokenizer, self.reply, self.eos, self.delay, self.fail = tok, reply, eos, delay, fail
        self.calls: list[list[list[int]]] = []
        self.temperatures: list[float] = []

    def encode_prompts(self, prompts):
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
        return enc["input_ids"], enc["attention_mask"]

    def sample_ids(self, ids, mask, max_new_tokens, temperature=1.0, generator=None, stop=None, refresh=None):
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("the model fell over")
        contexts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        self.calls.append(contexts)
        self.temperatures.append(temperature)
        rows = []
        for c in contexts:
            r = char_ids(self.tokenizer, self.reply(self.tokenizer.decode(c)))
            rows.append(torch.tensor((r + [self.tokenizer.eos_token_id] if self.eos else r)[:max_new_tokens]))
        out, cmask = right_pad(rows, self.tokenizer.pad_token_id)
        logps = -0.01 * torch.arange(1, out.shape[1] + 1, dtype=torch.float).expand_as(out) * cmask
        return Samples(prompt_ids=ids, prompt_mask=mask, completion_ids=out, completion_mask=cmask,
                       sample_logprobs=logps, truncated=torch.tensor([len(r) >= max_new_tokens for r in rows]),
                       texts=[self.tokenizer.decode(r, skip_special_tokens=True) for r in rows])
