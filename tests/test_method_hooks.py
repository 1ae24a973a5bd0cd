"""The method hooks, declared batch keys, plugin optimisers and losses, the loss mask."""

from types import SimpleNamespace

import pytest
import torch

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.config import ConfigError, LossConfig
from reasonrl.dataflow import declares
from reasonrl.hooks import Method, build_methods
from reasonrl.params import Component
from reasonrl.registry import ADVANTAGES, METHODS
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import Totals, micro_batch_loss
from reasonrl.train.trainer import Trainer, outcome_token_rewards

from helpers import MINI_TINY, comparable, crash_at_step, mini_policy, mini_recipe, weights

BONUS = "toy_bonus"


class ToyMethod(Method):
    """Owns a random stream (noise on the advantages), a learned scalar trained with its own
    Learner (a running estimate of the mean reward), and a counter: every kind of state."""

    writes = (BONUS,)

    @classmethod
    def declared_keys(cls, config):
        return {"annotate": ((BONUS,), ())}

    def __init__(self, scale: float = 0.1, lr: float = 0.1):
        self.scale, self.lr = scale, lr
        self.steps = 0

    def setup(self, ctx):
        from reasonrl.config import OptimConfig

        self.generator = torch.Generator().manual_seed(1234)
        self.baseline = torch.nn.Parameter(torch.zeros(()))
        self.learner = ctx.learner([self.baseline], OptimConfig(lr=self.lr, warmup_steps=0))
        self.run_dir = ctx.run_dir

    def annotate(self, batch, step):
        noise = torch.randn(len(batch), generator=self.generator) * self.scale
        batch.aux[BONUS] = noise.unsqueeze(-1).expand_as(batch.completion_mask).clone()
        return {"toy/noise_mean": float(noise.mean())}

    def after_update(self, batch, step):
        def loss_fn(micro, mini, _p, _j):
            return (self.baseline - micro.rewards.mean()) ** 2 * len(micro) / len(mini), {"mse": 1.0}

        self.learner.optimise(batch, loss_fn, micro_batch_size=5)
        self.steps += 1
        return {"toy/baseline": float(self.baseline), "toy/steps": self.steps}

    def state_dict(self):
        return {"generator": self.generator.get_state(), "baseline": self.baseline.detach().clone(),
                "steps": self.steps, **self.learner.state_dict()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        with torch.no_grad():
            self.baseline.copy_(state["baseline"])
        self.steps = state["steps"]
        self.learner.load_state_dict(state)


@declares(consumes=(BONUS,))
def toy_advantage(token_rewards, response_mask, group_ids, *, batch):
    return grpo_advantages(token_rewards, response_mask, group_ids) + batch.aux[BONUS] * response_mask


class Unread(Method):
    @classmethod
    def declared_keys(cls, config):
        return {"annotate": (("nobody_reads_this",), ())}


@pytest.fixture
def toy_components():
    METHODS._items["_toy"] = ToyMethod
    METHODS._items["_unread"] = Unread
    ADVANTAGES._items["_toy_adv"] = toy_advantage
    yield
    for reg, name in ((METHODS, "_toy"), (METHODS, "_unread"), (ADVANTAGES, "_toy_adv")):
        del reg._items[name]


def toy_recipe(**extra):
    return mini_recipe(methods=[{"name": "_toy", "scale": 0.5}], advantage={"name": "_toy_adv"},
                       rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                       train={"steps": 4}, eval={"size": 0}, **extra)


def test_a_method_defined_through_the_hooks_runs_checkpoints_and_resumes_exactly(tmp_path, toy_components, monkeypatch):
    recipe = toy_recipe()
    Trainer(recipe, tmp_path / "a", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "a") if "loss" in r]
    assert [r["toy/steps"] for r in rows] == [1, 2, 3, 4]
    assert len({r["toy/baseline"] for r in rows}) == 4  # it learns, through its own Learner
    assert len({r["toy/noise_mean"] for r in rows}) == 4

    with crash_at_step(monkeypatch, 2):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    state = torch.load(tmp_path / "b" / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["methods"]["_toy"]["steps"] == 2
    Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()
    assert comparable(read_metrics(tmp_path / "a")) == comparable(read_metrics(tmp_path / "b"))
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_method_changes_training(tmp_path, toy_components):
    Trainer(toy_recipe(), tmp_path / "toy", log=lambda m: None).run()
    Trainer(mini_recipe(rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                        train={"steps": 4}, eval={"size": 0}), tmp_path / "grpo", log=lambda m: None).run()
    wa, wb = weights(tmp_path / "toy"), weights(tmp_path / "grpo")
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


def test_a_reader_without_a_writer_is_rejected_at_load(toy_components):
    with pytest.raises(ConfigError, match=r"advantage '_toy_adv' reads batch.aux\['toy_bonus'\], which no earlier "
                                          r"stage of the recipe writes; written by method '_toy'"):
        mini_recipe(advantage={"name": "_toy_adv"})
    with pytest.raises(ConfigError, match=r"advantage 'residual' reads batch.aux\['teacher_token_prob'.*written by "
                                          r"method 'residual_teacher' \(a `teacher:` section in the recipe\)"):
        mini_recipe(advantage={"name": "residual"})
    with pytest.raises(ConfigError, match=r"method '_unread' writes batch.aux\['nobody_reads_this'\], which no stage"):
        mini_recipe(methods=[{"name": "_unread"}])
    with pytest.raises(ConfigError, match=r"method 'residual_teacher' writes .*which no stage"):
        mini_recipe(teacher={"model": {"backend": "tiny"}})  # a teacher whose output no advantage reads
    with pytest.raises(ConfigError, match=r"unknown parameter 'methods\[0\].scal'.*Did you mean 'scale'"):
        mini_recipe(methods=[{"name": "_toy", "scal": 1}], advantage={"name": "_toy_adv"})


PLUGIN = '''
from typing import Annotated

import torch

from reasonrl.algos.losses import PolicyLossOutput
from reasonrl.params import Range
from reasonrl.registry import OPTIMIZERS, POLICY_LOSSES


class SignSGD(torch.optim.Optimizer):
    """w <- w - lr * sign(g): every weight with a gradient moves by exactly lr."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(torch.sign(p.grad), alpha=-group["lr"])


@OPTIMIZERS.register("_plugin_signsgd")
def sign_sgd(parameters, *, lr, betas, weight_decay):
    return SignSGD(parameters, lr)


@POLICY_LOSSES.register("_plugin_reinforce")
def reinforce(logprobs, old_logprobs, advantages, response_mask, *, scale: Annotated[float, Range(gt=0)] = 1.0):
    """-scale * A * logp: plain REINFORCE, logging the mean advantage as its own metric."""
    valid = response_mask.bool()
    loss = torch.where(valid, -scale * advantages * logprobs, 0.0)
    zero = torch.zeros_like(loss)
    return PolicyLossOutput(loss=loss, clipped=zero, ratio=torch.where(valid, 1.0, zero),
                            extra={"plugin/advantage": torch.where(valid, advantages, zero)})
'''


def test_an_optimiser_and_a_policy_loss_from_a_plugin_file(tmp_path):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN)
    common = dict(plugins=[str(plugin)], train={"steps": 1}, eval={"size": 0},
                  rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}])
    recipe = mini_recipe(optim={"name": "_plugin_signsgd", "lr": 1e-3, "warmup_steps": 0, "max_grad_norm": 1e9},
                         loss={"policy": "_plugin_reinforce", "params": {"scale": 2.0}}, **common)
    assert recipe.optim.name == "_plugin_signsgd" and recipe.loss.params == {"scale": 2.0}
    trainer = Trainer(recipe, tmp_path / "r", log=lambda m: None)
    trainer.run()
    from reasonrl.policy.tiny import TinySpec, load_tiny_policy


    before = {k: v.detach().clone() for k, v in load_tiny_policy(TinySpec(**MINI_TINY)).model.named_parameters()}
    after = dict(trainer.policy.model.named_parameters())
    steps = torch.cat([(after[k].detach() - before[k]).abs().flatten() for k in before])
    moved = steps[steps > 0]
    assert len(moved) > len(steps) // 2
    torch.testing.assert_close(moved, torch.full_like(moved, 1e-3), atol=1e-6, rtol=0)  # SignSGD, not AdamW
    row = [r for r in read_metrics(tmp_path / "r") if "loss" in r][0]
    assert "plugin/advantage" in row and row["clip_fraction"] == 0.0
    with pytest.raises(ConfigError, match=r"loss.scale must be > 0, got -1.0"):
        mini_recipe(loss={"policy": "_plugin_reinforce", "params": {"scale": -1.0}}, **common)
    with pytest.raises(ConfigError, match=r"unknown parameter 'loss.beta'"):
        mini_recipe(loss={"policy": "_plugin_reinforce", "params": {"beta": 1.0}}, **common)
    with pytest.raises(ConfigError, match=r"unknown parameter 'optim.params.momentum'"):
        mini_recipe(optim={"name": "_plugin_signsgd", "params": {"momentum": 0.9}}, **common)


def test_optimiser_and_schedule_names_are_checked():
    with pytest.raises(ConfigError, match=r"optim.name: unknown optimizer 'adamm'.*Did you mean 'adamw'"):
        mini_recipe(optim={"name": "adamm"})
    with pytest.raises(ConfigError, match=r"optim.schedule: unknown LR schedule 'cosin'.*Did you mean 'cosine'"):
        mini_recipe(optim={"schedule": "cosin"})
    assert mini_recipe(optim={"name": "sgd", "params": {"momentum": 0.9}}).optim.params == {"momentum": 0.9}


# --- the loss mask: attended but not trained on ------------------------------------------

def sampled(policy, seed=0):
    from reasonrl.batch import RolloutBatch

    s = policy.sample(["1+2*3;", "(4+5)*2;"], 3, 10, temperature=1.0, generator=torch.Generator().manual_seed(seed))
    n = s.completion_ids.shape[0]
    return RolloutBatch(prompt_ids=s.prompt_ids, prompt_mask=s.prompt_mask, completion_ids=s.completion_ids,
                        completion_mask=s.completion_mask, group_ids=torch.arange(2).repeat_interleave(3),
                        rewards=torch.arange(n, dtype=torch.float32) % 2, truncated=s.truncated)


def test_loss_mask_excludes_tokens_from_the_loss_but_not_from_attention():
    policy = mini_policy()
    batch = sampled(policy)
    keep = torch.ones_like(batch.completion_mask)
    keep[:, 2:5] = 0  # an environment's tokens, say: attended, not trained on
    batch.loss_mask = keep
    r = batch.response_mask
    assert torch.equal(r, batch.completion_mask * keep) and torch.equal(batch.attention_mask[:, -r.shape[1]:],
                                                                        batch.completion_mask)
    # The outcome reward sits on the last trained token; advantages are zero off the response mask.
    last = outcome_token_rewards(batch)
    assert ((last != 0) <= r.bool()).all()
    batch.advantages = grpo_advantages(last, r, batch.group_ids)
    assert (batch.advantages[~r.bool()] == 0).all()
    cfg = LossConfig()
    n = int(r.sum())
    loss, stats = micro_batch_loss(policy, batch, cfg, Totals(tokens=n, seqs=len(batch), norm_len=10), 1.0, True)
    assert stats["tokens"] == n
    policy.model.zero_grad()
    loss.backward()
    got = [p.grad.clone() for p in policy.parameters()]
    # By hand: ratio 1 on fresh data, so the token-mean loss is −Σ_{t∈R} A_t·logp_t / |R| in value
    # gradient, with logp computed under full attention (the masked tokens are still context).
    policy.model.zero_grad()
    logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                         batch.completion_mask, batch.group_ids)
    (-(batch.advantages * logp * r).sum() / n).backward()
    for a, b in zip(got, (p.grad for p in policy.parameters())):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # The masked tokens really are attended: dropping them from the completion changes later log-probs.
    cut = batch.completion_mask * keep
    alt, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, cut, batch.group_ids)
    later = batch.completion_mask.bool().clone()
    later[:, :5] = False
    assert not torch.allclose(alt[later], logp.detach()[later])


def test_a_method_still_defining_the_folded_metrics_hook_is_refused():
    """``metrics()`` was folded into ``after_update``: a method that still defines it would lose its
    metrics silently, so building it fails and says where they go now."""
    @METHODS.register("old_metrics_hook")
    class Old(Method):
        def metrics(self):
            return {"old/x": 1.0}

    with pytest.raises(TypeError, match="after_update"):
        build_methods(SimpleNamespace(methods=[Component("old_metrics_hook")]))
    assert build_methods(SimpleNamespace(methods=[])) == []
