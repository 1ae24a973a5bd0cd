"""The clinical soft verifier (arXiv 2610.06360): concept F1 through a controlled vocabulary,
the entropy-normalised judge, the consistency penalty, Eq. 1, EM/Token-F1, and the clinical_qa task."""

from __future__ import annotations

import math
import random

import pytest
import torch

from helpers import MINI_TINY, mini_recipe, straight_and_resumed
from reasonrl.config import ConfigError
from reasonrl.methods.clinical.reward import (composite, concept_f1, consistency_penalty, exact_match, padding_penalty,
                                       repeated_ngram_fraction, set_f1, token_f1)
from reasonrl.methods.clinical.method import ClinicalJudge, entropy_normalised_score
from reasonrl.rewards.ontology import OntologyUnavailable, ScispacyLinker, builtin_vocabulary, term_variants
from reasonrl.problem import Problem
from reasonrl.methods.clinical.task import ClinicalQATask

BUILTIN = {"vocabulary": "builtin"}


def ref(answer: str) -> Problem:
    return Problem(prompt="Q", answer=answer)


# -- concepts ---------------------------------------------------------------------------------------

def test_term_variants_drop_parentheses_and_trailing_qualifiers():
    assert term_variants("Essential (primary) hypertension") == {("essential", "primary", "hypertension"),
                                                                 ("essential", "hypertension")}
    assert term_variants("Fever, unspecified") == {("fever", "unspecified"), ("fever",)}
    assert term_variants("Other") == set()  # a generic word is never a concept


def test_synonyms_case_punctuation_and_longest_match():
    v = builtin_vocabulary()
    assert v.extract("HEART-ATTACK; high blood pressure!") == {"I21", "I10"}
    # One mention, the longest term: not E11 ("type 2 diabetes mellitus") inside it.
    assert v.extract("type 2 diabetes mellitus with kidney complications") == {"E11.2"}
    assert v.extract("NSTEMI") == {"I21.4"}
    assert v.extract("coded as I21.4") == {"I21.4"} and v.extract("coded as I21.4", codes=False) == set()
    assert v.extract("nothing clinical here") == set()


def test_concept_f1_by_hand():
    # C(y*) = {I21, I10}; C(y) = {I21 (a synonym), I10 (a synonym), R50.9}: P = 2/3, R = 1, F1 = 0.8.
    r = ref("Acute myocardial infarction; Essential hypertension")
    assert concept_f1("heart attack, high blood pressure and pyrexia", r, **BUILTIN) == pytest.approx(0.8)
    assert concept_f1("cardiac infarction and essential (primary) hypertension", r, **BUILTIN) == 1.0
    assert concept_f1("I do not know", r, **BUILTIN) == 0.0  # an empty C(y)
    assert set_f1({"a"}, set()) == 0.0 and set_f1({"a", "b"}, {"b", "c", "d"}) == pytest.approx(0.4)


def test_concept_f1_uses_the_tasks_concepts_and_vocabulary():
    p = Problem("Q", "whatever text", meta={"concepts": ["K35"], "vocabulary": "builtin"})
    assert concept_f1("appendicitis", p) == 1.0  # vocabulary null: the problem's


def test_the_ontology_term_separates_entity_substitutions_that_token_f1_rewards():
    # Substituting one entity keeps most words (Token-F1 high) but names another concept (F1_CUI 0);
    # a synonym shares no words (Token-F1 0) but names the same concept (F1_CUI 1).
    r = ref("Non-ST elevation myocardial infarction")
    swapped, synonym = "ST elevation myocardial infarction of inferior wall", "NSTEMI"
    # SQuAD words: {nonst, elevation, myocardial, infarction} vs 7 words, 3 common: P = 3/7, R = 3/4.
    assert token_f1(swapped, r) == pytest.approx(18 / 33)
    assert concept_f1(swapped, r, **BUILTIN) == 0.0
    assert token_f1(synonym, r) == 0.0 and concept_f1(synonym, r, **BUILTIN) == 1.0


def test_scispacy_is_never_downloaded_and_says_what_is_missing(tmp_path):
    with pytest.raises(OntologyUnavailable, match="scispacy|kb_dir"):
        ScispacyLinker.check(str(tmp_path))
    with pytest.raises(ConfigError, match="scispacy|kb_dir"):
        mini_recipe(rewards=[{"name": "concept_f1", "params": {"linker": "scispacy"}}])
    with pytest.raises(ConfigError, match="vocabulary"):
        mini_recipe(rewards=[{"name": "concept_f1", "params": {"vocabulary": "snomed"}}])


def test_icd10cm_vocabulary_from_the_package():
    pytest.importorskip("simple_icd_10_cm")
    from reasonrl.rewards.ontology import icd10cm_vocabulary

    v = icd10cm_vocabulary(5)
    assert v.names["K35"] == "Acute appendicitis" and v.parents["I21.4"] == "I21"
    assert v.extract("Acute appendicitis with fever, unspecified") == {"K35", "R50.9"}
    assert v.extract("cardiac infarction") == {"I21"}  # an ICD "includes" note as a synonym
    assert concept_f1("unstable angina", ref("Unstable angina"), vocabulary="icd10cm") == 1.0


# -- consistency penalty ------------------------------------------------------------------------------

def test_repeated_ngrams_and_padding_by_hand():
    # Trigrams of x y z x y z: xyz yzx zxy xyz: 4, 3 distinct: rep_3 = 1/4.
    assert repeated_ngram_fraction("x y z x y z".split(), 3) == pytest.approx(0.25)
    assert repeated_ngram_fraction(["x", "y"], 3) == 0.0
    # 4 filler words of 6, and 6 words against a cap of 4: 4/6 + 2/4.
    assert padding_penalty("Fever. I hope this helps, doctor!", max_words=4) == pytest.approx(4 / 6 + 0.5)
    assert padding_penalty("Fever and cough", max_words=64) == 0.0


def test_consistency_penalty_by_hand():
    text = "fever cough fever cough fever cough"  # trigrams: fcf cfc fcf cfc: rep_3 = 2/4
    assert consistency_penalty(text, ref("x")) == pytest.approx(0.5)
    assert consistency_penalty(text, ref("x"), max_words=4) == 1.0  # 0.5 + (6 − 4)/4, clipped to 1
    assert consistency_penalty("Acute appendicitis", ref("x")) == 0.0


# -- the judge ----------------------------------------------------------------------------------------

def test_entropy_normalised_judge_by_hand():
    # Uniform over 5 levels: E = 3 → 0.5, H = log 5 → shrunk to 0.
    j, e, h = entropy_normalised_score(torch.zeros(1, 5))
    assert e.item() == pytest.approx(0.5) and h.item() == pytest.approx(1.0) and j.item() == pytest.approx(0.0)
    # K = 2, p = (1/4, 3/4): E = 1.75 → 0.75; H = −(¼ log ¼ + ¾ log ¾) / log 2 = 0.811278.
    j, e, h = entropy_normalised_score(torch.tensor([[0.0, math.log(3.0)]]))
    h_ref = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) / math.log(2)
    assert e.item() == pytest.approx(0.75) and h.item() == pytest.approx(h_ref, abs=1e-6)
    assert j.item() == pytest.approx(0.75 * (1 - h_ref), abs=1e-6)
    # A sure top grade scores 1, a sure bottom grade 0.
    j, _, _ = entropy_normalised_score(torch.tensor([[-1e4, -1e4, 0.0], [0.0, -1e4, -1e4]]))
    assert j.tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


def test_composite_with_the_papers_weights_by_hand():
    assert composite(0.5, 0.8, 0.25) == pytest.approx(0.6 * 0.5 + 0.3 * 0.8 - 0.1 * 0.25)  # 0.515
    assert composite(1.0, 1.0, 0.0) == pytest.approx(0.9)


def _tiny_judge(levels=None):
    from types import SimpleNamespace

    method = ClinicalJudge(judge={"backend": "tiny"}, levels=levels)
    policy = SimpleNamespace(device=torch.device("cpu"))
    recipe = SimpleNamespace(train=SimpleNamespace(micro_batch_size=2))
    method.setup(SimpleNamespace(recipe=recipe, policy=policy, log=lambda m: None))
    return method


def test_judge_reads_the_score_tokens_and_ignores_padding():
    judge = _tiny_judge()  # the embedded tiny model stands in for a judge
    problems = [Problem("2+2=", "4"), Problem("12*(3+4)=", "84")]
    completions = ["4", "####84;####84;1+1=2"]
    # Batched (left-padded, micro-batches of 2) equals one by one: position ids follow the mask.
    together = judge.level_logits(judge.prompts(problems, completions))
    alone = torch.cat([judge.level_logits(judge.prompts([p], [c])) for p, c in zip(problems, completions)])
    assert torch.allclose(together, alone, atol=1e-4)
    # And they are the model's next-token logits of "1".."5" after the prompt.
    prompt = judge.prompts(problems[:1], completions[:1])[0]
    ids = judge.judge.tokenizer(prompt, return_tensors="pt")["input_ids"]
    full = judge.judge.model(input_ids=ids).logits[0, -1]
    assert torch.allclose(together[0], full[judge.level_ids], atol=1e-4)
    with pytest.raises(ValueError, match="levels"):
        _tiny_judge(levels=["10", "20"])  # two characters: two tokens of the tiny tokenizer


def test_judge_adds_alpha_times_its_score_to_the_rewards():
    from reasonrl.batch import RolloutBatch

    judge = _tiny_judge()
    problems, completions = [Problem("1+1=", "2")] * 2, ["2", "3"]
    z = torch.zeros(2, 1, dtype=torch.long)
    batch = RolloutBatch(prompt_ids=z, prompt_mask=z + 1, completion_ids=z, completion_mask=z + 1,
                         group_ids=torch.zeros(2, dtype=torch.long), rewards=torch.tensor([0.3, -0.1]), truncated=torch.zeros(2, dtype=torch.bool),
                         meta={"problem": problems, "completion": completions})
    score, _, _ = judge.scores(problems, completions)
    metrics = judge.annotate(batch, 0)
    assert batch.rewards.tolist() == pytest.approx((torch.tensor([0.3, -0.1]) + 0.6 * score).tolist())
    assert metrics["judge/score"] == pytest.approx(float(score.mean()))


# -- metrics ------------------------------------------------------------------------------------------

def test_token_f1_and_exact_match_by_hand():
    r = ref("Acute myocardial infarction")
    # "the acute infarction." → {acute, infarction}: 2 common, P = 1, R = 2/3, F1 = 0.8.
    assert token_f1("The acute infarction.", r) == pytest.approx(0.8)
    assert exact_match("The acute infarction.", r) == 0.0
    assert exact_match(" acute MYOCARDIAL infarction!\nQ: next", r) == 1.0  # first line, normalised
    assert token_f1("acute myocardial infarction", r) == 1.0 and token_f1("", r) == 0.0


# -- the task -----------------------------------------------------------------------------------------

def test_clinical_qa_task_sample():
    task = ClinicalQATask(shots=1)
    a, b = task.train_problems(3, 4, seed=0), task.train_problems(3, 4, seed=0)
    assert [p.prompt for p in a] == [p.prompt for p in b]  # a pure function of (step, count, seed)
    train_q = {r[1] for r in task.pools["train"]}
    held = task.eval_problems(5)
    assert not train_q & {p.meta["question"] for p in held}  # the split never overlaps
    assert [p.prompt for p in held] == [p.prompt for p in ClinicalQATask(shots=1).eval_problems(5)]
    row = next(r for r in task.pools["train"] + task.pools["eval"]
               if r[1] == "Which conditions are subtypes of Angina pectoris?")
    p = task._problem(row, random.Random(0))
    assert p.answer == "Unstable angina; Angina pectoris with documented spasm"
    assert p.meta["concepts"] == ["I20.0", "I20.1"] and p.prompt.endswith("Q: " + p.meta["question"] + "\nA:")
    assert p.prompt.count("Q: ") == 2  # one worked example
    # group_metrics by hand: EM (1 + 0)/2; Token-F1 (1 + 2·(2/2·2/7)/(1+2/7))/2; concept F1 (1 + 2/3)/2.
    m = task.group_metrics(p, [" Unstable angina; Angina pectoris with documented spasm\nQ:", " Unstable angina"])
    assert m["exact_match"] == 0.5
    assert m["token_f1"] == pytest.approx((1 + 2 * (2 / 7) / (1 + 2 / 7)) / 2)
    assert m["concept_f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert set(task.alphabet) >= set(p.prompt + p.answer)
    with pytest.raises(ValueError, match="forms"):
        ClinicalQATask(forms=["diagnosis"])


def test_questions_by_form():
    task = ClinicalQATask()
    rows = {r[1]: r for r in task.pools["train"] + task.pools["eval"]}
    assert rows["What is the standard term for heart attack?"][2:] == ("Acute myocardial infarction", ("I21",))
    assert rows["Unstable angina is a subtype of which condition?"][2:] == ("Angina pectoris", ("I20",))
    assert rows["Which ICD-10-CM code is Acute appendicitis?"][2:] == ("K35", ("K35",))


# -- a run --------------------------------------------------------------------------------------------

def clinical_recipe(**extra):
    tiny = {**MINI_TINY, "task": "clinical_qa", "task_params": {"shots": 0}}
    return mini_recipe(model={"backend": "tiny", "tiny": tiny}, task={"name": "clinical_qa", "params": {"shots": 0}},
                       rewards=[{"name": "concept_f1", "weight": 0.3}, {"name": "consistency_penalty", "weight": -0.1},
                                {"name": "token_f1", "weight": 0.0}],
                       methods=[{"name": "clinical_judge", "weight": 0.6, "judge": {"backend": "tiny", "tiny": tiny}}],
                       rollout={"num_generations": 4, "max_new_tokens": 16}, eval={"size": 0}, **extra)


def test_a_run_adds_the_judge_and_resumes_exactly(tmp_path, monkeypatch):
    rows = straight_and_resumed(clinical_recipe(train={"steps": 3, "checkpoint_every": 1}), tmp_path, monkeypatch)
    assert len(rows) == 3 and all("judge/score" in r and 0 <= r["judge/score"] <= 1 for r in rows)


def test_the_ablation_set_shows_the_ontology_term_catching_substitutions():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "clinical_ablation.py"
    spec = importlib.util.spec_from_file_location("clinical_ablation", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    problems = [Problem("Q", r) for r, _, _ in bench.ITEMS]
    pairs = {name: [(fn(g, p), fn(b, p)) for (_, g, b), p in zip(bench.ITEMS, problems)]
             for name, fn in {"concept": lambda t, p: concept_f1(t, p, **BUILTIN), "token": token_f1}.items()}
    # 10 of 12 won, 2 tied (a reordered term the dictionary cannot read): 11/12; Token-F1 prefers
    # the substitution on most items.
    assert bench.pairwise(pairs["concept"]) == pytest.approx(11 / 12)
    assert bench.pairwise(pairs["token"]) <= 0.5
