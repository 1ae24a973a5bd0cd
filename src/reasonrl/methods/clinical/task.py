"""A small clinical-style QA task built from a controlled vocabulary, so it runs offline: the test
bed of the clinical soft verifier (``rewards.clinical``; https://arxiv.org/abs/2610.06360).

Every question is made from the vocabulary's codes, names, synonyms and hierarchy
(``rewards.ontology``: ``builtin`` or ICD-10-CM), in four forms (``problem.meta["form"]``)::

    children  Q: Which conditions are subtypes of Angina pectoris?   A: Unstable angina; Angina pectoris with documented spasm
    parent    Q: Unstable angina is a subtype of which condition?    A: Angina pectoris
    synonym   Q: What is the standard term for heart attack?         A: Acute myocardial infarction
    code      Q: Which ICD-10-CM code is Acute appendicitis?         A: K35

``problem.meta["concepts"]`` holds the reference's concept ids (what ``concept_f1`` compares with).
A prompt is ``shots`` worked questions of the training split and the question, ending in ``A:``;
a completion is cut at the first new line (``stop_strings``), as few-shot prompts need for a base
model such as SmolLM2. Train/eval split: by a stable hash of the question (``tasks.base.in_eval_split``),
so no held-out question is ever trained on; the few-shot examples come from the training split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from reasonrl.registry import TASKS
from reasonrl.methods.clinical.reward import exact_match, normalise_answer, set_f1, token_f1
from reasonrl.rewards.ontology import Vocabulary, get_vocabulary
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

FORMS = ("children", "parent", "synonym", "code")
HEADER = "Answer each clinical question in one line.\n\n"


def questions(vocab: Vocabulary, forms: tuple[str, ...], max_children: int) -> list[tuple[str, str, str, tuple]]:
    """Every (form, question, answer, concept ids) the vocabulary gives, in a stable order."""
    out = []
    for code, name in vocab.names.items():
        kids = vocab.children(code) if "children" in forms else []
        if 2 <= len(kids) <= max_children:
            out.append(("children", f"Which conditions are subtypes of {name}?",
                        "; ".join(vocab.names[k] for k in kids), tuple(kids)))
        if "parent" in forms and code in vocab.parents:
            parent = vocab.parents[code]
            out.append(("parent", f"{name} is a subtype of which condition?", vocab.names[parent], (parent,)))
        if "synonym" in forms:
            for syn in vocab.synonyms.get(code, []):
                # A synonym that other codes' terms would also match is ambiguous as a question.
                if vocab.extract(syn, codes=False) == {code} and syn.lower() != name.lower():
                    out.append(("synonym", f"What is the standard term for {syn}?", name, (code,)))
        if "code" in forms:
            out.append(("code", f"Which ICD-10-CM code is {name}?", code, (code,)))
    return out


@TASKS.register("clinical_qa")
@dataclass
class ClinicalQATask:
    """Clinical questions from a controlled vocabulary; see the module docstring."""

    vocabulary: Literal["builtin", "icd10cm"] = "builtin"
    max_code_chars: int = 5
    forms: tuple[str, ...] = FORMS
    max_children: int = 6
    shots: int = 2
    eval_fraction: float = 0.2
    name: str = "clinical_qa"
    stop_strings: list[str] = field(default_factory=lambda: ["\n"])

    def __post_init__(self) -> None:
        self.forms = tuple(self.forms)
        unknown = [f for f in self.forms if f not in FORMS]
        if unknown or not self.forms:
            raise ValueError(f"task.forms must be a non-empty list of {list(FORMS)}, got {list(self.forms)}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if not 0 <= self.shots <= 8:
            raise ValueError(f"task.shots must be in 0..8, got {self.shots}")
        if self.max_children < 2:
            raise ValueError(f"task.max_children must be >= 2, got {self.max_children}")
        self.vocab = get_vocabulary(self.vocabulary, self.max_code_chars)
        rows = questions(self.vocab, self.forms, self.max_children)
        self.pools = {"train": [r for r in rows if not in_eval_split(r[1], self.eval_fraction)],
                      "eval": [r for r in rows if in_eval_split(r[1], self.eval_fraction)]}
        if len(self.pools["train"]) <= self.shots or not self.pools["eval"]:
            raise ValueError(f"task 'clinical_qa': vocabulary '{self.vocabulary}' with forms {list(self.forms)} gives "
                             f"{len(self.pools['train'])} training and {len(self.pools['eval'])} eval questions; "
                             "add forms or change eval_fraction")

    @property
    def alphabet(self) -> str:
        """Every character of the prompts and answers (the tiny model's vocabulary)."""
        text = HEADER + "Q: A:\n" + "".join(q + a for _, q, a, _ in self.pools["train"] + self.pools["eval"])
        return "".join(sorted(set(text)))

    def _problem(self, row: tuple, rng: random.Random) -> Problem:
        form, question, answer, concepts = row
        shots = [s for s in rng.sample(self.pools["train"], min(len(self.pools["train"]), self.shots + 1))
                 if s[1] != question][: self.shots]
        prompt = HEADER + "".join(f"Q: {q}\nA: {a}\n\n" for _, q, a, _ in shots) + f"Q: {question}\nA:"
        return Problem(prompt=prompt, answer=answer, solution=" " + answer,
                       meta={"form": form, "question": question, "concepts": list(concepts),
                             "vocabulary": self.vocab.name})

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"clinical_qa:{seed}:{step}")
        return [self._problem(rng.choice(self.pools["train"]), rng) for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        rng = random.Random("clinical_qa-eval")
        pool = self.pools["eval"][:]
        rng.shuffle(pool)
        if count > len(pool):
            raise ValueError(f"task 'clinical_qa' has {len(pool)} eval questions, {count} asked for")
        return [self._problem(row, rng) for row in pool[:count]]

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems to imitate (``solution`` = the reference answer)."""
        return self.train_problems(step, count, seed + 10_000)

    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The normalised first line, for majority voting (None when empty)."""
        return normalise_answer(completion.strip().split("\n", 1)[0]) or None

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Means over the k samples: ``exact_match``, ``token_f1`` and ``concept_f1`` (the dictionary
        concepts of the first line against ``meta["concepts"]``)."""
        if not completions:
            raise ValueError("group_metrics needs at least one completion")
        gold = set(problem.meta["concepts"])
        k = len(completions)
        return {"exact_match": sum(exact_match(c, problem) for c in completions) / k,
                "token_f1": sum(token_f1(c, problem) for c in completions) / k,
                "concept_f1": sum(set_f1(self.vocab.extract(c.strip().split("\n", 1)[0]), gold)
                                  for c in completions) / k}
