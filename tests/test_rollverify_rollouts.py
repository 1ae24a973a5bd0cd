"""RollVerify wired into the sync source's simulated partial rollouts (``rollout.simulated_partial``).

The learner π is the mini policy with perturbed weights; the stale snapshot μ holds its initial
weights (the source's step-0 snapshot), so the two differ enough for the checks to act.
"""

import subprocess
import sys

import pytest
import torch

from reasonrl.methods.rollverify.maths import residual_distribution
from reasonrl.config import ConfigError
from reasonrl.perf import Stopwatch
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rewards.scorer import build_scorer
from reasonrl.rollout.partial import _stop_cut
from reasonrl.rollout.sources import SourceContext, SyncSource
from reasonrl.tasks.base import build_task

from helpers import mini_policy, mini_recipe, straight_and_resumed

J, T, STALE, CURRENT = 6, 0.8, 0, 3  # switch after J tokens; temperature; the two versions


def source(rollout=None, pad_is_eos=False, scale=0.05):
    """A sync source with staleness whose learner π has moved away from its stale snapshot μ."""
    r = mini_recipe(rollout={"simulated_staleness": 1, "temperature": T, **(rollout or {})})
    policy = mini_policy(pad_is_eos=pad_is_eos)
    task = build_task(r)
    sampler = PROMPT_SAMPLERS.get(r.sampler.name)(task=task, seed=r.train.seed, **r.sampler.params)
    src = SyncSource(SourceContext(r, policy, build_scorer(r), task, sampler, torch.Generator().manual_seed(0),
                                   lambda m: None))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return src


def batch_of(rollout=None, **kw):
    src = source(rollout, **kw)
    batch, _, _ = src.next_batch(0, CURRENT, Stopwatch())
    return src, batch


def partial(check=None, **kw):
    return batch_of({"simulated_partial": J, **({"prefix_check": check} if check else {})}, **kw)


@torch.no_grad()
def logprobs(policy, b):
    policy.model.eval()
    return policy.completion_logprobs(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask,
                                      temperature=T)[0]


def lengths(b):
    return b.completion_mask.sum(-1).tolist()


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# -- the switch ---------------------------------------------------------------------------------

def test_simulated_partial_0_is_todays_batch_bit_for_bit():
    src_a, a = batch_of()
    src_b, b = batch_of({"simulated_partial": 0})
    assert src_b.partial is None and src_b.metrics() == {}
    for key in ("prompt_ids", "completion_ids", "completion_mask", "sample_logprobs", "rewards", "truncated"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert a.token_versions is None and b.token_versions is None and a.policy_version == b.policy_version


def test_the_first_j_tokens_are_todays_stale_tokens():
    _, today = batch_of()
    src, b = partial()
    running = set(src.partial.last["running"].tolist())
    assert 0 < len(running) < len(b)  # some rows ended within J tokens, some ran on
    for i, (m_today, m) in enumerate(zip(lengths(today), lengths(b))):
        k = min(m_today, J)
        assert torch.equal(b.completion_ids[i, :k], today.completion_ids[i, :k])
        assert torch.equal(b.sample_logprobs[i, :k], today.sample_logprobs[i, :k])
        if i not in running:  # ended within J tokens: exactly today's row
            assert m == m_today and bool(b.truncated[i]) == bool(today.truncated[i])


def test_keep_continues_under_pi_with_each_tokens_version_and_log_prob():
    src, b = partial()
    running = src.partial.last["running"].tolist()
    assert 0 < len(running) < len(b)  # both branches below are checked
    mu, pi = logprobs(src.behaviour, b), logprobs(src.ctx.policy, b)
    for i, m in enumerate(lengths(b)):
        v, lp = b.token_versions[i, :m], b.sample_logprobs[i, :m]
        if i in running:
            assert m > J and (v[:J] == STALE).all() and (v[J:] == CURRENT).all()
            close(lp[:J], mu[i, :J])
            close(lp[J:], pi[i, J:m])
        else:
            assert (v == STALE).all()
            close(lp, mu[i, :m])
    assert b.policy_version == STALE
    metrics = src.metrics()
    assert metrics["partial/prefix_tokens"] == J * len(running) and metrics["partial/regenerated_tokens"] == 0
    assert metrics["rollverify/fully_accepted_fraction"] == 1.0 and metrics["partial/ops_mean_abs"] > 0
    assert src.metrics() == {}  # reported once per batch


def test_discard_regenerates_every_running_row_under_pi():
    src, b = partial({"name": "discard"})
    _, kept = partial()
    running = src.partial.last["running"].tolist()
    assert 0 < len(running) < len(b)  # both branches below are checked
    pi, mu = logprobs(src.ctx.policy, b), logprobs(src.behaviour, b)
    for i, m in enumerate(lengths(b)):
        if i in running:
            assert (b.token_versions[i, :m] == CURRENT).all()
            close(b.sample_logprobs[i, :m], pi[i, :m])
        else:
            assert (b.token_versions[i, :m] == STALE).all()
            assert torch.equal(b.completion_ids[i, :m], kept.completion_ids[i, :m])  # an ended row stays
            close(b.sample_logprobs[i, :m], mu[i, :m])
    assert src.metrics()["partial/regenerated_tokens"] == J * len(running)


def test_rollverify_token_cuts_at_the_first_rejection_and_draws_from_the_residual():
    src, b = partial({"name": "rollverify_token"})
    _, stale = partial()  # the same stale prefixes (the check draws after them)
    last = src.partial.last
    pi_pol, mu_pol = src.ctx.policy, src.behaviour
    pi = logprobs(pi_pol, b)
    replaced = 0
    for r, i in enumerate(last["running"].tolist()):
        k, y = int(last["kept"][r]), int(last["replacement"][r])
        assert 0 <= k <= J
        assert torch.equal(b.completion_ids[i, :k], stale.completion_ids[i, :k])
        m = lengths(b)[i]
        assert (b.token_versions[i, :m] == CURRENT).all()  # verified: treated as on-policy
        close(b.sample_logprobs[i, :m], pi[i, :m])
        if y < 0:
            assert k == J
            continue
        replaced += 1
        assert k < J and int(b.completion_ids[i, k]) == y
        assert y != int(stale.completion_ids[i, k])  # a rejected token has no residual mass
        ids, mask = b.completion_ids[i:i + 1, :k + 1], b.completion_mask[i:i + 1, :k + 1]
        with torch.no_grad():  # π's and μ's sampling distributions at t*, given the kept prefix
            p = [torch.softmax(pol.completion_logits(b.prompt_ids[i:i + 1], b.prompt_mask[i:i + 1], ids, mask)[0, k]
                               .float() / T, -1) for pol in (pi_pol, mu_pol)]
        assert residual_distribution(p[0], p[1])[y] > 0
    assert replaced > 0  # the test bites: some prefixes were cut
    assert max(lengths(b)) <= 24 and all(bool(t) == (m == 24) for t, m in zip(b.truncated, lengths(b)))
    metrics = src.metrics()
    assert metrics["partial/regenerated_tokens"] == sum(J - int(k) for k in last["kept"]) > 0
    assert b.policy_version == (STALE if len(last["running"]) < len(b) else CURRENT)  # the oldest token's


def test_rollverify_sequence_at_the_extremes_is_keep_and_discard():
    src, lax = partial({"name": "rollverify_sequence", "tau_seq": 1e9})
    _, kept = partial()
    assert torch.equal(lax.completion_ids, kept.completion_ids)  # every prefix kept
    running = src.partial.last["running"].tolist()
    assert all((lax.token_versions[i, :J] == CURRENT).all() for i in running)  # ... as on-policy
    src, strict = partial({"name": "rollverify_sequence", "tau_seq": 0.0})
    _, dropped = partial({"name": "discard"})
    for key in ("completion_ids", "completion_mask", "sample_logprobs", "token_versions", "truncated"):
        assert torch.equal(getattr(strict, key), getattr(dropped, key)), key
    assert src.metrics()["rollverify/sequence_kept_fraction"] == 0.0


def test_rollverify_deterministic_cuts_at_the_first_large_log_ratio():
    src, b = partial({"name": "rollverify_deterministic", "tau_tok": 0.3})
    _, stale = partial()
    last = src.partial.last
    d = logprobs(src.ctx.policy, stale) - stale.sample_logprobs
    for r, i in enumerate(last["running"].tolist()):
        k = int(last["kept"][r])
        assert (d[i, :k].abs() <= 0.3 + 1e-4).all() and (k == J or d[i, k].abs() > 0.3 - 1e-4)
        assert torch.equal(b.completion_ids[i, :k], stale.completion_ids[i, :k])
    assert int(last["replacement"].max()) == -1


@pytest.mark.parametrize("check", [None, {"name": "rollverify_token"}], ids=["keep", "rollverify_token"])
def test_rows_end_correctly_across_the_switch_when_pad_is_eos(check):
    src, b = partial(check, pad_is_eos=True)
    eos, pad = src.ctx.policy.tokenizer.eos_token_id, src.ctx.policy.tokenizer.pad_token_id
    assert eos == pad
    assert len(src.partial.last["running"]) > 0
    ended = 0
    for row, mask, trunc in zip(b.completion_ids, b.completion_mask, b.truncated):
        k = int(mask.sum())
        assert mask[:k].all() and not mask[k:].any() and (row[k:] == pad).all()
        assert bool(trunc) == (row[k - 1] != eos) and not (row[:k - 1] == eos).any()
        assert bool(trunc) == (k == 24)
        ended += not bool(trunc)
    assert ended > 0


def test_a_stop_string_spanning_the_switch_ends_the_row():
    tok = mini_policy().tokenizer
    ids = torch.tensor(tok.convert_tokens_to_ids(list("12;;34")))
    assert _stop_cut(tok, ids, [";;"]) == 4 and _stop_cut(tok, ids, ["#"]) is None
    stop = "7+"  # at this seed, row 6's stale prefix ends in "7" and π's first token is "+"
    src, b = batch_of({"simulated_partial": J, "stop": [stop]})
    spanning = 0
    for i, (row, mask, trunc, text) in enumerate(zip(b.completion_ids, b.completion_mask, b.truncated,
                                                     b.meta["completion"])):
        k = int(mask.sum())
        pieces = [tok.decode([t], skip_special_tokens=True) for t in row[:k].tolist()]
        full, head = "".join(pieces), "".join(pieces[:J])
        assert stop not in text and stop not in "".join(pieces[:-1])  # the row ended at its first stop string
        if stop in full:
            assert not trunc and full.endswith(stop) and text == full[:-len(stop)]
            spanning += i in src.partial.last["running"].tolist() and full.find(stop) < len(head) < len(full)
    assert spanning > 0, "no row's stop string spans the switch at this seed: pick another stop string"


# -- recipes ------------------------------------------------------------------------------------

BAD = [
    ({"simulated_partial": 4}, "rollout.simulated_partial needs rollout.simulated_staleness"),
    ({"simulated_staleness": 1, "simulated_partial": 24}, "rollout.simulated_partial=24 must be below"),
    ({"simulated_staleness": 1, "prefix_check": {"name": "discard"}}, "rollout.prefix_check decides"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "prefix_check": {"name": "rollverfy_token"}},
     "rollout.prefix_check.name: unknown prefix check 'rollverfy_token'.*Did you mean 'rollverify_token'"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "prefix_check": {"name": "rollverify_sequence", "tau_seq": -0.1}},
     "rollout.prefix_check.tau_seq must be >= 0"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "prefix_check": {"name": "rollverify_deterministic", "tau_tok": -1}},
     "rollout.prefix_check.tau_tok must be >= 0"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "prefix_check": {"name": "rollverify_sequence", "form": "abs"}},
     "rollout.prefix_check.form"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "prefix_check": {"name": "keep", "tau_seq": 0.1}},
     "unknown parameter 'rollout.prefix_check.tau_seq'"),
    ({"simulated_staleness": 1, "simulated_partial": 4, "temperature": 0.0, "prefix_check": {"name": "rollverify_token"}},
     "greedy"),
    ({"source": "async", "simulated_staleness": 1, "simulated_partial": 4},
     "simulates partial rollouts in the sync source"),
    ({"source": "async", "max_staleness": 1, "partial": False, "prefix_check": {"name": "rollverify_token"}},
     "set rollout.partial: true"),
    ({"source": "async", "simulated_staleness": 1, "prefix_check": {"name": "rollverify_token"}},
     "needs weights arriving mid-generation"),
    ({"source": "async", "max_staleness": 1, "temperature": 0.0, "prefix_check": {"name": "rollverify_token"}},
     "greedy"),
]


@pytest.mark.parametrize("rollout, message", BAD, ids=[m.split()[0][:30] for _, m in BAD])
def test_bad_partial_settings_are_recipe_errors(rollout, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(rollout=rollout)


def test_greedy_keep_and_discard_are_allowed():
    for name in ("keep", "discard"):
        mini_recipe(rollout={"simulated_staleness": 1, "simulated_partial": 4, "temperature": 0.0,
                             "prefix_check": {"name": name}})


def test_the_cli_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "recipes/rollverify.yaml",
                           "--set", "rollout.prefix_check.tau_tok=-1", "--set", "rollout.prefix_check.name=rollverify_deterministic",
                           "-o", str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 2 and "rollout.prefix_check.tau_tok must be >= 0" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_crash_and_resume_is_the_straight_run_in_partial_mode(tmp_path, monkeypatch):
    # The shipped embedded model, whose groups disagree on rewards, so the weights move and π drifts from μ.
    recipe = mini_recipe(model={"backend": "tiny", "tiny": {}},
                         rollout={"max_new_tokens": 32, "simulated_staleness": 2, "simulated_partial": 8,
                                  "prefix_check": {"name": "rollverify_token"}},
                         off_policy={"name": "behaviour_ppo"}, optim={"lr": 1e-3},
                         train={"steps": 5, "checkpoint_every": 1}, eval={"size": 8})
    a = straight_and_resumed(recipe, tmp_path, monkeypatch)
    assert sum(r.get("partial/regenerated_tokens", 0) for r in a) > 0  # the check did cut prefixes
