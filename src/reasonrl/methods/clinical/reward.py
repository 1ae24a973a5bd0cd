"""The clinical soft verifier's reward terms and metrics (https://arxiv.org/abs/2610.06360,
Tanna & Jindal, "Ontology Concept Overlap as a Training Signal: Knowledge-Grounded Reinforcement
Learning for Clinical Question Answering"). The abstract and Fig. 1 caption are verified; the term
weights' mapping, the judge normalisation and the consistency penalty are INFERRED.

    R(y) = α·J̃(y) + β·F1_CUI(y, y*) − γ·P_cons(y),   α = 0.6, β = 0.3, γ = 0.1        (Eq. 1)

In a recipe the three terms are three pieces that add up to Eq. 1 (``docs/methods/clinical_verifier.md``)::

    rewards:
      - {name: concept_f1, weight: 0.3}              # β·F1_CUI   (this module)
      - {name: consistency_penalty, weight: -0.1}    # −γ·P_cons  (this module)
    methods:
      - {name: clinical_judge, weight: 0.6, judge: {...a model section...}}   # α·J̃ (methods.clinical_judge)

The judge is a method, not a reward function, because it runs a frozen model: in the training
process, batched, on the policy's device (a reward function runs in a forked CPU worker).

Metrics (SQuAD's normalisation: lower case, no punctuation, no articles): ``exact_match`` (EM) and
``token_f1`` are rewards too, so ``eval.reward: exact_match`` makes the greedy eval accuracy EM, and
weight-0 entries log them during training; the ``clinical_qa`` task's ``group_metrics`` reports both
and the concept F1 under ``eval.n``.
"""

from __future__ import annotations

import importlib.util
import re
import string
from collections import Counter
from typing import Annotated, Literal, Optional, Sequence

from reasonrl.params import Range
from reasonrl.registry import REWARDS
from reasonrl.rewards.ontology import OntologyUnavailable, ScispacyLinker, get_vocabulary
from reasonrl.problem import Problem

__all__ = ["set_f1", "concept_f1", "repeated_ngram_fraction", "padding_penalty", "consistency_penalty",
           "composite", "normalise_answer", "exact_match", "token_f1", "PAPER_WEIGHTS", "DEFAULT_FILLERS"]

PAPER_WEIGHTS = {"alpha": 0.6, "beta": 0.3, "gamma": 0.1}
# Boilerplate that pads an answer without content (INFERRED: the spec names "filler, boilerplate").
DEFAULT_FILLERS = ("as an ai", "i hope this helps", "it is important to note", "please consult",
                   "in conclusion", "i am not a doctor", "let me know if")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def set_f1(predicted: set, reference: set) -> float:
    """P = |C∩C*|/|C|, R = |C∩C*|/|C*|, F1 = 2PR/(P+R); 0 when either set is empty (the spec's)."""
    hit = len(predicted & reference)
    if not predicted or not reference or not hit:
        return 0.0
    p, r = hit / len(predicted), hit / len(reference)
    return 2 * p * r / (p + r)


_LINKERS: dict[tuple, ScispacyLinker] = {}  # per worker process: the pipeline loads once


def _extractor(linker: str, vocabulary: str, max_code_chars: int, kb_dir: str | None, threshold: float):
    if linker == "dictionary":
        return get_vocabulary(vocabulary, max_code_chars)
    key = (kb_dir, threshold)
    if key not in _LINKERS:
        _LINKERS[key] = ScispacyLinker(kb_dir, threshold=threshold)
    return _LINKERS[key]


@REWARDS.register("concept_f1")
def concept_f1(completion: str, problem: Problem, *, vocabulary: Optional[Literal["builtin", "icd10cm"]] = None,
               linker: Literal["dictionary", "scispacy"] = "dictionary",
               max_code_chars: Annotated[int, Range(ge=3, le=8)] = 5, codes: bool = True,
               kb_dir: str | None = None, threshold: Annotated[float, Range(ge=0, le=1)] = 0.8, **_) -> float:
    """F1_CUI(y, y*) = set F1 (:func:`set_f1`) of the concepts the completion names and those of the
    reference ``problem.answer`` (arXiv 2610.06360 Eq. 1's β term). Concepts come from
    ``linker: dictionary`` (longest-match over ``vocabulary``'s terms and synonyms, ICD-10-CM codes as
    concept ids: ``rewards.ontology``) or ``linker: scispacy`` (the paper's UMLS CUIs, only where
    scispaCy's knowledge base is in ``kb_dir``: never downloaded). ``vocabulary: null`` takes the
    problem's ``meta["vocabulary"]`` (the ``clinical_qa`` task's), else ``icd10cm``. When the
    problem's ``meta["concepts"]`` come from the same vocabulary they are the reference's concepts
    (the task knows them exactly); otherwise the reference text is read like the completion."""
    meta = problem.meta or {}
    if linker == "dictionary" and vocabulary is None:  # the task's vocabulary: "builtin" or "icd10cm-<chars>"
        vocabulary, _, chars = str(meta.get("vocabulary", "icd10cm")).partition("-")
        max_code_chars = int(chars) if chars.isdigit() else max_code_chars
    extract = _extractor(linker, vocabulary or "icd10cm", max_code_chars, kb_dir, threshold)
    same = meta.get("concepts") is not None and meta.get("vocabulary") == getattr(extract, "name", None)
    reference = set(meta["concepts"]) if same else extract.extract(problem.answer, codes)
    return set_f1(extract.extract(completion, codes), reference)


def _check_concept_params(vocabulary: str | None = None, linker: str = "dictionary", kb_dir: str | None = None,
                          **_) -> None:
    """At recipe load: the vocabulary's package or the linker's files must be here (never fetched)."""
    if linker == "scispacy":
        ScispacyLinker.check(kb_dir)
    elif vocabulary == "icd10cm" and importlib.util.find_spec("simple_icd_10_cm") is None:
        raise OntologyUnavailable("concept_f1's vocabulary 'icd10cm' needs the simple-icd-10-cm package (pip install "
                                  "'reasonrl[clinical]'); or set vocabulary: builtin")


concept_f1.check_params = _check_concept_params


def repeated_ngram_fraction(words: Sequence[str], n: int) -> float:
    """rep_n = 1 − |distinct n-grams| / |n-grams|: the share of n-grams that repeat an earlier
    one (0 for fewer than n words)."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def padding_penalty(text: str, max_words: int, fillers: Sequence[str] = DEFAULT_FILLERS) -> float:
    """pad = (words inside filler phrases)/(words) + max(0, words − max_words)/max_words (INFERRED)."""
    words = normalise_answer(text).split()
    if not words:
        return 0.0
    joined = " " + " ".join(words) + " "
    filler = sum(joined.count(" " + " ".join(normalise_answer(f).split()) + " ") * len(normalise_answer(f).split())
                 for f in fillers)
    return min(filler, len(words)) / len(words) + max(0, len(words) - max_words) / max_words


@REWARDS.register("consistency_penalty")
def consistency_penalty(completion: str, problem: Problem, *, n: Annotated[int, Range(ge=1)] = 3,
                        max_words: Annotated[int, Range(ge=1)] = 64, fillers: list[str] | None = None,
                        **_) -> float:
    """P_cons = clip(rep_n(y) + pad(y), 0, 1) (INFERRED from the abstract): repeated n-grams
    (:func:`repeated_ngram_fraction` over SQuAD-normalised words) plus filler and length beyond
    ``max_words`` (:func:`padding_penalty`). A penalty in [0, 1]: give it a negative weight (−γ)."""
    words = normalise_answer(completion).split()
    pad = padding_penalty(completion, max_words, DEFAULT_FILLERS if fillers is None else fillers)
    return min(1.0, max(0.0, repeated_ngram_fraction(words, n) + pad))


def composite(judge: float, f1: float, penalty: float, alpha: float = 0.6, beta: float = 0.3,
              gamma: float = 0.1) -> float:
    """R = α·J̃ + β·F1_CUI − γ·P_cons (Eq. 1 of arXiv 2610.06360, the paper's weights by default)."""
    return alpha * judge + beta * f1 - gamma * penalty


# -- metrics: EM and Token-F1 (the paper's MedQA/PubMedQA numbers) -----------------------------------

def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def _answer_text(completion: str) -> str:
    # A few-shot completion may run on to a new question: the answer is its first line.
    return completion.strip().split("\n", 1)[0]


@REWARDS.register("exact_match")
def exact_match(completion: str, problem: Problem, **_) -> float:
    """EM: 1.0 when the completion's first line equals the reference after :func:`normalise_answer`."""
    return float(normalise_answer(_answer_text(completion)) == normalise_answer(problem.answer))


@REWARDS.register("token_f1")
def token_f1(completion: str, problem: Problem, **_) -> float:
    """SQuAD Token-F1 of the completion's first line against the reference: the F1 of their
    normalised word multisets (1.0 when both are empty)."""
    pred, gold = normalise_answer(_answer_text(completion)).split(), normalise_answer(problem.answer).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if not common:
        return 0.0
    p, r = common / len(pred), common / len(gold)
    return 2 * p * r / (p + r)
