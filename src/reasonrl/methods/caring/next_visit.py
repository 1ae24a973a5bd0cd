"""A next-visit-style multi-label task over ICD-10-CM, with semantic IDs (CARing, spec §8).

Synthetic patients whose codes follow the hierarchy (the source's data, MIMIC next-visit ICD
sets, needs a licence). The labels are the vocabulary's subcategories that have a parent
category in it (``I21.0`` under ``I21``); a *family* is a category with at least two of them.
A patient draws 1..``max_families`` families; per family, a history H of 1..min(2, n−1) of its
children. The next visit's gold set is, per family, every successor (the next child in code
order, cyclically) of a history code not itself in H, plus, with probability
``extra_fraction``, one other child not in H. So Y is never empty, is learnable from the
history (successors), and has real multi-label breadth (the random extra).

``label_format``: ``sid`` writes labels (in prompts and answers) as semantic IDs
(``reasonrl.methods.caring.semantic_ids``), ``code`` as the plain ICD code (the baseline).
``sid_style``: ``char`` writes one SID token as ONE character (level l, code k →
``chr(0x100 + l·K + k)``, Latin Extended-A), so the embedded character-level model has one
token per level with no tokenizer change; ``token`` writes ``<a_i><b_j><c_k>``, the tokens
``reasonrl.methods.caring.sid_tokens.add_sid_tokens`` adds to a Hugging Face tokenizer.
``prompt_style``: ``compact`` (``label,label;``, for the embedded model's 64 positions) or
``text`` (sentences with the descriptions, for SmolLM2).

``warmup_problems`` is the multi-task alignment mix (spec §8 (b) step 2, "T5 50%, four
auxiliary tasks at 10% each" in the source; ours: history → ID with weight ``align_fraction``,
the rest split between code → ID and ID → code): the embedded model's warm-up imitates it, and
``reasonrl.methods.caring.sid_tokens.alignment_sft`` runs it through ``train.sft`` on any model.
"""

from __future__ import annotations

import functools
import random
import warnings
from dataclasses import dataclass, field
from typing import Annotated, Literal

from reasonrl.params import Range
from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import split_draws

__all__ = ["NextVisitTask", "label_space", "CHAR_BASE"]

CHAR_BASE = 0x100  # first character of the char-style SID alphabet


@functools.lru_cache(maxsize=8)
def label_space(vocabulary: str, prefixes: tuple[str, ...], max_code_chars: int) -> tuple[dict, dict, dict]:
    """(names, families, paths): the labels' descriptions, family → sorted children, and each
    label's embedding text "Disease: {title}\\nICD-10-CM ontology path: {path}" (the source's
    template). The vocabulary is ``rewards.ontology``'s (builtin excerpt or simple-icd-10-cm)."""
    from reasonrl.rewards.ontology import get_vocabulary

    vocab = get_vocabulary(vocabulary, max_code_chars)
    kids = {c: p for c, p in vocab.parents.items() if not prefixes or c.startswith(prefixes)}
    families: dict[str, list[str]] = {}
    for c, p in kids.items():
        families.setdefault(p, []).append(c)
    families = {p: sorted(cs) for p, cs in sorted(families.items()) if len(cs) >= 2}
    labels = sorted(c for cs in families.values() for c in cs)
    if len(labels) < 2:
        raise ValueError(f"prefixes {list(prefixes)} leave {len(labels)} labels in vocabulary '{vocabulary}'; "
                         "need a category with at least two subcategories")
    names = {c: vocab.names[c] for c in labels}
    paths = {c: f"Disease: {names[c]}\nICD-10-CM ontology path: {' > '.join(_ancestry(c, vocab))}" for c in labels}
    return names, families, paths


def _ancestry(code: str, vocab) -> list[str]:
    """Descriptions from the chapter down to ``code`` (chapter and block from simple-icd-10-cm
    when it is installed; else the vocabulary's own parent chain)."""
    chain = [code]
    while chain[-1] in vocab.parents:
        chain.append(vocab.parents[chain[-1]])
    out = [vocab.names[c] for c in reversed(chain)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import simple_icd_10_cm as cm
            if cm.is_valid_item(chain[-1]):
                out = [cm.get_description(a) for a in reversed(cm.get_ancestors(chain[-1]))] + out
    except ImportError:
        pass
    return out


@functools.lru_cache(maxsize=8)
def _semantic_ids(vocabulary, prefixes, max_code_chars, levels, codes, dim, seed):
    from reasonrl.methods.caring.semantic_ids import build_semantic_ids

    names, _, paths = label_space(vocabulary, prefixes, max_code_chars)
    labels = sorted(names)
    ids, stats = build_semantic_ids([paths[c] for c in labels], levels, codes, dim, seed)
    return {c: tuple(int(x) for x in row) for c, row in zip(labels, ids.tolist())}, stats


@TASKS.register("next_visit")
@dataclass
class NextVisitTask:
    """Predict one ICD label of a synthetic patient's next visit; see the module docstring."""

    vocabulary: Literal["builtin", "icd10cm"] = "builtin"
    prefixes: list[str] = field(default_factory=list)
    """Code prefixes kept (e.g. [I2, E1, J4]); empty keeps every code of the vocabulary."""
    max_code_chars: Annotated[int, Range(ge=4, le=8)] = 5
    label_format: Literal["sid", "code"] = "sid"
    sid_style: Literal["char", "token"] = "char"
    prompt_style: Literal["compact", "text"] = "compact"
    levels: Annotated[int, Range(ge=1, le=8, why="codebooks L")] = 3
    codes: Annotated[int, Range(ge=2, le=256, why="codes per codebook K")] = 8
    embed_dim: Annotated[int, Range(ge=2)] = 32
    sid_seed: int = 0
    max_families: Annotated[int, Range(ge=1)] = 2
    extra_fraction: Annotated[float, Range(ge=0, le=1)] = 0.5
    align_fraction: Annotated[float, Range(gt=0, le=1, why="share of history → ID in the warm-up mix")] = 0.5
    eval_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.1
    name: str = "next_visit"

    def __post_init__(self) -> None:
        if self.sid_style == "char" and self.levels * self.codes > 0x180:
            raise ValueError(f"sid_style 'char' has {0x180} characters; levels * codes = {self.levels * self.codes}")
        self.names, self.families, self.paths = label_space(self.vocabulary, tuple(self.prefixes), self.max_code_chars)
        self.codes_list = sorted(self.names)
        if len(self.codes_list) > self.codes ** self.levels:
            raise ValueError(f"{len(self.codes_list)} labels do not fit codes ** levels = {self.codes ** self.levels} "
                             "semantic IDs; raise task.codes or task.levels")
        self.sid_codes, self.sid_stats = _semantic_ids(self.vocabulary, tuple(self.prefixes), self.max_code_chars,
                                                       self.levels, self.codes, self.embed_dim, self.sid_seed)
        self.sid_of = {c: self.render_sid(t) for c, t in self.sid_codes.items()}
        self.code_of = {s: c for c, s in self.sid_of.items()}
        self.family_of = {c: p for p, cs in self.families.items() for c in cs}
        chars = {ch for c in self.codes_list for ch in c + self.sid_of[c]} | set(",;:=?>")
        if self.prompt_style == "text":
            chars |= {ch for p in self.prompts_text_sample() for ch in p}
        self.alphabet = "".join(sorted(chars))
        """Every character prompts and solutions use (the embedded model's vocabulary)."""

    # -- labels ---------------------------------------------------------------------------------
    def render_sid(self, code_tuple: tuple[int, ...]) -> str:
        if self.sid_style == "char":
            return "".join(chr(CHAR_BASE + level * self.codes + k) for level, k in enumerate(code_tuple))
        from reasonrl.methods.caring.semantic_ids import sid_token

        return "".join(sid_token(level, k) for level, k in enumerate(code_tuple))

    def sid_vocabulary(self) -> list[str]:
        """Every SID token (char style: one character each) that a tokenizer must hold."""
        if self.sid_style == "char":
            return [chr(CHAR_BASE + i) for i in range(self.levels * self.codes)]
        from reasonrl.methods.caring.semantic_ids import sid_tokens

        return sid_tokens(self.levels, self.codes)

    def label(self, code: str) -> str:
        """The label as written in this task (its SID or the code itself)."""
        return self.sid_of[code] if self.label_format == "sid" else code

    def valid_labels(self) -> list[str]:
        """Every label a completion may name (what a constrained decoder's trie holds)."""
        return [self.label(c) for c in self.codes_list]

    def to_code(self, label: str) -> str | None:
        return self.code_of.get(label) if self.label_format == "sid" else (label if label in self.names else None)

    # -- problems -------------------------------------------------------------------------------
    def _patient(self, rng: random.Random) -> tuple[list[str], list[str]]:
        fams = rng.sample(sorted(self.families), min(len(self.families), rng.randint(1, self.max_families)))
        history, gold = [], set()
        for f in fams:
            kids = self.families[f]
            h = rng.sample(kids, rng.randint(1, min(2, len(kids) - 1)))
            history += h
            gold |= {kids[(kids.index(x) + 1) % len(kids)] for x in h} - set(h)
            rest = [k for k in kids if k not in h and k not in gold]
            if rest and rng.random() < self.extra_fraction:
                gold.add(rng.choice(rest))
        rng.shuffle(history)
        return history, sorted(gold)

    def _prompt(self, history: list[str]) -> str:
        if self.prompt_style == "compact":
            return ",".join(self.label(c) for c in history) + ";"
        lines = "\n".join(f"- {self.label(c)} ({self.names[c]})" for c in history)
        return (f"Past diagnoses of the patient:\n{lines}\nName one diagnosis of the patient's next visit, "
                f"as {'a semantic ID' if self.label_format == 'sid' else 'an ICD-10-CM code'}.\nAnswer:")

    def prompts_text_sample(self) -> list[str]:
        return [self._prompt([c]) for c in self.codes_list] + [self._align_prompt(c, d) for c in self.codes_list
                                                               for d in ("to_id", "to_code")]

    def _draw(self, rng: random.Random) -> Problem:
        history, gold = self._patient(rng)
        labels = tuple(self.label(c) for c in gold)
        return Problem(prompt=self._prompt(history), answer=",".join(labels), solution=labels[0],
                       meta={"labels": labels, "codes": tuple(gold), "history": tuple(history),
                             "num_labels": len(labels)})

    def _stream(self, rng: random.Random, count: int, split: str) -> list[Problem]:
        return split_draws(lambda: self._draw(rng), count, split == "eval", self.eval_fraction,
                           "next_visit", "raise eval_fraction or widen prefixes")

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        return self._stream(random.Random(f"{seed}:{step}"), count, "train")

    def eval_problems(self, count: int) -> list[Problem]:
        return self._stream(random.Random("next_visit-eval"), count, "eval")

    # -- the alignment mix (warm-up / stage-1 SFT) -----------------------------------------------
    def _align_prompt(self, code: str, direction: str) -> str:
        if self.prompt_style == "compact":
            return f"={code}>" if direction == "to_id" else f"?{self.sid_of[code]}>"
        if direction == "to_id":
            return f"ICD-10-CM {code} ({self.names[code]}) has the semantic ID:"
        return f"The semantic ID {self.sid_of[code]} is the ICD-10-CM code:"

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """The alignment mix: history → one gold label (uniformly among Y) with probability
        ``align_fraction``; else (``sid`` format only) code → SID or SID → code, half each."""
        rng = random.Random(f"warmup:{seed}:{step}")
        out = []
        for p in self._stream(rng, count, "train"):
            if self.label_format == "code" or rng.random() < self.align_fraction:
                out.append(Problem(p.prompt, p.answer, rng.choice(p.meta["labels"]), p.meta))
                continue
            code = rng.choice(self.codes_list)
            direction = rng.choice(("to_id", "to_code"))
            target = self.sid_of[code] if direction == "to_id" else code
            out.append(Problem(self._align_prompt(code, direction), target, target, {"align": direction}))
        return out

    # -- evaluation -------------------------------------------------------------------------------
    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The named label when it is a valid one of the vocabulary, else None."""
        text = completion.strip()
        return text if self.to_code(text) is not None else None

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Quality of one group of k free (unconstrained) samples:

        - ``recall_at_k``: |∪ correct labels named| / |Y|;
        - ``hit_rate``: fraction naming a gold label;
        - ``invalid_rate``: fraction naming no valid label of the vocabulary (what the trie removes).
        """
        if not completions:
            raise ValueError("group_metrics needs at least one completion")
        gold = set(problem.meta["labels"])
        named = [self.extract_answer(c, problem) for c in completions]
        correct = {x for x in named if x in gold}
        return {"recall_at_k": len(correct) / len(gold),
                "hit_rate": sum(x in gold for x in named) / len(named),
                "invalid_rate": sum(x is None for x in named) / len(named)}
