"""PPO's critic: the value model's positions, the ``gae`` advantage on the pipeline, the critic's
update and warm-up, recipe checks, and exact resume with a critic."""

import pytest
import torch

from reasonrl.algos.critic import RETURNS_KEY, gae_advantages_and_returns
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.hooks import MethodContext
from reasonrl.train.critic import Critic
from reasonrl.policy.value import value_model_from_policy
from reasonrl.registry import ADVANTAGES
from reasonrl.metrics_log import read_metrics
from reasonrl.train.optim import Learner
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, comparable, crash_at_step, mini_policy, mini_recipe, weights

SOFT = [{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}]


def ppo_recipe(**extra):
    critic = {"name": "critic", "lr": 1e-3, "warmup_steps": 2, **extra.pop("critic", {})}
    return mini_recipe(advantage={"name": "gae", "lam": 0.9}, methods=[critic], rewards=SOFT,
                       train={"steps": 4, **extra.pop("train", {})}, eval={"size": 0}, **extra)


def a_batch(policy, lengths=((3, 4), (5, 2), (2, 6)), seed=0):
    """Rows with left-padded prompts of different lengths and right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    vocab = policy.model.config.vocab_size
    pad = policy.tokenizer.pad_token_id
    p_max, c_max = max(p for p, _ in lengths), max(c for _, c in lengths)
    prompt_ids = torch.full((len(lengths), p_max), pad)
    prompt_mask = torch.zeros((len(lengths), p_max), dtype=torch.long)
    completion_ids = torch.full((len(lengths), c_max), pad)
    completion_mask = torch.zeros((len(lengths), c_max), dtype=torch.long)
    for i, (p, c) in enumerate(lengths):
        prompt_ids[i, p_max - p:] = torch.randint(4, vocab, (p,), generator=g)
        prompt_mask[i, p_max - p:] = 1
        completion_ids[i, :c] = torch.randint(4, vocab, (c,), generator=g)
        completion_mask[i, :c] = 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


@pytest.mark.parametrize("pad_is_eos", [False, True], ids=["char-pad", "pad-is-eos"])
def test_values_are_read_where_the_policy_predicts_each_completion_token(pad_is_eos):
    """V(s_t) comes from the position that predicts completion token t, whatever the padding:
    each row's values equal those of the same row run alone without padding (pad == EOS, as
    SmolLM2's tokenizer has it, included)."""
    policy = mini_policy(pad_is_eos=pad_is_eos)
    model = value_model_from_policy(policy)
    torch.nn.init.normal_(model.head.weight, generator=torch.Generator().manual_seed(1))
    p_ids, p_mask, c_ids, c_mask = a_batch(policy)
    with torch.no_grad():
        batched = model(p_ids, p_mask, c_ids, c_mask)
        for i in range(len(p_ids)):
            prompt = p_ids[i][p_mask[i].bool()]
            completion = c_ids[i][c_mask[i].bool()]
            ids = torch.cat([prompt, completion]).unsqueeze(0)
            hidden = model.backbone(input_ids=ids).last_hidden_state[0]
            expected = model.head(hidden[len(prompt) - 1:len(prompt) - 1 + len(completion)]).squeeze(-1)
            got = batched[i][c_mask[i].bool()]
            assert torch.allclose(got, expected, atol=1e-5), (i, got, expected)
    assert torch.all(batched[~c_mask.bool()] == 0)


def test_a_new_critic_predicts_zero_and_does_not_alias_the_policy():
    policy = mini_policy()
    model = value_model_from_policy(policy)
    p_ids, p_mask, c_ids, c_mask = a_batch(policy)
    assert torch.all(model(p_ids, p_mask, c_ids, c_mask) == 0)  # zero head: V = 0 until it learns
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with torch.no_grad():
        for p in model.backbone.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())


def test_the_gae_advantage_takes_the_critics_values_and_leaves_the_returns():
    gae = ADVANTAGES.get("gae")
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = type("B", (), {"aux": {}})()
    adv = gae(rewards, mask, torch.tensor([0, 0]), values=values, batch=batch, gamma=1.0, lam=1.0, whiten=False)
    # gamma = lambda = 1: A_t = (sum of rewards from t on) - V_t; R_t = A_t + V_t.
    assert torch.allclose(adv, torch.tensor([[0.8, 0.6, 0.4], [0.4, 0.2, 0.0]]))
    assert torch.allclose(batch.aux[RETURNS_KEY], torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.0]]))
    ref_adv, ref_ret = gae_advantages_and_returns(rewards, values, mask, 1.0, 0.9, True)
    adv = gae(rewards, mask, torch.tensor([0, 0]), values=values, batch=batch, gamma=1.0, lam=0.9)
    assert torch.equal(adv, ref_adv) and torch.equal(batch.aux[RETURNS_KEY], ref_ret)


def test_recipes_that_cannot_feed_the_critic_or_the_advantage_are_rejected():
    with pytest.raises(ConfigError, match=r"advantage 'gae' reads batch.aux\['values'\].*written by method 'critic'"):
        mini_recipe(advantage={"name": "gae"})
    with pytest.raises(ConfigError, match=r"method 'critic' \(after the update\) reads batch.aux\['returns'\].*"
                                          r"written by advantage 'copc', advantage 'gae'"):
        mini_recipe(methods=[{"name": "critic"}])
    with pytest.raises(ConfigError, match=r"unknown parameter 'advantage.values'"):
        mini_recipe(advantage={"name": "gae", "values": 1.0}, methods=[{"name": "critic"}])
    with pytest.raises(ConfigError, match=r"methods\[0\].lr must be > 0"):
        mini_recipe(advantage={"name": "gae"}, methods=[{"name": "critic", "lr": 0.0}])
    with pytest.raises(ConfigError, match=r"advantage.lam must be <= 1"):
        mini_recipe(advantage={"name": "gae", "lam": 1.5}, methods=[{"name": "critic"}])


def critic_on(policy, **params):
    critic = Critic(**params)
    recipe = mini_recipe(advantage={"name": "gae"}, methods=[{"name": "critic"}])
    critic.setup(MethodContext(recipe=recipe, policy=policy, run_dir=None, log=lambda m: None,
                               learner=lambda ps, optim: Learner(ps, optim, 10)))
    return critic


def scored_batch(policy):
    p_ids, p_mask, c_ids, c_mask = a_batch(policy, lengths=((3, 4), (5, 2), (2, 6), (4, 5)))
    n = len(p_ids)
    batch = RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask,
                         sample_logprobs=torch.zeros(c_ids.shape), rewards=torch.tensor([1.0, 0.0, 1.0, 0.5]),
                         group_ids=torch.tensor([0, 0, 1, 1]), truncated=torch.zeros(n, dtype=torch.bool))
    return batch


def test_the_critic_fits_the_returns():
    policy = mini_policy()
    critic = critic_on(policy, lr=3e-3, clip=None)
    batch = scored_batch(policy)
    critic.annotate(batch, 0)
    returns = batch.rewards.unsqueeze(-1) * batch.response_mask  # a Monte-Carlo target on every token
    batch.aux[RETURNS_KEY] = returns
    first = critic.after_update(batch, 0)["critic/value_loss"]
    for _ in range(30):
        last = critic.after_update(batch, 0)["critic/value_loss"]
    # The first loss is that of V = 0: 1/2 mean(R^2) over the tokens.
    expected = 0.5 * float((returns ** 2).sum() / batch.response_mask.sum())
    assert first == pytest.approx(expected, rel=1e-5)
    assert last < 0.2 * first


def test_the_critic_step_does_not_depend_on_the_micro_batch_split():
    states = []
    for micro in (1, 4):
        policy = mini_policy()
        critic = critic_on(policy, lr=1e-2, micro_batch_size=micro, clip=0.05)
        batch = scored_batch(policy)
        critic.annotate(batch, 0)
        batch.aux[RETURNS_KEY] = batch.rewards.unsqueeze(-1) * batch.response_mask
        m = critic.after_update(batch, 0)
        states.append((critic.value_model.state_dict(), m))
    (a, ma), (b, mb) = states
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert ma["critic/value_loss"] == pytest.approx(mb["critic/value_loss"], rel=1e-5)


def test_warm_up_holds_the_policy_while_the_critic_learns(tmp_path):
    Trainer(ppo_recipe(train={"steps": 3, "checkpoint_every": 1, "keep_checkpoints": 3}), tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "critic/value_loss" in r]
    assert [r.get("policy_held") for r in rows] == [1, 1, None]
    assert "loss" not in rows[0] and "loss" in rows[2]
    ckpt = tmp_path / "run" / "checkpoints"
    states = [torch.load(ckpt / f"step_00000{s}" / "state.pt", weights_only=False) for s in (1, 2)]
    from safetensors.torch import load_file

    w = [load_file(str(ckpt / f"step_00000{s}" / "model" / "model.safetensors")) for s in (1, 2, 3)]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])  # held: the policy did not move
    assert any(not torch.equal(w[1][k], w[2][k]) for k in w[1])  # after the warm-up it does
    head = [s["methods"]["critic"]["value_model"]["head.weight"] for s in states]
    assert not torch.equal(head[0], head[1])  # while the critic learned


def test_ppo_with_a_critic_resumes_exactly(tmp_path, monkeypatch):
    recipe = ppo_recipe(train={"steps": 4, "checkpoint_every": 1})
    Trainer(recipe, tmp_path / "a", log=lambda m: None).run()
    with crash_at_step(monkeypatch, 3):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()
    rows = comparable(read_metrics(tmp_path / "a"))
    assert rows == comparable(read_metrics(tmp_path / "b"))
    assert sum("critic/explained_variance" in r for r in rows) == 4
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ca = torch.load(tmp_path / "a" / "checkpoints" / "step_000004" / "state.pt", weights_only=False)
    cb = torch.load(tmp_path / "b" / "checkpoints" / "step_000004" / "state.pt", weights_only=False)
    va, vb = ca["methods"]["critic"]["value_model"], cb["methods"]["critic"]["value_model"]
    assert all(torch.equal(va[k], vb[k]) for k in va)


def test_a_separate_small_critic_model_runs(tmp_path):
    small = {"backend": "tiny", "tiny": {**MINI_TINY, "hidden_size": 16, "intermediate_size": 32, "seed": 3}}
    Trainer(ppo_recipe(critic={"model": small, "warmup_steps": 0}, train={"steps": 2}), tmp_path / "run",
            log=lambda m: None).run()
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["methods"]["critic"]["value_model"]["head.weight"].shape == (1, 16)
