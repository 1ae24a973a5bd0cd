"""Fed-GRPO on Flower (docs/methods/fed_grpo.md): the formulas by hand, the split, the client's
calibration weights, FedAvg equivalence, and Flower simulations (3 clients x 2 rounds; one
client failing; every reply inspected; bytes counted exactly)."""

import json
import math
from pathlib import Path

import pytest
import torch

from reasonrl.methods.fed_grpo.maths import (aggregation_weights, block_budgets, block_informativeness, calibration_weights,
                                      client_signal, payload_bytes, topk_error_feedback, update_reward_ema)
from reasonrl.config import load_recipe
from reasonrl.methods.fed_grpo.codec import Layout, decode, encode
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
    # k_tot = 30 // 6 = 5; shares 3.75, 1.25, 0 -> floors 3, 1 -> the extra one to the larger remainder
    assert block_budgets(torch.tensor([3.0, 1.0, 0.0]), [10, 10, 10], 6) == [4, 1, 0]
    # k_tot = 6; block 0's share 60/11 is capped at its 2 entries, the other 4 go to block 1
    assert block_budgets(torch.tensor([10.0, 1.0]), [2, 10], 2) == [2, 4]
    assert block_budgets(torch.tensor([1.0, 0.0]), [3, 4], 1) == [3, 4]  # kappa 1: everything
    assert block_budgets(torch.zeros(2), [3, 4], 2) == [0, 0]  # nothing changed: nothing to send


def test_codec_payload_bytes_and_round_trip():
    layout = Layout(("a", "b"), ((2, 2), (4,)))
    delta = {"a": torch.tensor([[0.0, 3.0], [-1.0, 0.0]]), "b": torch.tensor([0.1, -0.2, 0.0, 0.4])}
    up = encode(delta, layout, kappa=4, residual={})  # k_tot = 8 // 4 = 2
    assert up.budgets == [2, 0]  # I_a = sqrt(10)/2, I_b = sqrt(0.21)/2: shares 1.75, 0.25 -> 1, 0 -> the extra to a
    assert up.indices.tolist() == [1, 2] and up.values.tolist() == [3.0, -1.0] and up.indices.dtype == torch.int32
    assert up.nbytes == payload_bytes(up.indices, up.values) == 2 * (4 + 4)
    dense = decode(up.indices, up.values, layout)
    flat_sent = torch.cat([dense["a"].reshape(-1), dense["b"]])
    flat_all = torch.cat([delta["a"].reshape(-1), delta["b"]])
    flat_res = torch.cat([up.residual["a"], up.residual["b"]])
    assert torch.equal(flat_sent + flat_res, flat_all)  # what is sent plus what is kept is the update
    full = encode(delta, layout, kappa=1)
    assert full.indices.numel() == 0 and full.nbytes == 8 * 4  # dense: 8 float32 values, no indices
    assert all(torch.equal(decode(full.indices, full.values, layout)[k], delta[k]) for k in delta)


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


def test_fedavg_settings_are_flowers_fedavg(monkeypatch):
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from reasonrl.methods.fed_grpo.apps import reply_content
    from reasonrl.methods.fed_grpo.client import RoundResult
    from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy

    g = {"w": torch.tensor([1.0, 2.0, 3.0])}
    locals_ = [torch.tensor([2.0, 2.0, 0.0]), torch.tensor([1.0, 5.0, 3.0])]
    counts = [3.0, 1.0]
    layout = Layout.of(g)
    fed = dict(min_clients=1, alpha=0.0, beta=0.0, server_lr=1.0, reward_momentum=0.9)
    strat = FedGRPOStrategy(layout, fed)
    strat.current = ArrayRecord(g)
    contents, plain = [], []
    for cid, (theta, n) in enumerate(zip(locals_, counts)):
        up = encode({"w": theta - g["w"]}, layout, kappa=1)
        contents.append(reply_content(RoundResult(up, {"signal": 0.3 * cid, "num-examples": n, "reward-mean": 0.5},
                                                  []), cid))
        plain.append(RecordDict({"arrays": ArrayRecord({"w": theta}),
                                 "metrics": MetricRecord({"num-examples": n})}))
    replies = flower_replies(monkeypatch, contents)
    arrays, metrics = strat.aggregate_train(1, replies)
    ours = arrays.to_torch_state_dict()["w"]
    flowers = aggregate_arrayrecords(plain, "num-examples").to_torch_state_dict()["w"]
    assert torch.allclose(ours, flowers) and ours.tolist() == pytest.approx([1.75, 2.75, 0.75])
    assert metrics["weight/c0"] == pytest.approx(0.75) and metrics["global_reward"] == pytest.approx(0.5)


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
    from reasonrl.methods.fed_grpo.strategy import REPORT_KEYS

    recipe = _fed_recipe(ROOT / "recipes" / "fed_grpo.yaml", tmp_path)
    received = []
    summary = simulate(recipe, tmp_path / "fed", on_reply=received.append)
    assert summary["rounds"] == 2 and set(summary["accuracy_by_round"]) == {"0", "1", "2"}
    assert len(received) == 6 and not any(m.has_error() for m in received)
    d = sum(p.numel() for p in _mini_weights().values())
    rows = [json.loads(x) for x in (tmp_path / "fed" / "metrics.jsonl").read_text().splitlines()]
    by_round = {r["step"]: r for r in rows}
    for msg in received:
        c = msg.content
        assert set(c.keys()) == {"update", "metrics"} and not c.config_records  # nowhere for text to go
        assert set(c["update"].keys()) == {"indices", "values"}
        assert c["update"]["indices"].dtype == "int32" and c["update"]["values"].dtype == "float32"
        assert set(c["metrics"].keys()) == REPORT_KEYS
        assert all(isinstance(v, (int, float)) for v in c["metrics"].values())
        k = c["update"]["values"].shape[0]
        assert k in (0, d // 32)  # kappa 32: the whole budget, or nothing when nothing changed
        assert c["metrics"]["payload-bytes"] == 8 * k  # int32 index + float32 value per entry
    for rnd in (1, 2):
        row = by_round[rnd]
        ups = [row[f"fed/bytes_up/c{c}"] for c in range(3)]
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

    from reasonrl.methods.fed_grpo.apps import client_train, simulate

    recipe = _fed_recipe(ROOT / "recipes" / "fed_avg.yaml", tmp_path)
    raw, out = recipe.to_dict(), (tmp_path / "fed").resolve()
    app = ClientApp()

    @app.train()
    def train(msg, context):
        if int(context.node_config["partition-id"]) == 1 and int(msg.content["config"]["server-round"]) == 1:
            raise RuntimeError("client 1 killed mid-round")
        return client_train(msg, context, raw, out)

    received = []
    summary = simulate(recipe, out, client_app=app, on_reply=received.append)
    assert summary["final_accuracy"] is not None
    rows = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert rows[1]["fed/clients/ok"] == 2 and rows[1]["fed/clients/failed"] == 1
    assert "fed/weight/c1" not in rows[1] and rows[1]["fed/weight/c0"] == pytest.approx(0.5)
    assert rows[2]["fed/clients/ok"] == 3 and rows[2]["fed/clients/failed"] == 0
    assert rows[2]["fed/bytes_up/c1"] == 4 * sum(p.numel() for p in _mini_weights().values())  # dense: values only
