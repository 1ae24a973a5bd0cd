"""Fed-GRPO on Flower (docs/methods/fed_grpo.md): the formulas by hand, the split, the client's
calibration weights, FedAvg equivalence, and Flower simulations (3 clients x 2 rounds; one
client failing; every reply inspected; bytes counted exactly)."""

import json
import math
from pathlib import Path

import pytest
import torch

from reasonrl.methods.fed_grpo.maths import (aggregation_weights, block_budgets, block_informativeness, calibration_weights,
                                             client_budgets, client_signal, payload_bytes, per_client_budget,
                                             proportional_budgets, topk_error_feedback, update_reward_ema)
from reasonrl.config import load_recipe
from reasonrl.methods.fed_grpo.codec import Layout, compensate, decode, encode, update_stats
from reasonrl.problem import Problem

from helpers import MINI_TINY, flower_replies

ROOT = Path(__file__).resolve().parents[1]


def test_aggregation_weights_by_hand():
    n, s = torch.tensor([4.0, 2.0, 2.0]), torch.tensor([0.5, 0.0, 0.25])
    assert aggregation_weights(n, s, 1.0).tolist() == pytest.approx([0.8, 0.0, 0.2])  # raw 2, 0, 0.5
    assert aggregation_weights(n, s, 2.0).tolist() == pytest.approx([1 / 1.125, 0.0, 0.125 / 1.125])
    assert aggregation_weights(n, s, 0.0).tolist() == pytest.approx([0.5, 0.25, 0.25])  # FedAvg
    assert aggregation_weights(n, torch.zeros(3), 1.0).tolist() == pytest.approx([0.5, 0.25, 0.25])  # fallback
    with pytest.raises(ValueError, match="signals must be >= 0"):
        aggregation_weights(n, torch.tensor([0.1, -0.1, 0.0]))


def test_client_signal_and_reward_ema_by_hand():
    # std of [1,0,1,0] (unbiased) = sqrt(1/3); the second group agrees: 0
    assert client_signal([[1, 0, 1, 0], [1, 1, 1, 1]]) == pytest.approx(math.sqrt(1 / 3) / 2)
    assert client_signal([]) == 0.0
    first = update_reward_ema(None, torch.tensor([1.0, 0.0]), torch.tensor([3.0, 1.0]), 0.9)
    assert first == pytest.approx(0.75)
    assert update_reward_ema(first, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), 0.9) == pytest.approx(0.675)


def test_calibration_weights_by_hand():
    means = torch.tensor([0.0, 0.5, 1.0, 0.9])
    assert calibration_weights(0.5, means, 1.0).tolist() == pytest.approx([1.5, 1.0, 0.5, 0.6])
    assert calibration_weights(0.5, means, 4.0).tolist() == pytest.approx([2.0, 1.0, 0.5, 0.5])  # clipped
    e = [math.exp(0.5), 1.0, math.exp(-0.5)]
    soft = calibration_weights(0.5, torch.tensor([0.0, 0.5, 1.0]), 1.0, form="softmax")
    assert soft.tolist() == pytest.approx([3 * x / sum(e) for x in e], rel=1e-6)
    assert calibration_weights(None, means).tolist() == [1.0] * 4  # no R-bar yet
    with pytest.raises(ValueError, match="form must be"):
        calibration_weights(0.5, means, form="tanh")


def test_topk_with_error_feedback_by_hand():
    delta, residual = torch.tensor([0.5, -2.0, 1.0, 0.1]), torch.tensor([0.0, 0.0, 0.0, 0.95])
    idx, val, res = topk_error_feedback(delta, residual, 2)  # u = [0.5, -2, 1, 1.05]
    assert idx.tolist() == [1, 3] and val.tolist() == pytest.approx([-2.0, 1.05])
    assert res.tolist() == pytest.approx([0.5, 0.0, 1.0, 0.0])
    idx, val, res = topk_error_feedback(torch.zeros(4), res, 1)  # the residual alone is sent next round
    assert idx.tolist() == [2] and val.tolist() == pytest.approx([1.0]) and res.tolist() == pytest.approx([0.5, 0, 0, 0])
    idx, val, res = topk_error_feedback(delta, residual, 2, error_feedback=False)  # u = delta: what is cut is lost
    assert idx.tolist() == [1, 2] and val.tolist() == pytest.approx([-2.0, 1.0]) and res.abs().sum() == 0


def test_block_informativeness_and_budgets_by_hand():
    info = block_informativeness([torch.tensor([3.0, 4.0]), torch.zeros(3)])
    assert info.tolist() == pytest.approx([5 / math.sqrt(2), 0.0])
    # total 5; shares 3.75, 1.25, 0 -> floors 3, 1 -> the extra one to the larger remainder
    assert proportional_budgets(torch.tensor([3.0, 1.0, 0.0]), [10, 10, 10], 5) == [4, 1, 0]
    # total 6; entry 0's share 60/11 is capped at 2, the other 4 go to entry 1
    assert proportional_budgets(torch.tensor([10.0, 1.0]), [2, 10], 6) == [2, 4]
    # total 9; 36/7 capped at 1; the 8 left split 2:1 -> 5.33, 2.67 -> 5, 2 -> the extra to entry 2
    assert proportional_budgets(torch.tensor([4.0, 2.0, 1.0]), [1, 10, 10], 9) == [1, 5, 3]
    # more slots than non-zeros: each entry gets its cap, a zero-score entry nothing, the rest is not spent
    assert proportional_budgets(torch.tensor([1.0, 0.0, 2.0]), [3, 4, 1], 7) == [3, 0, 1]
    assert proportional_budgets(torch.zeros(2), [3, 4], 2) == [0, 0]  # nothing changed: nothing to send
    assert block_budgets(torch.tensor([10.0, 1.0]), [2, 10], 6) == [2, 4]  # caps: the blocks' non-zeros


def test_client_budgets_split_the_round_across_clients_by_update_norm():
    d = 40
    per = per_client_budget(d, 10)  # floor(40 / 10) = 4 slots a client, K = 3 x 4 = 12 a round
    assert per == 4 and per_client_budget(7, 32) == 1  # at least one slot
    norms, nnz = torch.tensor([6.0, 3.0, 1.0]), [3, 20, 20]
    # shares 12 x 6/10 = 7.2 -> client 0 capped at its 3 non-zeros; the 9 left split 3:1 -> 6.75, 2.25
    # -> 6, 2 and the last slot to the larger remainder (client 1)
    assert client_budgets(norms, nnz, per) == [3, 7, 2]
    assert sum(client_budgets(norms, nnz, per)) == 12  # the whole round's budget is spent
    assert client_budgets(norms, nnz, per, "uniform") == [3, 4, 4]  # the ablation: 4 each, capped, not moved
    # fewer non-zeros than slots in the federation: every non-zero goes, no zero is sent
    assert client_budgets(torch.tensor([1.0, 1.0]), [2, 3], 5) == [2, 3]
    assert client_budgets(torch.tensor([2.0, 0.0]), [6, 0], 3) == [6, 0]  # an idle client's slots go to the other
    with pytest.raises(ValueError, match="allocation must be"):
        client_budgets(norms, nnz, per, "greedy")


def test_encode_never_sends_more_slots_than_a_block_has_non_zeros():
    """The regression: block a (2 non-zeros, large RMS) used to get a share capped at its size
    d_a = 4 and sent two 0.0 entries; now its cap is its 2 non-zeros and b gets the rest."""
    layout = Layout(("a", "b"), ((2, 2), (6,)))
    u = {"a": torch.tensor([0.0, 5.0, 0.0, -5.0]), "b": torch.tensor([1.0, 0.5, 0.25, 0.0, 0.0, 0.1])}
    assert update_stats(u) == (pytest.approx(math.sqrt(50 + 1.3225)), 6)
    # I_a = sqrt(50)/2 = 3.54, I_b = sqrt(1.3225)/sqrt(6) = 0.47: a's share of 5 is 4.41, capped at 2
    up = encode(u, layout, 5)
    assert up.budgets == [2, 3]
    assert up.indices.tolist() == [1, 3, 4, 5, 6] and up.values.tolist() == [5.0, -5.0, 1.0, 0.5, 0.25]
    assert up.residual["a"].tolist() == [0.0] * 4 and up.residual["b"].tolist() == pytest.approx([0, 0, 0, 0, 0, 0.1])
    every = encode(u, layout, 10)  # more slots than non-zeros: the 6 non-zeros, never a zero
    assert every.values.numel() == 6 and bool((every.values != 0).all()) and every.budgets == [2, 4]
    assert sum(every.residual["b"].abs()) == 0
    flat = encode(u, layout, 3, allocation="uniform")  # one top-k over the whole update
    assert flat.indices.tolist() == [1, 3, 4] and flat.budgets == [2, 1]
    lost = encode(u, layout, 3, allocation="uniform", error_feedback=False)
    assert all(r.abs().sum() == 0 for r in lost.residual.values())


def test_codec_payload_bytes_and_round_trip():
    layout = Layout(("a", "b"), ((2, 2), (4,)))
    delta = {"a": torch.tensor([[0.0, 3.0], [-1.0, 0.0]]), "b": torch.tensor([0.1, -0.2, 0.0, 0.4])}
    residual = {"a": torch.tensor([0.0, 0.0, 0.5, 0.0]), "b": torch.zeros(4)}
    u = compensate(delta, layout, residual)  # e + delta
    assert u["a"].tolist() == [0.0, 3.0, -0.5, 0.0] and u["b"].tolist() == pytest.approx([0.1, -0.2, 0.0, 0.4])
    assert compensate(delta, layout, residual, error_feedback=False)["a"].tolist() == [0.0, 3.0, -1.0, 0.0]
    up = encode(u, layout, 2)  # I_a = sqrt(9.25)/2 = 1.52, I_b = sqrt(0.21)/2 = 0.23: shares 1.74, 0.26 -> 1, 0 -> +1 a
    assert up.budgets == [2, 0]
    assert up.indices.tolist() == [1, 2] and up.values.tolist() == [3.0, -0.5] and up.indices.dtype == torch.int32
    assert up.nbytes == payload_bytes(up.indices, up.values) == 2 * (4 + 4)
    dense = decode(up.indices, up.values, layout)
    flat_sent = torch.cat([dense["a"].reshape(-1), dense["b"]])
    flat_all = torch.cat([u["a"], u["b"]])
    flat_res = torch.cat([up.residual["a"], up.residual["b"]])
    assert torch.equal(flat_sent + flat_res, flat_all)  # what is sent plus what is kept is the update
    full = encode(u, layout, 8, dense=True)
    assert full.indices.numel() == 0 and full.nbytes == 8 * 4  # dense: 8 float32 values, no indices
    assert all(torch.equal(decode(full.indices, full.values, layout)[k].reshape(-1), u[k]) for k in u)


def test_non_iid_split_gives_each_client_mostly_its_forms():
    from reasonrl.methods.fed_grpo.sampler import NonIIDSplit, solution_steps
    from reasonrl.tasks.arithmetic import ArithmeticTask

    groups = [["a+b*c"], ["c*b+a"], ["(a+b)*c", "c*(a+b)"]]
    task = ArithmeticTask()
    for c in range(3):
        s = NonIIDSplit(task, seed=0, client=c, num_clients=3, groups=groups, dominant=0.75)
        batch = s.problems(step=5, count=8)
        home = [p for p in batch if p.meta["form"] in groups[c]]
        assert len(batch) == 8 and len(home) == 6  # round(0.75 * 8)
        assert [p.prompt for p in s.problems(5, 8)] == [p.prompt for p in batch]  # a function of the step
    assert solution_steps(Problem("q", "3", "a<<1>>\nb\n#### 3")) == 2
    with pytest.raises(ValueError, match="key 'level' is not in"):
        NonIIDSplit(task, client=0, num_clients=3, key="level").problems(0, 2)


def test_client_method_weights_each_prompt_by_its_gap():
    from reasonrl.batch import RolloutBatch
    from reasonrl.methods.fed_grpo.method import FedGRPOClient

    m = FedGRPOClient(beta=1.0)
    m.begin_round(0.5)
    n = 6
    batch = RolloutBatch(prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
                         completion_ids=torch.ones(n, 3, dtype=torch.long),
                         completion_mask=torch.ones(n, 3, dtype=torch.long),
                         group_ids=torch.tensor([7, 7, 7, 9, 9, 9]), rewards=torch.tensor([0.0, 0, 0, 1, 1, 0]),
                         truncated=torch.zeros(n, dtype=torch.bool))
    m.annotate(batch, 0)
    # group 7: mean 0 -> omega 1.5; group 9: mean 2/3 -> 1 + (0.5 - 2/3) = 5/6
    assert batch.is_weights[:, 0].tolist() == pytest.approx([1.5] * 3 + [5 / 6] * 3)
    report = m.report()
    assert report["num-examples"] == 2 and report["reward-mean"] == pytest.approx(2 / 6)
    assert report["signal"] == pytest.approx(math.sqrt(1 / 3) / 2)  # std of [1,1,0] = sqrt(1/3); group 7: 0


def test_a_client_state_of_another_federation_is_refused(tmp_path):
    from reasonrl.config import recipe_from_dict
    from reasonrl.methods.fed_grpo.client import FedClient

    recipe = _fed_recipe(ROOT / "recipes" / "fed_grpo.yaml", tmp_path)
    client = FedClient(recipe, 0, tmp_path / "c0")
    client.train_round(client.trainer.policy.weights(), None, 1)
    again = FedClient(recipe, 0, tmp_path / "c0", before_round=2)  # the same federation continues
    assert again.round == 1 and again.trainer.state.step == 1
    other = recipe.to_dict()
    other["optim"]["lr"] = 1e-3
    with pytest.raises(ValueError, match="holds another federation's client state"):
        FedClient(recipe_from_dict(other, "other"), 0, tmp_path / "c0")


def test_a_client_round_in_two_halves(tmp_path):
    """train_round reports ||u|| and nnz(u) and keeps u pending; send(k) sends k non-zero entries;
    the state file alone (a deployed client's fresh process) sends the same; a pending update the
    server never asked for is carried whole into the next round (error feedback)."""
    import shutil

    from reasonrl.methods.fed_grpo.client import STATE_FILE, FedClient, send_saved
    from reasonrl.train.checkpoint import load_state

    recipe = _fed_recipe(ROOT / "recipes" / "fed_grpo.yaml", tmp_path)
    client = FedClient(recipe, 0, tmp_path / "c0")
    glob = client.trainer.policy.weights()
    report = client.train_round(glob, None, 1).report
    local = client.trainer.policy.weights()
    u = {n: (local[n].float() - glob[n].float()).reshape(-1) for n in client.layout.names}
    norm, nnz = update_stats(u)
    assert set(report) == {"signal", "num-examples", "reward-mean", "update-norm", "nonzeros"}
    assert report["update-norm"] == pytest.approx(norm) and report["nonzeros"] == nnz > 50
    shutil.copytree(tmp_path / "c0", tmp_path / "copy")
    sent = client.send(50, 1)
    saved = send_saved(recipe, tmp_path / "copy", 50, 1)
    assert torch.equal(sent.indices, saved.indices) and torch.equal(sent.values, saved.values)
    assert sent.values.numel() == 50 and bool((sent.values != 0).all())
    a, b = (load_state(d / STATE_FILE) for d in (tmp_path / "c0", tmp_path / "copy"))
    assert a["pending"] is None and b["pending"] is None and a["round"] == b["round"] == 1
    assert all(torch.equal(a["residual"][n], b["residual"][n]) for n in client.layout.names)
    flat_sent = decode(sent.indices, sent.values, Layout(client.layout.names, tuple((t.numel(),) for t in u.values())))
    assert all(torch.equal(flat_sent[n] + a["residual"][n], u[n]) for n in u)  # sent + kept = u
    with pytest.raises(ValueError, match="no pending update of round 1"):
        send_saved(recipe, tmp_path / "copy", 50, 1)

    client.train_round(local, None, 2)  # round 2 trained, never sent
    pending = {n: t.clone() for n, t in client.pending.items()}
    again = FedClient(recipe, 0, tmp_path / "c0", before_round=3)  # rebuilt from the file
    glob3 = again.trainer.policy.weights()
    again.train_round(glob3, None, 3)
    local3 = again.trainer.policy.weights()
    assert all(torch.equal(again.pending[n], (local3[n].float() - glob3[n].float()).reshape(-1) + pending[n])
               for n in pending)


def test_fedavg_settings_are_flowers_fedavg(monkeypatch):
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from reasonrl.methods.fed_grpo.apps import reply_content, update_content
    from reasonrl.methods.fed_grpo.client import RoundResult
    from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy

    g = {"w": torch.tensor([1.0, 2.0, 3.0])}
    locals_ = [torch.tensor([2.0, 2.0, 0.0]), torch.tensor([1.0, 5.0, 3.0])]
    counts = [3.0, 1.0]
    layout = Layout.of(g)
    fed = dict(min_clients=1, alpha=0.0, beta=0.0, server_lr=1.0, reward_momentum=0.9, kappa=1)
    strat = FedGRPOStrategy(layout, fed)
    strat.current = ArrayRecord(g)
    trained, updates, plain = [], [], []
    for cid, (theta, n) in enumerate(zip(locals_, counts)):
        u = compensate({"w": theta - g["w"]}, layout, None)
        norm, nnz = update_stats(u)
        report = {"signal": 0.3 * cid, "num-examples": n, "reward-mean": 0.5, "update-norm": norm, "nonzeros": nnz}
        trained.append(reply_content(RoundResult(report, []), cid))
        updates.append(update_content(encode(u, layout, 3, dense=True), cid))
        plain.append(RecordDict({"arrays": ArrayRecord({"w": theta}),
                                 "metrics": MetricRecord({"num-examples": n})}))
    assert strat.budgets([c["metrics"] for c in trained]) == [3, 3]  # dense: every entry
    arrays, metrics = strat.aggregate(1, flower_replies(monkeypatch, trained), flower_replies(monkeypatch, updates))
    ours = arrays.to_torch_state_dict()["w"]
    flowers = aggregate_arrayrecords(plain, "num-examples").to_torch_state_dict()["w"]
    assert torch.allclose(ours, flowers) and ours.tolist() == pytest.approx([1.75, 2.75, 0.75])
    assert metrics["weight/c0"] == pytest.approx(0.75) and metrics["global_reward"] == pytest.approx(0.5)


def test_the_server_checks_each_update_against_its_budget(monkeypatch):
    """Two clients, d = 8, kappa 4: K = 2 x 2 = 4 slots split by update norm (3 and 1 non-zeros:
    client 0 is capped at 1, client 1 gets 3); an update with a zero, or one slot too many, is refused."""
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord

    from reasonrl.methods.fed_grpo.apps import reply_content, update_content
    from reasonrl.methods.fed_grpo.client import RoundResult
    from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy

    g = {"w": torch.zeros(8)}
    layout = Layout.of(g)
    fed = dict(min_clients=1, alpha=0.0, beta=0.0, server_lr=1.0, reward_momentum=0.9, kappa=4)
    us = [{"w": torch.tensor([0.0, 0, 0, 9.0, 0, 0, 0, 0])}, {"w": torch.tensor([1.0, 0, -2.0, 0, 0, 0.5, 0, 0])}]
    trained = []
    for cid, u in enumerate(us):
        norm, nnz = update_stats(u)
        trained.append(reply_content(RoundResult({"signal": 0.5, "num-examples": 1.0, "reward-mean": 0.5,
                                                  "update-norm": norm, "nonzeros": nnz}, []), cid))
    strat = FedGRPOStrategy(layout, fed)
    strat.current = ArrayRecord(g)
    assert strat.budgets([c["metrics"] for c in trained]) == [1, 3]  # 4 x 9/(9 + 2.29) = 3.19 -> capped at 1
    updates = [update_content(encode(u, layout, k), cid) for cid, (u, k) in enumerate(zip(us, [1, 3]))]
    arrays, metrics = strat.aggregate(1, flower_replies(monkeypatch, trained), flower_replies(monkeypatch, updates))
    assert arrays.to_torch_state_dict()["w"].tolist() == pytest.approx([0.5, 0, -1.0, 4.5, 0, 0.25, 0, 0])
    assert metrics["budget/c0"] == 1 and metrics["budget/c1"] == 3 and metrics["bytes/up"] == 4 * 8
    padded = update_content(encode(us[0], layout, 2, allocation="uniform"), 0)  # 1 non-zero: still 1 value
    assert padded["update"]["values"].numpy().tolist() == [9.0]
    from flwr.app import Array, ArrayRecord as AR, MetricRecord as MR, RecordDict as RD
    with_zero = RD({"update": AR({"indices": Array(torch.tensor([3, 4], dtype=torch.int32).numpy()),
                                  "values": Array(torch.tensor([9.0, 0.0]).numpy())}),
                    "metrics": MR({"payload-bytes": 16, "client-id": 0})})
    with pytest.raises(ValueError, match=r"sent 2 values \(1 of them zero\) for a budget of 1"):
        strat.aggregate(1, flower_replies(monkeypatch, trained), flower_replies(monkeypatch, [with_zero, updates[1]]))


def digit_parity(completion, problem, **_):
    """A reward an untrained model earns about half the time: the groups' rewards differ."""
    return float(sum(ch.isdigit() for ch in completion) % 2)


def _fed_recipe(path, tmp_path, *extra):
    sets = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    sets += ["rollout.num_generations=4", "rollout.max_new_tokens=16", "train.prompts_per_step=4",
             "train.micro_batch_size=16", "train.threads=1", "eval.size=8", "log.progress=false",
             # the untrained mini model scores 0 on answers; a reward it can earn spreads its groups
             f'rewards=[{{"name": "exact_answer"}}, {{"name": "{__file__}:digit_parity"}}]', *extra]
    recipe = load_recipe(path, sets)
    raw = recipe.to_dict()
    raw["methods"][0].update(rounds=2, local_steps=1)
    from reasonrl.config import recipe_from_dict
    return recipe_from_dict(raw, "test")


@pytest.fixture
def no_ray_left():
    yield
    ray = pytest.importorskip("ray")
    alive = ray.is_initialized()
    ray.shutdown()
    assert not alive, "the simulation left Ray running"


def test_flower_simulation_three_clients_two_rounds(tmp_path, no_ray_left, monkeypatch):
    """recipes/fed_grpo.yaml end to end; every reply the server receives is only tensors and
    the allowed scalars (no prompt or completion text), and the logged bytes are exact; a crashed
    run resumes to the same numbers."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    from reasonrl.cli import main
    from reasonrl.methods.fed_grpo.apps import simulate
    from reasonrl.methods.fed_grpo.strategy import TRAIN_KEYS, UPDATE_KEYS

    recipe = _fed_recipe(ROOT / "recipes" / "fed_grpo.yaml", tmp_path)
    received = []
    summary = simulate(recipe, tmp_path / "fed", on_reply=received.append)
    assert summary["rounds"] == 2 and set(summary["accuracy_by_round"]) == {"0", "1", "2"}
    assert len(received) == 12 and not any(m.has_error() for m in received)  # 3 clients x 2 rounds x 2 halves
    d = sum(p.numel() for p in _mini_weights().values())
    rows = [json.loads(x) for x in (tmp_path / "fed" / "metrics.jsonl").read_text().splitlines()]
    by_round = {r["step"]: r for r in rows}
    for msg in received:
        c = msg.content
        assert not c.config_records  # nowhere for text to go
        assert all(isinstance(v, (int, float)) for v in c["metrics"].values())
        if set(c.keys()) == {"metrics"}:  # the first half: scalars only
            assert set(c["metrics"].keys()) == TRAIN_KEYS
            continue
        assert set(c.keys()) == {"update", "metrics"} and set(c["metrics"].keys()) == UPDATE_KEYS
        assert set(c["update"].keys()) == {"indices", "values"}
        assert c["update"]["indices"].dtype == "int32" and c["update"]["values"].dtype == "float32"
        values = c["update"]["values"].numpy()
        assert (values != 0).all()  # never a zero slot
        assert c["metrics"]["payload-bytes"] == 8 * values.shape[0]  # int32 index + float32 value per entry
    for rnd in (1, 2):
        row = by_round[rnd]
        ups = [row[f"fed/bytes_up/c{c}"] for c in range(3)]
        budgets = [row[f"fed/budget/c{c}"] for c in range(3)]
        norms = torch.tensor([row[f"fed/norm/c{c}"] for c in range(3)])
        nnz = [int(row[f"fed/nonzeros/c{c}"]) for c in range(3)]
        # kappa 32: the round's 3 x floor(d/32) slots split by update norm, capped at each client's non-zeros
        assert budgets == client_budgets(norms, nnz, d // 32)
        assert sum(budgets) == min(3 * (d // 32), sum(nnz)) and ups == [8 * k for k in budgets]
        assert row["fed/bytes/up"] == sum(ups) and row["fed/bytes/down"] == 3 * 4 * d
        assert sum(row[f"fed/weight/c{c}"] for c in range(3)) == pytest.approx(1.0)
        assert "eval/accuracy" in row and row["fed/clients/ok"] == 3
    assert any(by_round[r][f"fed/signal/c{c}"] > 0 for r in (1, 2) for c in range(3))  # the weights saw signal
    assert by_round[2]["fed/global_reward"] is not None
    assert (tmp_path / "fed" / "final_model").is_dir()

    # The same federation killed in round 2 after every client trained it (their states hold
    # round 2), then `--resume`d: the server repeats round 2, each client from its round-1 state,
    # and every logged number and the final weights equal the uninterrupted run's.
    from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy

    crashed = tmp_path / "crashed"
    original = FedGRPOStrategy.aggregate_train

    def crash_in_round_2(self, server_round, replies):
        if server_round + self.round_offset == 2:
            raise RuntimeError("simulated server crash")
        return original(self, server_round, replies)

    monkeypatch.setattr(FedGRPOStrategy, "aggregate_train", crash_in_round_2)
    with pytest.raises(RuntimeError, match="simulated server crash"):
        simulate(recipe, crashed)
    monkeypatch.setattr(FedGRPOStrategy, "aggregate_train", original)
    states = [torch.load(crashed / "clients" / f"client_{c}" / name, weights_only=False)["round"]
              for c in range(3) for name in ("client_state.pt", "client_state.prev.pt")]
    assert states == [2, 1] * 3 and not (crashed / "summary.json").exists()
    assert main(["fed-sim", "--resume", "-o", str(crashed)]) == 0
    assert (crashed / "metrics.jsonl").read_text() == (tmp_path / "fed" / "metrics.jsonl").read_text()
    assert json.loads((crashed / "summary.json").read_text())["accuracy_by_round"] == summary["accuracy_by_round"]
    resumed, straight = (load_file(str(d / "final_model" / "model.safetensors")) for d in (crashed, tmp_path / "fed"))
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)


def _mini_weights():
    from reasonrl.policy.factory import build_policy
    from reasonrl.sections import ModelConfig

    return {k: v for k, v in build_policy(ModelConfig(tiny=dict(MINI_TINY))).weights().items()
            if v.is_floating_point()}


def test_a_failing_client_does_not_stall_the_server(tmp_path, no_ray_left):
    """recipes/fed_avg.yaml with client 1 raising in round 1: Flower returns its error reply,
    the round aggregates the other two (min_clients 2), and client 1 is back in round 2."""
    pytest.importorskip("flwr")
    from flwr.clientapp import ClientApp

    from reasonrl.methods.fed_grpo.apps import client_send, client_train, simulate

    recipe = _fed_recipe(ROOT / "recipes" / "fed_avg.yaml", tmp_path)
    raw, out = recipe.to_dict(), (tmp_path / "fed").resolve()
    app = ClientApp()

    @app.train()
    def train(msg, context):
        if int(context.node_config["partition-id"]) == 1 and int(msg.content["config"]["server-round"]) == 1:
            raise RuntimeError("client 1 killed mid-round")
        return client_train(msg, context, raw, out)

    @app.query()
    def query(msg, context):
        return client_send(msg, context, raw, out)

    received = []
    summary = simulate(recipe, out, client_app=app, on_reply=received.append)
    assert summary["final_accuracy"] is not None
    rows = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert rows[1]["fed/clients/ok"] == 2 and rows[1]["fed/clients/failed"] == 1
    assert "fed/weight/c1" not in rows[1] and rows[1]["fed/weight/c0"] == pytest.approx(0.5)
    assert rows[2]["fed/clients/ok"] == 3 and rows[2]["fed/clients/failed"] == 0
    assert rows[2]["fed/bytes_up/c1"] == 4 * sum(p.numel() for p in _mini_weights().values())  # dense: values only
