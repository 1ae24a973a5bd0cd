"""CARing's semantic IDs: RQ assignment and collision repair by hand, the trie that never emits an
invalid ID, rank fusion and the ranking metrics by hand, the SID tokens in SmolLM2's tokenizer,
the next-visit task, and the stage-1 + constrained-evaluation pipeline on the mini model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from reasonrl.methods.caring.semantic_ids import (assign_codes, build_semantic_ids, collision_rate, reciprocal_rank_fusion,
                                         recall_at_k, repair_collisions, residual_quantise, sid_tokens, tfidf_matrix,
                                         weighted_f1)
from reasonrl.methods.caring.decoding import Trie, constrained_beam_search, label_trie, multi_chain_rank, rank_labels
from reasonrl.methods.caring.next_visit import NextVisitTask

from helpers import MINI_TINY, mini_policy

# Two levels: 3 first-level codes (the third unused by the data), 3 second-level codes.
C1 = np.array([[0.0, 0.0], [10.0, 0.0], [20.0, 0.0]])
C2 = np.array([[0.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
# a, b share (0,0); c owns (0,1); d, e, f, g share (1,0).
Z = np.array([[0.0, 0.0], [0.0, 0.3], [0.0, 1.2], [10.0, 0.0], [10.0, 0.1], [10.0, 0.2], [10.0, 0.15]])


def test_residual_assignment_by_hand():
    # z = (10.9, 1.1): c¹ = 1 (nearest (10, 0)), r¹ = (0.9, 1.1); c² = 1 (nearest (0, 1)), r² = (0.9, 0.1).
    codes, resid = assign_codes(np.array([[10.9, 1.1]]), [C1, C2])
    assert codes.tolist() == [[1, 1]]
    np.testing.assert_allclose(resid, [[0.9, 0.1]])
    codes, _ = assign_codes(Z, [C1, C2])
    assert codes.tolist() == [[0, 0], [0, 0], [0, 1], [1, 0], [1, 0], [1, 0], [1, 0]]
    assert collision_rate(codes) == pytest.approx(1 - 3 / 7)


def test_collision_repair_by_hand():
    codes, _ = assign_codes(Z, [C1, C2])
    fixed = repair_collisions(Z, codes, [C1, C2])
    # a keeps (0,0) (its residual is nearest C²₀); b's nearest free code under prefix 0 is 2, not 1
    # (c holds (0,1)); d keeps (1,0); e, f take (1,1), (1,2); prefix 1 is then full, so g takes the
    # free full ID nearest by reconstruction: (2,0) = (20,0) at distance² 100.02, vs (0,2) = (0,2) at 103.4.
    assert fixed.tolist() == [[0, 0], [0, 2], [0, 1], [1, 0], [1, 1], [1, 2], [2, 0]]
    assert collision_rate(fixed) == 0.0
    with pytest.raises(ValueError, match="do not fit 9 IDs"):
        repair_collisions(np.zeros((10, 2)), np.zeros((10, 2), dtype=int), [C1, C2])


def test_residual_kmeans_finds_the_hand_built_clusters():
    # Four tight clusters at (±5, ±1): level 1 (K=2) splits the x sign, level 2 (K=2) the y sign.
    rng = np.random.default_rng(0)
    centres = np.array([[5, 1], [5, -1], [-5, 1], [-5, -1]], dtype=float)
    z = np.repeat(centres, 5, 0) + 0.01 * rng.standard_normal((20, 2))
    codes, books = residual_quantise(z, levels=2, codes=2, seed=0)
    for block in range(4):
        assert len({tuple(c) for c in codes[5 * block:5 * block + 5].tolist()}) == 1
    assert len({tuple(codes[5 * b]) for b in range(4)}) == 4
    assert sorted(np.abs(books[0][:, 0]).round(1).tolist()) == [5.0, 5.0]
    np.testing.assert_allclose(np.sort(np.abs(books[1][:, 1])), [1.0, 1.0], atol=0.05)


def test_tfidf_by_hand_and_pipeline_deterministic():
    # idf(a) = ln(3/3) + 1 = 1, idf(b) = ln(3/2) + 1; row 0 = (1, idf(b)) / norm.
    x = tfidf_matrix(["a b", "A"])
    idf_b = math.log(1.5) + 1
    np.testing.assert_allclose(x, [[1 / math.hypot(1, idf_b), idf_b / math.hypot(1, idf_b)], [1.0, 0.0]])
    texts = [f"disease {w} of organ {o}" for w in "abcdefgh" for o in "xyz"]
    ids1, stats = build_semantic_ids(texts, levels=3, codes=4, dim=8, seed=3)
    ids2, _ = build_semantic_ids(texts, levels=3, codes=4, dim=8, seed=3)
    assert np.array_equal(ids1, ids2) and stats["collision_rate_after"] == 0.0 < stats["collision_rate_before"]


class PrefersInvalid(torch.nn.Module):
    """Logits = a random table of the last token, +50 on the token '9' (never part of a label)."""

    def __init__(self, vocab: int, bad: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, generator=g) * 3
        self.table[:, bad] += 50.0
        self.training = False

    def forward(self, input_ids, attention_mask=None):
        logits = self.table[input_ids] + 0.1 * torch.arange(input_ids.shape[1]).view(1, -1, 1)
        return SimpleNamespace(logits=logits)


def test_trie_never_emits_an_invalid_id_exhaustively():
    tok = mini_policy().tokenizer
    labels = ["1", "12", "13", "21", "3", "304", "31"]  # "1" is a prefix of "12" and "13"
    trie, to_label = label_trie(tok, labels)
    eos, bad = tok.eos_token_id, tok.convert_tokens_to_ids("9")
    for prompts_seed in range(6):
        model = PrefersInvalid(len(tok), bad, seed=prompts_seed)
        prompt = torch.tensor(tok(f"{prompts_seed}+4=", add_special_tokens=False)["input_ids"])
        # Brute force: every label's exact log-probability under the model.
        exact = {}
        for path in trie.sequences:
            ids = torch.cat([prompt, torch.tensor(path)])
            logp = torch.log_softmax(model(ids[None]).logits[0].float(), -1)
            exact[to_label[path[:-1]]] = sum(float(logp[len(prompt) - 1 + t, path[t]]) for t in range(len(path)))
        for beam in range(1, len(labels) + 2):
            out = constrained_beam_search(model, prompt, trie, beam)
            assert out and all(path[-1] == eos and to_label[path[:-1]] in labels for path, _ in out)
            assert len(out) == min(beam, len(labels))
            for path, score in out:
                assert score == pytest.approx(exact[to_label[path[:-1]]], abs=1e-4)
        full = [to_label[p[:-1]] for p, _ in constrained_beam_search(model, prompt, trie, len(labels))]
        assert full == sorted(exact, key=lambda k: -exact[k])  # exhaustive: the exact ranking
    assert trie.allowed(tok("1", add_special_tokens=False)["input_ids"]) == sorted(
        [eos, *(tok.convert_tokens_to_ids(c) for c in "23")])
    assert trie.allowed([bad]) == []
    with pytest.raises(ValueError, match="same token sequence"):
        Trie([(1, 2), (1, 2)])


def test_constrained_ranking_of_an_untrained_model_is_always_valid():
    policy = mini_policy(seed=1)
    labels = ["12", "13", "21", "3", "304"]
    prompts = [f"{a}*{b}=" for a in range(4) for b in range(3)]
    for ranked in rank_labels(policy, prompts, labels, beam_size=3):
        assert len(ranked) == 3 and set(ranked) <= set(labels)
    fused, chains = multi_chain_rank(policy, prompts[:3], labels, chains=3, think_end="#", max_chain_tokens=4,
                                     beam_size=4, generator=torch.Generator().manual_seed(0))
    for f, lists in zip(fused, chains):
        assert len(lists) == 3 and f == reciprocal_rank_fusion(lists)[:4] and set(f) <= set(labels)


def test_reciprocal_rank_fusion_by_hand():
    # k = 1: a = 1/2 + 1/3, b = 1/3 + 1/2 (tie: a appeared first), c = 1/4 + 1/2 = 0.75.
    assert reciprocal_rank_fusion([["a", "b", "c"], ["b", "a"], ["c"]], k=1) == ["a", "b", "c"]
    # k = 60: y = 1/62 + 1/61 beats x = 1/61 beats z = 1/62.
    assert reciprocal_rank_fusion([["x", "y"], ["y", "z"]]) == ["y", "x", "z"]
    # k decides between one top rank and two middling ones: x is ranked 2 and 3.
    # k = 0: a = 1, b = 1, x = 1/2 + 1/3, c = 1/2;  k = 60: x = 1/62 + 1/63 beats a = b = 1/61 > c = 1/62.
    lists = [["a", "x"], ["b", "c", "x"]]
    assert reciprocal_rank_fusion(lists, k=0) == ["a", "b", "x", "c"]
    assert reciprocal_rank_fusion(lists, k=60) == ["x", "a", "b", "c"]


def test_recall_at_k_and_weighted_f1_by_hand():
    ranked = [["a", "b", "c", "d"], ["c", "a", "b"], ["a", "c"]]
    gold = [{"a", "c"}, {"b"}, {"a"}]
    assert [recall_at_k(ranked[0], gold[0], k) for k in (1, 2, 3)] == [0.5, 0.5, 1.0]
    assert recall_at_k(["a", "a", "c"], {"a", "c"}, 2) == 1.0  # the repeat is dropped before the cut: c is 2nd
    # Top-|Y|: {a, b}, {c}, {a}. a: TP 2 (support 2, F1 1); b: FP 1, FN 1 (support 1, F1 0);
    # c: FP 1, FN 1 (support 1, F1 0). Weighted: (2·1 + 0 + 0) / 4 = 0.5.
    assert weighted_f1(ranked, gold) == pytest.approx(0.5)
    assert weighted_f1([["a"]], [{"a"}]) == 1.0
    with pytest.raises(ValueError, match="as many ranked lists"):
        weighted_f1([["a"]], [])


def test_sid_tokens_in_smollm2_tokenizer_round_trip():
    from reasonrl.policy.loading import resolve_model_path
    from reasonrl.methods.caring.sid_tokens import add_sid_tokens

    try:
        folder = resolve_model_path("smollm2-135m", None, "float32", None)
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"SmolLM2 is not installed: {exc}")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(folder)
    old = len(tok)
    torch.manual_seed(0)  # a model with SmolLM2's vocabulary, small enough for a test; head untied
    model = LlamaForCausalLM(LlamaConfig(vocab_size=old, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False))
    policy = SimpleNamespace(tokenizer=tok, model=model)
    mean = model.get_input_embeddings().weight[:old].mean(0).detach().clone()
    text_ids = tok("Acute myocardial infarction", add_special_tokens=False)["input_ids"]
    by_text = model.get_input_embeddings().weight[text_ids].mean(0).detach().clone()
    tokens = sid_tokens(3, 8)
    added = add_sid_tokens(policy, tokens, init="text", texts={"<a_1>": "Acute myocardial infarction"})
    assert added == tokens and len(tok) == old + 24
    assert model.get_input_embeddings().weight.shape[0] == old + 24 == model.get_output_embeddings().weight.shape[0]
    for t in tokens:
        (i,) = tok(t, add_special_tokens=False)["input_ids"]
        assert i >= old and tok.decode([i], skip_special_tokens=True) == t
    sid = "<a_1><b_2><c_7>"
    ids = tok(f"Answer:{sid}", add_special_tokens=False)["input_ids"]
    assert ids[-3:] == [tok.convert_tokens_to_ids(t) for t in ("<a_1>", "<b_2>", "<c_7>")]
    assert tok.decode(ids, skip_special_tokens=True) == f"Answer:{sid}"
    emb = model.get_input_embeddings().weight
    torch.testing.assert_close(emb[tok.convert_tokens_to_ids("<a_1>")], by_text)
    torch.testing.assert_close(emb[tok.convert_tokens_to_ids("<b_0>")], mean)
    torch.testing.assert_close(model.get_output_embeddings().weight[tok.convert_tokens_to_ids("<b_0>")], mean)
    assert add_sid_tokens(policy, tokens) == []  # idempotent


def test_next_visit_task_follows_the_hierarchy():
    task = NextVisitTask(max_families=2, extra_fraction=0.5)
    assert task.sid_stats["collision_rate_after"] == 0.0 and len(set(task.sid_of.values())) == len(task.codes_list)
    train = task.train_problems(0, 50, 0)
    held = task.eval_problems(10)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    for p in train:
        history, gold = p.meta["history"], set(p.meta["codes"])
        fams = {task.family_of[c] for c in history}
        assert {task.family_of[c] for c in gold} == fams and not gold & set(history)
        for h in history:
            kids = task.families[task.family_of[h]]
            succ = kids[(kids.index(h) + 1) % len(kids)]
            assert succ in gold or succ in history
        assert p.prompt == ",".join(task.sid_of[c] for c in history) + ";"
        assert set(p.meta["labels"]) == {task.sid_of[c] for c in gold} and len(p.meta["labels"][0]) == 3
    code = NextVisitTask(label_format="code").train_problems(0, 1, 0)[0]
    assert code.meta["labels"] == code.meta["codes"]
    p = train[0]
    gold = list(p.meta["labels"])
    other = next(s for s in task.valid_labels() if s not in gold)
    m = task.group_metrics(p, [gold[0], gold[0], other, "zz"])
    assert m == {"recall_at_k": 1 / len(gold), "hit_rate": 0.5, "invalid_rate": 0.25}


def test_next_visit_bad_input_names_the_key():
    from reasonrl.config import ConfigError
    from helpers import mini_recipe

    with pytest.raises(ConfigError, match="label_format"):
        mini_recipe(task={"name": "next_visit", "label_format": "bogus"})
    with pytest.raises(ValueError, match="raise task.codes or task.levels"):
        NextVisitTask(levels=1, codes=4)


def test_stage1_alignment_and_constrained_evaluation_on_the_mini_model():
    from reasonrl.config import OptimConfig
    from reasonrl.methods.caring.sid_tokens import alignment_examples, alignment_sft
    from reasonrl.policy.tiny import TinySpec, build_tiny_policy

    task = NextVisitTask()
    policy = build_tiny_policy(TinySpec(**MINI_TINY, task="next_visit"), log=lambda m: None)
    examples = alignment_examples(policy, task, 48, seed=0)
    aligned = [e for e in examples if not e.prompt.endswith(";")]
    assert aligned and len(aligned) < len(examples)  # the mix holds both kinds
    stats = alignment_sft(policy, task, OptimConfig(lr=3e-3, warmup_steps=0), count=48, epochs=2, batch_size=16)
    assert stats["sft/loss_last"] < stats["sft/loss_first"]
    problems = task.eval_problems(4)
    ranked = rank_labels(policy, [p.prompt for p in problems], task.valid_labels(), beam_size=5)
    assert all(len(r) == 5 and set(r) <= set(task.valid_labels()) for r in ranked)
    gold = [set(p.meta["labels"]) for p in problems]
    assert 0.0 <= weighted_f1(ranked, gold) <= 1.0
