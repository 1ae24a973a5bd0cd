"""Learned rewards: a sequence-classification reward model (``reward_model``) and an LLM judge
behind an OpenAI-compatible endpoint (``llm_judge``), as TRL's ``reward_funcs`` with a model,
verl's ``reward_model`` and OpenRLHF's remote reward model have them.

Both run like every reward function: in the scorer's worker processes, under the reward's
``timeout_s``, so a slow, dead or confused model scores 0 for the rows it fails and counts a
failure (``reward_failures/<name>``) — it never stops or hangs the run.

``reward_model`` scores the G completions of a prompt in one batch (a group reward). The model
is loaded once per worker (``workers: N`` gives it N) and kept; ``device: auto`` is this
machine's GPU when it has one. Its score is one logit (``label``: which one, for a model with
several), normalised as ``normalize`` says:

    none:     r = (z − shift) / scale
    sigmoid:  r = σ((z − shift) / scale)          (in (0, 1): a Bradley–Terry preference probability)
    tanh:     r = tanh((z − shift) / scale)       (in (−1, 1))

The text it reads is ``prompt + completion`` (``template: plain``), or the model tokenizer's
chat template over a user turn (the prompt) and an assistant turn (the completion) (``template:
chat``).

``llm_judge`` asks an OpenAI-compatible endpoint to grade each completion with ``rubric``, a
prompt template with ``{question}``, ``{answer}`` (the reference) and ``{completion}``. The
score is the last number after ``score_prefix`` in the reply (``SCORE: 7``), divided by
``max_score`` and clipped to [0, 1]. A reply without one is a parse failure: it scores 0 and is
counted (the reward raises, the scorer records it). Each request has ``request_timeout_s`` and
``retries`` (the shared client, ``reasonrl.isolation.openai_chat``); keep ``(retries + 1) ·
request_timeout_s`` under the reward's ``timeout_s``. Replies are cached by request (in the
worker, and in ``cache_path``, a JSON-lines file, across runs and resumes), so the same completion
is never judged twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from reasonrl.isolation.openai_chat import EndpointError, check_endpoint, post_chat, read_api_key
from reasonrl.params import Range
from reasonrl.problem import Problem
from reasonrl.registry import REWARDS
from reasonrl.rewards.scorer import group_reward

__all__ = ["llm_judge", "reward_model", "parse_score", "DEFAULT_RUBRIC"]

DEFAULT_RUBRIC = (
    "You grade a student's answer to a question.\n\nQuestion:\n{question}\n\nReference answer:\n{answer}\n\n"
    "Student's answer:\n{completion}\n\nIs the student's final answer correct and its reasoning sound? "
    "Reply with one line of justification, then a line 'SCORE: N' with N from 0 to 10.")

_MODELS: dict[str, Any] = {}  # per worker: (model, tokenizer, device) by folder, device and dtype
_CACHE: dict[str, str] = {}  # per worker: judge replies by request
_CACHE_LOCK = threading.Lock()


def _normalise(z: float, normalize: str, shift: float, scale: float) -> float:
    x = (z - shift) / scale
    if normalize == "sigmoid":
        return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    if normalize == "tanh":
        return math.tanh(x)
    return x


def _load(path: str, device: str, dtype: str):
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    key = json.dumps([str(Path(path).resolve()), device, dtype])
    if key not in _MODELS:
        if not Path(path).is_dir():
            raise FileNotFoundError(f"reward_model: path {path!r} is not a model folder")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        if tok.pad_token_id is None:  # a batch needs padding; a causal LM's tokenizer may have none
            tok.pad_token = tok.eos_token
        model.config.pad_token_id = tok.pad_token_id
        _MODELS[key] = (model, tok, device)
    return _MODELS[key]


@REWARDS.register("reward_model")
@group_reward
def reward_model(completions: list[str], problem: Problem, *, num_tokens: list[int], truncated: list[bool],
                 path: str, label: Annotated[int, Range(ge=0)] = 0,
                 normalize: Literal["none", "sigmoid", "tanh"] = "none",
                 shift: float = 0.0, scale: Annotated[float, Range(gt=0)] = 1.0,
                 template: Literal["plain", "chat"] = "plain", max_length: Annotated[int, Range(ge=1)] = 2048,
                 device: str = "cpu", dtype: Literal["float32", "bfloat16", "float16"] = "float32",
                 **_) -> list[float]:
    """Score a group's completions with the sequence-classification model in folder ``path``:
    logit ``label`` of each ``prompt + completion``, normalised (module docstring)."""
    model, tok, dev = _load(path, device, dtype)
    if template == "chat":
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"reward_model: template is chat but the tokenizer in {path} has no chat template")
        texts = [tok.apply_chat_template([{"role": "user", "content": problem.prompt}, {"role": "assistant", "content": c}],
                                         tokenize=False) for c in completions]
        enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length, add_special_tokens=False)
    else:
        enc = tok([problem.prompt + c for c in completions], return_tensors="pt", padding=True, truncation=True,
                  max_length=max_length)
    with torch.no_grad():
        logits = model(**{k: v.to(dev) for k, v in enc.items()}).logits.float()
    if label >= logits.shape[-1]:
        raise ValueError(f"reward_model: label {label} but the model in {path} has {logits.shape[-1]} output(s)")
    return [_normalise(float(z), normalize, shift, scale) for z in logits[:, label].cpu()]


def parse_score(reply: str, prefix: str = "SCORE:") -> float | None:
    """The last number after ``prefix`` (case-insensitive) in ``reply``; None when there is none."""
    found = re.findall(re.escape(prefix) + r"\s*\**\s*(-?\d+(?:\.\d+)?)", reply, flags=re.IGNORECASE)
    return float(found[-1]) if found else None


def _cached(key: str, cache_path: str | None) -> str | None:
    with _CACHE_LOCK:
        if not _CACHE and cache_path and os.path.isfile(cache_path):
            with open(cache_path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                        _CACHE[entry["key"]] = entry["reply"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut by a crash mid-write: ignored, that request is asked again
        return _CACHE.get(key)


def _remember(key: str, reply: str, cache_path: str | None) -> None:
    with _CACHE_LOCK:
        _CACHE[key] = reply
        if cache_path:
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            with open(cache_path, "a", encoding="utf-8") as f:  # one line per write: a crash cuts at most the last
                f.write(json.dumps({"key": key, "reply": reply}) + "\n")


@REWARDS.register("llm_judge")
def llm_judge(completion: str, problem: Problem, *, base_url: str | None = None, model: str | None = None,
              rubric: str = DEFAULT_RUBRIC, max_score: Annotated[float, Range(gt=0)] = 10.0,
              score_prefix: str = "SCORE:", api_key_env: str | None = None,
              request_timeout_s: Annotated[float, Range(gt=0)] = 20.0, retries: Annotated[int, Range(ge=0)] = 1,
              retry_wait_s: Annotated[float, Range(ge=0)] = 0.5, temperature: Annotated[float, Range(ge=0)] = 0.0,
              max_tokens: Annotated[int, Range(ge=1)] = 256, cache_path: str | None = None, **_) -> float:
    """``score / max_score`` clipped to [0, 1], the score parsed from the judge's reply to ``rubric``
    (module docstring). No score in the reply, or a failed request: raises (0 and a failure)."""
    check_endpoint(base_url, model, "llm_judge", "rewards[llm_judge]")
    try:
        prompt = rubric.format(question=problem.prompt, answer=problem.answer, completion=completion)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"llm_judge: rubric has a field other than {{question}}, {{answer}}, {{completion}}: {exc}") from None
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": temperature,
            "max_tokens": max_tokens}
    key = hashlib.sha256(json.dumps([base_url, body], sort_keys=True).encode()).hexdigest()
    reply = _cached(key, cache_path)
    if reply is None:
        api_key = read_api_key(api_key_env, "llm_judge", "rewards[llm_judge]")
        reply = post_chat(base_url.rstrip("/") + "/chat/completions", body, api_key=api_key, timeout_s=request_timeout_s,
                          retries=retries, retry_wait_s=retry_wait_s, who="llm_judge", error=EndpointError)
        _remember(key, reply, cache_path)
    score = parse_score(reply, score_prefix)
    if score is None:
        raise ValueError(f"llm_judge: no '{score_prefix} N' in the judge's reply: {reply[:200]!r}")
    return min(1.0, max(0.0, score / max_score))
