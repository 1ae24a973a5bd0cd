"""Does the ontology term catch entity substitutions? (docs/methods/clinical_verifier.md)

A hand-made set of clinical answers, each with a reference, a correct answer worded differently
(a synonym or a reordering) and an entity substitution (one concept swapped for a near neighbour,
most words kept). Each reward term, and Eq. 1's composite, ranks the pair: the pairwise accuracy is
the share of items where the correct answer outscores the substitution (a tie counts 1/2).

    python benchmarks/clinical_ablation.py                        # the reward functions only
    python benchmarks/clinical_ablation.py --judge smollm2-135m   # and the frozen judge (hf backend)

The claim (arXiv 2610.06360's ablation, "the ontology term is worth 3 EM points") predicts
concept_f1 near 1 and token_f1 near or below 1/2 here; the judge alone depends on the judge model.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from reasonrl.methods.clinical.reward import PAPER_WEIGHTS, concept_f1, consistency_penalty, token_f1
from reasonrl.problem import Problem

# (reference, correct but worded otherwise, entity substitution), in the builtin vocabulary's terms.
ITEMS = [
    ("Non-ST elevation myocardial infarction", "NSTEMI", "ST elevation myocardial infarction of inferior wall"),
    ("Acute myocardial infarction", "Heart attack", "Acute appendicitis"),
    ("Type 2 diabetes mellitus", "Adult-onset diabetes", "Type 1 diabetes mellitus"),
    ("Type 2 diabetes mellitus with kidney complications", "Diabetic nephropathy",
     "Type 2 diabetes mellitus with ophthalmic complications"),
    ("Unstable angina", "Crescendo angina", "Unstable asthma"),
    ("Migraine with aura", "Classical migraine", "Migraine without aura"),
    ("Mild persistent asthma", "Persistent asthma, mild", "Severe persistent asthma"),
    ("Lobar pneumonia", "Pneumonia, lobar", "Bronchopneumonia"),
    ("Essential hypertension", "High blood pressure", "Essential hypotension"),
    ("Fever and cough", "Pyrexia and cough", "Fever and headache"),
    ("Shortness of breath", "Dyspnea", "Shortness of breath and chest pain"),
    ("Urinary tract infection", "UTI", "Urinary tract infection and sepsis"),
]


def pairwise(scores: list[tuple[float, float]]) -> float:
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in scores) / len(scores)


def judge_scores(path: str, problems: list[Problem], texts: list[str]) -> list[float]:
    import torch

    from reasonrl.methods.clinical.method import ClinicalJudge

    judge = ClinicalJudge(judge={"backend": "hf", "path": path} if path != "tiny" else {"backend": "tiny"})
    judge.setup(SimpleNamespace(recipe=SimpleNamespace(train=SimpleNamespace(micro_batch_size=8)),
                                policy=SimpleNamespace(device=torch.device("cpu")), log=lambda m: None))
    return judge.scores(problems, texts)[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", default=None, help="the judge model: an hf path (smollm2-135m) or 'tiny'")
    args = parser.parse_args()
    problems = [Problem(prompt=f"Q: What is the diagnosis?\nA: {r}", answer=r) for r, _, _ in ITEMS]
    good, bad = [g for _, g, _ in ITEMS], [b for _, _, b in ITEMS]
    terms = {"concept_f1": lambda t, p: concept_f1(t, p, vocabulary="builtin"),
             "token_f1": token_f1,
             "-consistency_penalty": lambda t, p: -consistency_penalty(t, p)}
    values = {name: ([fn(t, p) for t, p in zip(good, problems)], [fn(t, p) for t, p in zip(bad, problems)])
              for name, fn in terms.items()}
    if args.judge:
        values["judge"] = (judge_scores(args.judge, problems, good), judge_scores(args.judge, problems, bad))
    w = PAPER_WEIGHTS
    judge = values.get("judge", ([0.0] * len(ITEMS),) * 2)
    values["composite" + ("" if args.judge else " (no judge)")] = tuple(
        [w["alpha"] * j + w["beta"] * f + w["gamma"] * neg_p for j, f, neg_p in
         zip(judge[k], values["concept_f1"][k], values["-consistency_penalty"][k])] for k in (0, 1))
    out = {name: {"pairwise_accuracy": pairwise(list(zip(g, b))), "mean_correct": sum(g) / len(g),
                  "mean_substituted": sum(b) / len(b)} for name, (g, b) in values.items()}
    print(json.dumps({"items": len(ITEMS), "judge": args.judge, "terms": out}, indent=1))


if __name__ == "__main__":
    main()
