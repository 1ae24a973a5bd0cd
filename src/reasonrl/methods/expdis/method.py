"""``novelty_memory``: the ExpDis explorer's memory of correct solutions, on the method hooks.

Paper: "ExpDis: Exploration–Distillation"; paper not located; formalised from its abstract, confidence INFERRED;
the maths is in ``reasonrl.methods.expdis.advantage``, the round loop in ``reasonrl.methods.expdis.loop`` and the
method page in ``docs/methods/expdis.md``. Named in the recipe's ``methods:`` list together
with the ``novelty`` advantage::

    advantage: {name: novelty, base: grpo, beta: 0.3}     # Â = A^GRPO + β·N(y)·1[R(y)=1]
    methods:
      - name: novelty_memory
        similarity: ngram      # ngram (Jaccard of n-grams) | answer (1/sqrt(1+n(answer))) | embedding
        n: 3                   # n-gram size
        unit: char             # n-grams over characters or words
        expdis: {rounds: 3, explorers: 4, ...}   # the loop's settings (``reasonrl expdis``)

Each step, ``annotate`` computes N(y) of every correct row against the memory M_x of its
prompt as it stood before the batch (so the rows of one batch do not depend on their order),
writes ``batch.aux["novelty"]`` (N for correct rows, 0 otherwise) and
``batch.aux["novelty_correct"]`` (1[R = 1], R the reward ``correct_reward`` — default
``eval.reward`` — equal to 1), then adds the batch's correct rows to M.

Sharing between explorers: M starts from the JSONL files in ``memory_files`` (what earlier
rounds and earlier explorers of this round found; the loop passes them) and every correct row
this run adds is recorded, with its novelty, in ``<run>/novelty_samples.jsonl``: the next
explorer's memory and the filter's input. The run's own additions are in ``state_dict``, so a
resumed explorer has exactly the memory it had, and its record file is rewritten from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import torch

from reasonrl.methods.expdis.advantage import (CORRECT_KEY, NOVELTY_KEY, answer_count_novelty, jaccard, memory_novelty,
                                    ngrams)
from reasonrl.batch import RolloutBatch
from reasonrl.fsutil import atomic_write_text
from reasonrl.dataflow import meta_reward
from reasonrl.hooks import Method, MethodContext
from reasonrl.methods.expdis.settings import settings_from
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["NoveltyMemory", "RECORD_FILE", "read_records", "embedding_available"]

RECORD_FILE = "novelty_samples.jsonl"
KEYS = (NOVELTY_KEY, CORRECT_KEY)


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSONL file written by ``novelty_memory`` (or by the loop's memory merge)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"novelty_memory.memory_files: no such file: {path}")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {i}: not JSON ({exc})") from None
            if not isinstance(rec, dict) or "prompt" not in rec or "completion" not in rec:
                raise ValueError(f"{path}, line {i}: a memory record needs 'prompt' and 'completion'")
            out.append(rec)
    return out


def embedding_available() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


@METHODS.register("novelty_memory")
class NoveltyMemory(Method):
    writes = KEYS

    def __init__(self,
                 similarity: Literal["ngram", "answer", "embedding"] = "ngram",
                 n: Annotated[int, Range(ge=1)] = 3,
                 unit: Literal["char", "word"] = "char",
                 memory_files: Optional[list[str]] = None,
                 record: bool = True,
                 correct_reward: Optional[str] = None,
                 embedding_model: Optional[str] = None,
                 include_group: bool = False,
                 expdis: Optional[dict] = None) -> None:
        """``similarity``: how N(y) is measured: ``ngram`` (1 − max Jaccard of ``n``-grams over
        ``unit``s), ``answer`` (1/sqrt(1 + count of the same final answer in M_x)) or ``embedding``
        (1 − max cosine of sentence embeddings; needs ``sentence_transformers`` and a local model
        folder in ``embedding_model``; nothing is downloaded). ``memory_files``: JSONL records
        (``prompt``, ``completion``, ``pred``) that M starts from. ``record``: write this run's
        correct rows to ``<run>/novelty_samples.jsonl``. ``correct_reward``: the reward whose 1
        means correct (default ``eval.reward``). ``include_group``: also compare each correct row
        with the other correct rows of its prompt in the same batch (symmetric, so still
        independent of row order): G identical solutions then all get N = 0, a lone different one
        a high N; off by default (the spec's M_x is the memory only). ``expdis``: the settings of the ExpDis loop
        (``reasonrl.methods.expdis.settings.ExpDisSettings``), read by ``reasonrl expdis``, not by this method."""
        self.similarity, self.n, self.unit = similarity, n, unit
        self.memory_files = list(memory_files or [])
        self.record, self.correct_reward, self.embedding_model = record, correct_reward, embedding_model
        self.expdis, self.include_group = expdis, include_group
        self.records: list[dict] = []  # this run's additions to M, in order (the resumable state)
        self.memory: dict[str, list[tuple[str, Any, Any]]] = {}  # prompt -> [(text, answer, features)]
        self.run_dir: Path | None = None
        self._synced = False
        self._encoder = None

    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        # Without correct_reward the gate is eval.reward's scores, which the recipe check requires among its rewards.
        reward = (config or {}).get("correct_reward")
        return {"annotate": (KEYS, (meta_reward(reward),) if reward else ())}

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        reward = config.get("correct_reward") or recipe.eval.reward
        names = [r.name for r in recipe.rewards]
        need(reward in names, f"correct_reward '{reward}' (default: eval.reward) must be one of the recipe's "
                              f"rewards ({', '.join(names)}): its value 1 marks a correct solution")
        need(recipe.env is None, "ExpDis's memory works on single-turn completions; remove `env:`")
        if config.get("similarity") == "embedding":
            need(embedding_available(), "similarity 'embedding' needs the sentence_transformers package, which is "
                                        "not installed (nothing is downloaded); use 'ngram' or 'answer'")
            path = config.get("embedding_model")
            need(bool(path) and Path(path).is_dir(),
                 f"similarity 'embedding' needs embedding_model: a local sentence-transformers folder, got {path!r}")
        for f in config.get("memory_files") or []:
            need(Path(f).is_file(), f"memory_files: no such file: {f}")
        if config.get("expdis") is not None:
            try:
                settings_from(config["expdis"])
            except ValueError as exc:
                need(False, str(exc))

    # -- set-up -------------------------------------------------------------
    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.evaluate.evaluator import answer_extractor

        self.run_dir = ctx.run_dir
        self.reward_key = f"reward/{self.correct_reward or ctx.recipe.eval.reward}"
        self.extract = answer_extractor(self.correct_reward or ctx.recipe.eval.reward, ctx.task)
        if self.similarity == "embedding":
            from sentence_transformers import SentenceTransformer

            self._encoder = SentenceTransformer(self.embedding_model, device="cpu", local_files_only=True)
        self.memory = {}
        for path in self.memory_files:
            for rec in read_records(path):
                self._remember(rec)

    def _features(self, text: str) -> Any:
        if self.similarity == "ngram":
            return ngrams(text, self.n, self.unit)
        if self.similarity == "embedding":
            emb = self._encoder.encode([text], convert_to_tensor=True, normalize_embeddings=True)
            return emb[0].float().cpu()
        return None

    def _remember(self, rec: dict) -> None:
        self.memory.setdefault(rec["prompt"], []).append(
            (rec["completion"], rec.get("pred"), self._features(rec["completion"])))

    def novelty_of(self, prompt: str, text: str, answer: Any, siblings: list | None = None) -> float:
        """N(y) of ``text`` for ``prompt`` against the memory as it stands (plus ``siblings``,
        ``(text, answer, features)`` entries of the same batch, with ``include_group``)."""
        entries = self.memory.get(prompt, []) + (siblings or [])
        if self.similarity == "answer":
            return answer_count_novelty(answer, (a for _, a, _ in entries))
        feats = self._features(text)
        if self.similarity == "ngram":
            return memory_novelty(jaccard(feats, f) for _, _, f in entries)
        return memory_novelty(float(torch.dot(feats, f)) for _, _, f in entries)

    # -- the hooks ------------------------------------------------------------
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if self.reward_key not in batch.meta:
            raise ValueError(f"novelty_memory: the batch has no '{self.reward_key}' scores; name that reward "
                             "in the recipe's rewards or set correct_reward")
        correct = [float(v) == 1.0 for v in batch.meta[self.reward_key]]
        prompts, texts = batch.meta["prompt"], batch.meta["completion"]
        problems = batch.meta.get("problem", [None] * len(batch))
        preds = [self.extract(t, p) if c else None for t, p, c in zip(texts, problems, correct)]
        siblings: list[list | None] = [None] * len(batch)
        if self.include_group:  # the other correct rows of the same prompt in this batch
            entries = [(y, a, self._features(y)) if c else None for y, a, c in zip(texts, preds, correct)]
            siblings = [[entries[j] for j in range(len(batch)) if j != i and correct[j] and prompts[j] == prompts[i]]
                        for i in range(len(batch))]
        values = [self.novelty_of(x, y, a, sib) if c else 0.0
                  for x, y, a, c, sib in zip(prompts, texts, preds, correct, siblings)]
        batch.aux[NOVELTY_KEY] = torch.tensor(values, dtype=torch.float32)
        batch.aux[CORRECT_KEY] = torch.tensor(correct, dtype=torch.float32)
        seen = {(x, y) for x, entries in self.memory.items() for y, _, _ in entries} if any(correct) else set()
        new = []
        lengths = batch.completion_mask.sum(-1).tolist()
        for i in (i for i, c in enumerate(correct) if c):
            ids = batch.completion_ids[i, :int(lengths[i])].tolist()
            new.append({"prompt": prompts[i], "completion": texts[i], "completion_ids": ids,
                        "answer": str(batch.meta["answer"][i]) if "answer" in batch.meta else None,
                        "pred": preds[i], "novelty": values[i], "correct": True, "step": step,
                        "truncated": bool(batch.truncated[i]), "tokens": len(ids)})
        distinct = len({(r["prompt"], r["completion"]) for r in new} - seen)
        for rec in new:
            self._remember(rec)
        self.records.extend(new)
        self._write(new)
        n_correct = len(new)
        return {"novelty/correct_rows": float(n_correct),
                "novelty/mean": sum(values) / n_correct if n_correct else 0.0,
                "novelty/new_distinct": float(distinct),
                "novelty/memory_size": float(sum(len(v) for v in self.memory.values()))}

    def _write(self, new: list[dict]) -> None:
        if not self.record or self.run_dir is None:
            return
        path = self.run_dir / RECORD_FILE
        if not self._synced:  # a fresh run, or the first step after a resume: the file is the state
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in self.records))
            self._synced = True
            return
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in new)

    def state_dict(self) -> dict[str, Any]:
        return {"records": [dict(r) for r in self.records]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = [dict(r) for r in state.get("records", [])]
        for rec in self.records:
            self._remember(rec)
        self._synced = False
        self._write([])  # lines written after the checkpoint are dropped
