"""Fed-GRPO on LoRA adapters: what a client trains, encodes and sends is the adapters and nothing
else, and the server's step lands on them exactly. On the mini model (fast) and on the shipped
GSM8K recipe with SmolLM2-135M (a real tokenizer, slow)."""

from pathlib import Path

import pytest
import torch

from reasonrl.config import load_recipe, recipe_from_dict
from reasonrl.methods.fed_grpo.codec import Layout, decode

from helpers import MINI_TINY, flower_replies

pytest.importorskip("flwr")
ROOT = Path(__file__).resolve().parents[1]
PARITY = f"{ROOT / 'tests' / 'test_fed_grpo.py'}:digit_parity"


def fed_recipe(path, sets, **fed):
    recipe = load_recipe(path, sets)
    raw = recipe.to_dict()
    raw["methods"][0].update(fed)
    return recipe_from_dict(raw, "test")


def one_round(recipe, client_dir, monkeypatch, global_weights=None):
    """Client 0's round from ``global_weights`` (default: its own starting adapters), both halves
    (its report, then its budget's sparse update), aggregated alone by the strategy; returns
    (client, global, update, the server's new weights, metrics)."""
    from flwr.app import ArrayRecord

    from reasonrl.methods.fed_grpo.apps import reply_content, update_content
    from reasonrl.methods.fed_grpo.client import FedClient, fed_settings
    from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy

    client = FedClient(recipe, 0, client_dir)
    glob = global_weights if global_weights is not None else client.trainer.policy.weights()
    result = client.train_round(glob, None)
    strategy = FedGRPOStrategy(Layout.of(glob), fed_settings(recipe))
    strategy.current = ArrayRecord(glob)
    trained = flower_replies(monkeypatch, [reply_content(result, 0)])
    [budget] = strategy.budgets([m.content["metrics"] for m in trained])
    update = client.send(budget)
    arrays, metrics = strategy.aggregate(1, trained, flower_replies(monkeypatch, [update_content(update, 0)]))
    return client, glob, update, arrays.to_torch_state_dict(), metrics


def check_adapter_round(policy_model, client, glob, update, new, metrics, kappa):
    layout = Layout.of(glob)
    adapters = {n: p for n, p in policy_model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    assert layout.names and all("lora_" in n for n in layout.names)  # only adapters travel
    assert layout.dim == sum(p.numel() for p in adapters.values())
    k = layout.dim // kappa  # one client: its floor(d/kappa) slots (its update has more non-zeros)
    assert metrics["budget/c0"] == k and metrics["nonzeros/c0"] > k
    assert update.values.numel() == k and bool((update.values != 0).all()) and int(update.indices.max()) < layout.dim and update.nbytes == 8 * k
    assert metrics["bytes_up/c0"] == 8 * k and metrics["weight/c0"] == 1.0
    sent = decode(update.indices, update.values, layout)
    assert any(sent[n].abs().sum() > 0 for n in layout.names)  # the round moved the adapters
    local = client.trainer.policy.weights()
    for n in layout.names:
        assert torch.equal(new[n], glob[n] + sent[n])  # the server's step is the decoded update
        # what was sent plus what the client keeps (error feedback) is its whole local update
        torch.testing.assert_close((sent[n] + client.residual[n].view_as(sent[n])), local[n] - glob[n])


def test_lora_federation_sends_only_adapters(tmp_path, monkeypatch):
    from reasonrl.policy.factory import build_policy

    sets = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    sets += ['model.lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}',
             "rollout.num_generations=4", "rollout.max_new_tokens=16", "train.prompts_per_step=4",
             "train.micro_batch_size=16", "train.threads=1", "log.progress=false", "optim.lr=1e-2",
             f'rewards=[{{"name": "{PARITY}"}}]']
    recipe = fed_recipe(ROOT / "recipes" / "fed_grpo.yaml", sets, local_steps=2, kappa=8, min_clients=1)
    server = build_policy(recipe.model)  # the server's global model: the same LoRA recipe
    base = {n: p.detach().clone() for n, p in server.model.named_parameters() if "lora_" not in n}
    client, glob, update, new, metrics = one_round(recipe, tmp_path / "c0", monkeypatch, server.weights())
    check_adapter_round(server.model, client, glob, update, new, metrics, kappa=8)
    server.set_weights(new)  # the new global adapters fit the server's model
    frozen = [(n, p) for n, p in server.model.named_parameters() if "lora_" not in n]
    assert frozen, "the server's model has no base weights"
    assert all(torch.equal(p, base[n]) for n, p in frozen)
    assert all(torch.equal(t, new[n]) for n, t in server.weights().items())


@pytest.mark.slow
def test_gsm8k_smollm2_recipe_one_client_round(tmp_path, monkeypatch):
    """recipes/fed_grpo_gsm8k_smollm2.yaml, shrunk: client 0 of the solution-length split on a
    real tokenizer, one local step, its r-16 adapters compressed 32x."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from reasonrl.methods.fed_grpo.sampler import solution_steps

    recipe = fed_recipe(ROOT / "recipes" / "fed_grpo_gsm8k_smollm2.yaml",
                        ["train.prompts_per_step=5", "rollout.num_generations=2", "rollout.max_new_tokens=8",
                         "train.micro_batch_size=4", "log.progress=false", "loss.entropy_coef=0.001"],
                        local_steps=1, min_clients=1)
    client, glob, update, new, metrics = one_round(recipe, tmp_path / "c0", monkeypatch)
    assert Layout.of(glob).dim == 4_884_480  # 30 layers x 16 x (2x(576+576) + 2x(576+192) + 3x(576+1536))
    check_adapter_round(client.trainer.policy.model, client, glob, update, new, metrics, kappa=32)
    problems = client.trainer.sampler.problems(0, 5)
    assert sum(solution_steps(p) == 2 for p in problems) == 4  # round(0.8 x 5) from client 0's home group
