"""FSG-RL end to end on the embedded model (github.com/ZihanLiummyycc/FSG-RL; docs/methods/fsg_rl.md): the
function_graph task, span parsing, the verifier's scores and R / R_n by hand (default λ), the
span map, containment of hostile code, the recipes."""

import string

import pytest
import torch

from reasonrl.methods.fsg.advantage import SPAN_IDS_KEY, SPAN_REWARDS_KEY, fsg_span
from reasonrl.config import load_recipe
from reasonrl.methods.fsg.method import FSGVerifier, consensus
from reasonrl.params import ConfigError
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.registry import REWARDS
from reasonrl.methods.fsg.execute import verify
from reasonrl.methods.fsg.parse import code_policy_violation, parse_completion, signature_matches, stated_answer
from reasonrl.isolation.sandbox import SandboxPool
from reasonrl.methods.fsg.task import ALPHABET, KINDS, FunctionGraphTask, build_problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import (BAD_TAG, IDS, MINI_TINY, PENS, RECIPES, RIGHT, WRONG_F2, FSGPolicy, fsg_batch,
                     fsg_scripted_samples)

MISSING_F2 = "<main>def main():return f2(f1(3,4),5)#12;7</main><f1>def f1(a,b):return a*b</f1>"
HOSTILE = RIGHT.replace("return a*b", "import os;os.system('touch /tmp/x');return a*b")


def test_the_task_problems_are_consistent_and_reference_solutions_pass_their_own_tests():
    task = FunctionGraphTask()
    train, held_out = task.train_problems(0, 64, 1), task.eval_problems(60)
    assert train == task.train_problems(0, 64, 1) and not {p.prompt for p in train} & {p.prompt for p in held_out}
    problems = [p for k in KINDS for p in FunctionGraphTask(kinds=[k]).train_problems(0, 2, 7)] + held_out[:4]
    careless = [build_problem(KINDS[p.meta["form"]], p.meta["values"], careless=True) for p in problems]
    for p in problems + train:
        graph = p.meta["graph"]
        parsed = parse_completion(p.solution, [n["id"] for n in graph["nodes"]])
        assert parsed.exact and parsed.answer == p.answer and p.solution.startswith("<main>def main():return f")
        assert len(p.prompt) + len(p.solution) + 1 <= 256  # prompt + solution + EOS within the recipe's positions
        assert set(p.prompt + p.solution) <= set(ALPHABET) and "expected" not in p.prompt
        assert [line.split(":")[0] for line in p.prompt.splitlines()[:-1]] == [n["signature"] for n in graph["nodes"]]
        assert p.prompt.splitlines()[-1] == KINDS[p.meta["form"]].text.format(**p.meta["values"])
        assert graph["edges"][-1] == {"source": graph["nodes"][-1]["id"], "target": "main", "relation": "aggregates_result"}
    with SandboxPool(2) as pool:
        verdicts = verify([p.solution for p in problems] + [c.solution for c in careless], problems + problems, pool=pool)
    for v in verdicts[:len(problems)]:
        assert v.full_success and v.executable and v.back == 1.0 and not v.sandbox_failed
    mistaken = 0
    for v, c, p in zip(verdicts[len(problems):], careless, problems):
        if c.solution == p.solution:
            continue  # this problem's mistake had no natural value: the warm-up writes it correctly
        mistaken += 1
        assert v.fmt == 1.0 and v.executable and v.back == 1.0 and v.final == 0.0 and min(v.unit) < 1.0
    assert mistaken > 0, "no careless solution differs from the reference: the verdicts on mistakes went unchecked"


def test_the_warmup_mixes_in_careless_solutions_and_rejects_bad_settings():
    task = FunctionGraphTask(careless_fraction=0.5)
    warm = task.warmup_problems(0, 64, 0)
    wrong = [p for p in warm if parse_completion(p.solution, [n["id"] for n in p.meta["graph"]["nodes"]]).answer != p.answer]
    assert 10 < len(wrong) < 50
    for p in FunctionGraphTask(careless_fraction=0.0).warmup_problems(0, 32, 0):
        assert parse_completion(p.solution, [n["id"] for n in p.meta["graph"]["nodes"]]).answer == p.answer
    assert {p.meta["form"] for p in FunctionGraphTask(kinds=["pens"]).train_problems(0, 8, 0)} == {"pens"}
    with pytest.raises(ValueError, match="task.kinds"):
        FunctionGraphTask(kinds=["pen"])
    with pytest.raises(ValueError, match="careless_fraction"):
        FunctionGraphTask(careless_fraction=2.0)


@pytest.mark.parametrize("text, exact, spans, answer", [
    (RIGHT, True, IDS, "7"),
    (WRONG_F2, True, IDS, "17"),               # one node wrong: the format is still exact
    (BAD_TAG, False, ["f1", "f2"], None),      # a misspelt closing tag: main has no span
    (MISSING_F2, False, ["f1", "main"], "7"),  # a missing node
    ("<f1>x</f1><main>z#1</main><f2>y</f2>", False, IDS, "1"),  # out of order
    ("note" + RIGHT, False, IDS, "7"),           # text outside the spans
    (RIGHT.replace("<f2>def f2(x,c):return x-c</f2>", "<f2> </f2>"), False, IDS, "7"),  # an empty span
    (RIGHT + "\n", True, IDS, "7"),              # whitespace outside is allowed
])
def test_parsing_spans_and_the_format_gate(text, exact, spans, answer):
    parsed = parse_completion(text, IDS)
    assert parsed.exact is exact and sorted(parsed.spans) == sorted(spans) and parsed.answer == answer
    for span in parsed.spans.values():
        assert text[span.start:span.end] == span.text


def test_signatures_stated_answers_and_the_code_policy():
    assert signature_matches("def f1(a,b):return a*b", "f1(a,b)")
    assert not signature_matches("def f1(b,a):return a*b", "f1(a,b)")
    assert not signature_matches("def f1(a,b,c):return a*b", "f1(a,b)")
    assert not signature_matches("f1=lambda a,b:a*b", "f1(a,b)") and not signature_matches("def f1(a,b:", "f1(a,b)")
    assert not signature_matches("def f1(a,b):return 1\ndef f1(a,b):return 2", "f1(a,b)")
    assert stated_answer("def main():return 7#12;7") == "7" and stated_answer("return 7 # 7 ") == "7"
    assert stated_answer("def main():return 7") is None and stated_answer("return 7#x") is None
    for ok in ("def f(a,b):return a*b", "import math\ndef f(x,c):return math.floor(x/c)", "def f(a,b):return a**2"):
        assert code_policy_violation(ok) is None, ok
    for bad, why in (("import os", "import"), ("def f(a):return __import__('os')", "_"), ("def f(a):return open('x')", "open"),
                     ("def f(a):return ().__class__", "attribute"), ("def f(a):\n try:\n  return a\n except:\n  return 0", "Try"),
                     ("def f(a,b):return a**b", "exponent"), ("import math\nmath.pi=3", "attribute"),
                     ("def f(a):return eval('1')", "eval"), ("def f(a):return 10**10**9", "exponent"), ("def f(:", "syntax")):
        assert why in (code_policy_violation(bad) or ""), bad


def test_the_verifiers_scores_and_rewards_by_hand():
    completions = [RIGHT, WRONG_F2, BAD_TAG, MISSING_F2, HOSTILE]
    verdicts = verify(completions, [PENS] * 5)
    right, wrong, bad, missing, hostile = verdicts
    assert (right.sig, right.exec, right.unit, right.prop, right.edges) == ([1.0] * 3, [1.0] * 3, [1.0] * 3, [0.0, 1.0, 1.0], [1.0, 1.0])
    assert right.full_success and right.final == right.back == 1.0 and right.value == 7
    # The careless f2 (x+c) runs but fails its 3 unit tests and its property; main's own test (with the
    # reference helpers) passes; the program returns 17 = the stated answer (back = 1), not 7.
    assert wrong.exec == [1.0] * 3 and wrong.unit == [1.0, 1.0, 0.0] and wrong.prop == [0.0, 1.0, 0.0]
    assert (wrong.final, wrong.back, wrong.edges, wrong.full_success) == (0.0, 1.0, [1.0, 1.0], False)
    assert bad.fmt == 0.0 and missing.fmt == 0.0 and missing.sig == [1.0, 1.0, 0.0] and missing.back == 0.0
    # The hostile node is refused by the code policy, never run: 0 on exec, unit and property.
    assert "os" in hostile.rejected["f1"] and (hostile.exec, hostile.unit, hostile.prop) == ([1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 1.0])
    assert (hostile.final, hostile.back, hostile.edges) == (1.0, 0.0, [0.0, 0.0])  # main() cannot find f1
    parsed = [parse_completion(c, IDS) for c in completions]
    total, spans, _ = FSGVerifier().scores(verdicts, parsed, [PENS] * 5, [0, 1, 2, 3, 4])
    # right:  (0.1 + 0.15) + 1·(0.5 + 0.75 + 0.5 + 0.05) + (1.5 + 0.75)                      = 4.3
    # wrong:  g = 0.25; unit = 2/3, prop = ½: 0.25 + 0.25·(0.5 + 0.5 + 0.25 + 0.05) + 0.75    = 1.325
    # hostile: exec = unit = 2/3, prop = ½, edge = 0: 0.25 + (1/3 + 0.5 + 0.25) + 1.5          = 2.8333
    torch.testing.assert_close(total, torch.tensor([4.3, 1.325, 0.0, 0.0, 0.25 + 13 / 12 + 1.5]))
    # R_f1 = 0.15 + g·(0.5 + 0.75·u + 0.5·p) + ½·(1.5·a + 0.75·b) + ½·g·0.05·e(f1→f2);  R_f2 adds ½·g·0.05·e(f2→main);
    # R_main = 0.15 + g·(0.5 + 0.75·u) + ½·g·0.05·e(f2→main) + 1.5·a + 0.75·b
    want = torch.tensor([[3.675, 3.05, 3.075],  # columns in graph order: main, f1, f2
                         [0.15 + 0.3125 + 0.00625 + 0.75, 0.15 + 0.25 * 1.75 + 0.375 + 0.00625, 0.15 + 0.125 + 0.375 + 0.0125],
                         [0.0, 0.0, 0.0], [0.0, 0.0, 0.0],
                         [0.15 + 1.25 + 1.5, 0.15 + 0.75, 0.15 + 1.75 + 0.75]])
    torch.testing.assert_close(spans, want)


def test_consensus_and_the_efficiency_penalty_enter_r_as_weighted():
    import dataclasses

    right = dataclasses.replace(verify([RIGHT], [PENS])[0], seconds=2.5)
    parsed = [parse_completion(RIGHT, IDS)] * 2
    method = FSGVerifier(lambda_cons=1.0, lambda_eff=0.3)
    total, spans, cons = method.scores([right, right], parsed, [PENS] * 2, [0, 0], num_tokens=[1024, 1024])
    # cons = 1 (the group agrees); eff = (2.5/5 + 3 spans/8 + 1024/2048)/3 = 0.458333
    assert cons == [1.0, 1.0]
    torch.testing.assert_close(total, torch.full((2,), 4.3 + 1.0 - 0.3 * (0.5 + 0.375 + 0.5) / 3))
    torch.testing.assert_close(spans[0], torch.tensor([3.675 + 1.0, 3.05, 3.075]))  # cons credits main only


def test_hostile_code_is_contained_even_past_the_code_policy(tmp_path):
    target = tmp_path / "escaped"
    gadget = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='_wrap_close'][0]"
              f".__init__.__globals__['system']('touch {target}')")
    escape = RIGHT.replace("return a*b", f"return {gadget}")
    shell = RIGHT.replace("return a*b", f"import os;os.system('touch {target}');return a*b")
    loop = RIGHT.replace("def f1(a,b):return a*b", "def f1(a,b):\n while 1:\n  a=a+1")
    verdicts = verify([escape, shell, loop], [PENS] * 3, policy=False, test_timeout_s=0.2)
    assert not target.exists()  # the sandbox's /tmp is its own
    for v in verdicts:  # f1 scores 0 on its tests; the other nodes are untouched
        assert v.unit[1] == 0.0 and v.unit[0] == v.unit[2] == 1.0 and v.back == 0.0 and not v.full_success
    assert verdicts[0].exec[1] == 1.0  # the escape did run, inside the sandbox: containment is the sandbox's
    assert verdicts[1].exec[1] == 0.0 and verdicts[2].exec[1] == 0.0  # import refused, every test timed out
    assert "not allowed" in verify([escape], [PENS])[0].rejected["f1"]  # and the policy refuses it outright


def test_a_rollout_that_hangs_its_sandbox_does_not_zero_its_neighbours():
    hang = RIGHT.replace("return a*b", "return 7**7**9+a*b")  # one C call, out of the alarm's reach
    huge = RIGHT.replace("return a*b", "return sum(range(10**12))+a*b")  # allowed by the policy; range is capped
    hung, right, capped = verify([hang, RIGHT, huge], [PENS] * 3, policy=False, timeout_s=2.0)
    # Its sandbox died, and again alone; main, which ran before the hang, keeps its streamed result.
    assert hung.sandbox_failed and hung.exec == [1.0, 0.0, 0.0] and hung.unit[0] == 1.0
    assert right.full_success and not right.sandbox_failed  # run again on its own
    assert capped.exec == [1.0, 0.0, 1.0] and code_policy_violation(huge.split("<f1>")[1].split("</f1>")[0]) is None


def test_consensus_is_the_groups_agreement_per_node():
    a = parse_completion(RIGHT, IDS)
    b = parse_completion(WRONG_F2, IDS)
    # Group of three: RIGHT, RIGHT, WRONG_F2. f1 agrees everywhere; f2 and main 2/3 for RIGHT, 1/3 for WRONG_F2.
    got = consensus([a, a, b, a], [IDS] * 4, [0, 0, 0, 1])
    assert got[:3] == pytest.approx([(1 + 2 / 3 + 2 / 3) / 3] * 2 + [(1 + 1 / 3 + 1 / 3) / 3]) and got[3] == 1.0


def test_annotate_writes_r_the_span_rewards_and_the_span_map():
    tok = build_char_tokenizer(ALPHABET)
    batch = fsg_batch(tok, PENS, [RIGHT, WRONG_F2, "junk"], [0, 0, 0])
    method = FSGVerifier()
    method.setup(type("Ctx", (), {"policy": FSGPolicy(tok)})())
    metrics = method.annotate(batch, 0)
    torch.testing.assert_close(batch.rewards, torch.tensor([4.3, 1.325, 0.0]))  # replaces the recipe's rewards
    assert batch.aux[SPAN_REWARDS_KEY].shape == (3, 3)
    span_ids = batch.aux[SPAN_IDS_KEY]
    main, f1, f2 = (parse_completion(RIGHT, IDS).spans[n] for n in IDS)
    want = torch.zeros(len(RIGHT) + 1, dtype=torch.long)  # + EOS
    want[main.start:main.end], want[f1.start:f1.end], want[f2.start:f2.end] = 1, 2, 3
    assert span_ids[0, :len(want)].tolist() == want.tolist() and span_ids[0, len(want):].eq(0).all()
    assert RIGHT[f1.start:f1.end] == "def f1(a,b):return a*b" and span_ids[2].eq(0).all()
    assert metrics["fsg/final_accuracy"] == pytest.approx(1 / 3) and metrics["fsg/full_success"] == pytest.approx(1 / 3)
    assert metrics["fsg/format"] == pytest.approx(2 / 3) and metrics["fsg/executable"] == pytest.approx(2 / 3)
    # The span-level advantage on these keys: every f2 token of row 0 gets GroupNorm(R_f2) of the group.
    adv = fsg_span(batch.rewards.unsqueeze(-1) * torch.nn.functional.one_hot(batch.completion_mask.sum(-1) - 1,
                                                                             batch.completion_mask.shape[1]),
                   batch.completion_mask, batch.group_ids, fsg_span_ids=span_ids, fsg_span_rewards=batch.aux[SPAN_REWARDS_KEY])
    r_f2 = batch.aux[SPAN_REWARDS_KEY][:, 2]
    assert adv[0, f2.start].item() == pytest.approx(((r_f2[0] - r_f2.mean()) / r_f2.std(unbiased=False)).item(), rel=1e-5)
    keep = FSGVerifier(reward="add", span_map=False)
    batch = fsg_batch(tok, PENS, [RIGHT], [0])
    keep.annotate(batch, 0)
    assert batch.rewards.item() == pytest.approx(9.0 + 4.3) and not batch.aux


def test_rewards_for_the_recipe_and_evaluation():
    assert REWARDS.get("fsg_answer")(RIGHT, PENS) == 1.0 and REWARDS.get("fsg_answer")(WRONG_F2, PENS) == 0.0
    assert REWARDS.get("fsg_format")(RIGHT, PENS) == 1.0 and REWARDS.get("fsg_format")(BAD_TAG, PENS) == 0.0
    assert REWARDS.get("fsg_full_success")(RIGHT, PENS) == 1.0 and REWARDS.get("fsg_full_success")(WRONG_F2, PENS) == 0.0
    assert FunctionGraphTask().extract_answer(WRONG_F2, PENS) == "17"
    with pytest.raises(ValueError, match="meta\\['graph'\\]"):
        REWARDS.get("fsg_answer")(RIGHT, type(PENS)("p", "1"))


def test_the_data_flow_checks_the_verifier_and_the_span_advantage():
    with pytest.raises(ConfigError, match="fsg_verifier"):
        load_recipe(RECIPES / "fsg_rl.yaml", ["methods=[]"])
    with pytest.raises(ConfigError, match="reward: keep"):
        load_recipe(RECIPES / "fsg_rl.yaml", ["methods=[{name: fsg_verifier, reward: keep}]"])
    with pytest.raises(ConfigError, match="thrown away"):
        load_recipe(RECIPES / "fsg_grpo.yaml", ["methods=[{name: fsg_verifier, reward: keep}]"])
    with pytest.raises(ConfigError, match="lambda_final"):
        load_recipe(RECIPES / "fsg_rl.yaml", ["methods=[{name: fsg_verifier, lambda_final: -1}]"])


@pytest.mark.parametrize("name", ["fsg_rl", "fsg_grpo"])
def test_each_recipe_trains_end_to_end_on_a_mini_model(name, tmp_path, monkeypatch):
    fsg_scripted_samples(monkeypatch)
    overrides = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    overrides += ["train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=4", "eval.size=2",
                  "eval.max_new_tokens=8", "log.plots=false", "log.progress=false"]
    summary = Trainer(load_recipe(RECIPES / f"{name}.yaml", overrides), tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "fsg/format" in r]
    assert summary["steps"] == 2 and len(rows) == 2
    for row in rows:
        assert row["fsg/format"] == 1.0 and row["fsg/executable"] == 1.0 and row["fsg/sandbox_failed"] == 0.0
        assert 0.0 < row["fsg/final_accuracy"] < 1.0 and row["fsg/full_success"] == row["fsg/final_accuracy"]
        assert row["reward/fsg_answer"] == row["fsg/final_accuracy"] and torch.isfinite(torch.tensor(row["loss"]))


def test_the_recipes_share_the_task_model_and_budget():
    rl, base = load_recipe(RECIPES / "fsg_rl.yaml"), load_recipe(RECIPES / "fsg_grpo.yaml")
    assert rl.advantage.name == "fsg_span" and base.advantage.name == "grpo" and [r.name for r in base.rewards] == ["fsg_answer"]
    assert rl.model == base.model and rl.task == base.task and rl.rollout == base.rollout and rl.loss == base.loss
    assert rl.loss.kl.coef == 0.03 and rl.loss.kl.estimator == "k3" and rl.model.tiny["max_positions"] == 256
    assert set(ALPHABET) >= set(string.ascii_lowercase) and rl.model.tiny["task"] == "function_graph"


def test_model_written_codes_syntax_warnings_stay_off_the_runs_stderr():
    import warnings

    from reasonrl.methods.fsg.execute import runnable_spans
    from reasonrl.methods.fsg.parse import code_policy_violation, parse_completion, signature_matches

    code = "def f1(a,b):return 1(a)"  # valid syntax that Python warns about ('int' is not callable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile(code, "<probe>", "exec")
    assert any(issubclass(w.category, SyntaxWarning) for w in caught)  # the probe does warn
    graph = {"nodes": [{"id": "f1", "signature": "f1(a,b)"}]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert code_policy_violation(code) is None and signature_matches(code, "f1(a,b)")
        assert runnable_spans(parse_completion(f"<f1>{code}</f1>", ["f1"]), graph, policy=True)[0] == {"f1": code}
    assert not [w for w in caught if issubclass(w.category, SyntaxWarning)]
