"""BoT-GRPO: group-relative advantages over the bag of a group's tokens.

Paper: BoT-GRPO ("bag-of-tokens advantage"); paper not located; formalised from its abstract,
confidence INFERRED. Related work: λ-GRPO, GTPO / GRPO-S (arXiv 2508.04349).

All tokens of a group's responses are pooled into one bag; token (i, t) carries its
own reward r_{i,t} and the weight w_{i,t} = 1/T_i (T_i = valid tokens of response i),
so every response weighs 1 in the group's statistics whatever its length. Each token
is then normalised against the weighted mean and std of its bag. With a reward that
is constant along each response this is GRPO; with token-level (process) rewards it
gives each token its own credit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.advantages import broadcast, check_shapes, sequence_scores
from reasonrl.algos.masked import as_float, group_inverse, group_sum, mask_count, last_token_mask
from reasonrl.registry import ADVANTAGES

__all__ = [
    "BOT_STDS",
    "bag_of_tokens_advantages",
    "bag_stats",
    "bag_weights",
    "bot_grpo",
    "bot_token_rewards",
    "DENSE_REDUCTIONS",
    "grpo_dense",
    "sequence_dense_scores",
]

BOT_STDS = ("population", "unbiased")
DENSE_REDUCTIONS = ("sum", "mean")


def bag_weights(response_mask: Tensor) -> Tensor:
    """w_{i,t} = m_{i,t} / T_i with T_i = Σ_t m_{i,t}; rows without valid tokens weigh 0."""
    valid = response_mask.bool()
    lengths = mask_count(valid, dim=-1).clamp_min(1.0)
    return torch.where(valid, 1.0 / lengths.unsqueeze(-1), 0.0)


def bag_stats(
    token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, std: str = "population"
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row (μ_w, σ_w, n) of the row's group bag, each shaped [B].

    With w_{i,t} = 1/T_i and Σ_{(i,t)∈g} w = n_g (the number of responses of g with at
    least one valid token):

    - μ_w = Σ w r / Σ w = (1/n_g) Σ_i r̄_i, the mean of the per-response mean rewards;
    - ``std="population"`` (the spec's default): σ_w² = Σ w (r − μ_w)² / n_g;
    - ``std="unbiased"``: σ_w² = Σ w (r − μ_w)² / (n_g − 1), Bessel's correction with each
      response counted as one observation (frequency weights summing to n_g). With a
      reward constant along each response this is torch.std of the group's rewards,
      the std of verl's and our ``grpo``.

    Groups with n_g < 2 get σ_w = 0 (no relative signal; see the advantage).
    """
    if std not in BOT_STDS:
        raise ValueError(f"unknown BoT std convention {std!r}; allowed: {', '.join(BOT_STDS)}")
    check_shapes(token_rewards, response_mask, group_ids)
    valid = response_mask.bool()
    r = torch.where(valid, as_float(token_rewards.detach()), 0.0)
    w = bag_weights(valid).to(r.dtype)
    inverse, num_groups = group_inverse(group_ids)
    count = group_sum(valid.any(-1).to(r.dtype), inverse, num_groups)
    mean = group_sum((w * r).sum(-1), inverse, num_groups) / count.clamp_min(1.0)
    # Two passes (mean, then squared deviations) for the same stability as group_stats.
    dev = torch.where(valid, r - mean[inverse].unsqueeze(-1), 0.0)
    sq = group_sum((w * dev.square()).sum(-1), inverse, num_groups)
    denom = count - 1.0 if std == "unbiased" else count
    var = torch.where(count > 1, sq / denom.clamp_min(1.0), torch.zeros_like(sq))
    return mean[inverse], var.sqrt()[inverse], count[inverse]


def bag_of_tokens_advantages(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    std: str = "population",
    eps: float = 1e-6,
) -> Tensor:
    """BoT-GRPO advantage Â_{i,t} = (r_{i,t} − μ_w) / (σ_w + eps), zero outside the mask.

    Formalised from the abstract (BoT-GRPO; paper not located). ``token_rewards``
    holds r_{i,t} on every valid token (not the outcome-on-the-last-token convention);
    μ_w, σ_w are the inverse-length-weighted statistics of the group's bag of tokens
    (:func:`bag_stats`). With r_{i,t} = R_i on all of response i's tokens:

    - ``std="population"`` gives (R_i − μ_g) / (σ_g^pop + eps), GRPO with the biased std;
    - ``std="unbiased"`` equals our ``grpo`` (``scale="group"``) and verl
      ``compute_grpo_outcome_advantage`` (``norm_adv_by_std_in_grpo=True``), eps 1e-6.

    A group with fewer than two non-empty responses gets Â = 0, as in our ``grpo``.
    """
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    mean, sigma, count = bag_stats(token_rewards, response_mask, group_ids, std)
    valid = response_mask.bool()
    r = as_float(token_rewards.detach())
    adv = (r - mean.unsqueeze(-1)) / (sigma.unsqueeze(-1) + eps)
    return torch.where(valid & (count > 1).unsqueeze(-1), adv, 0.0)


def bot_token_rewards(
    token_rewards: Tensor,
    response_mask: Tensor,
    dense_rewards: Tensor | None,
    truncated: Tensor | None,
    outcome_weight: float = 1.0,
) -> Tensor:
    """The bag's r_{i,t} from the pipeline's rewards.

    R_i = Σ_t token_rewards_{i,t} (the outcome reward, plus any KL-in-reward penalty).

    - No dense rewards: r_{i,t} = R_i on every valid token.
    - Dense rewards d_{i,t} (a recipe ``token_reward``): r_{i,t} = d'_{i,t} + outcome_weight·R_i,
      where d' = d except on the terminating token of a finished response (its last valid
      token when it is not truncated: EOS or the stop string), which decodes to no scored
      character and so gets d = 0 from the character mapping; there d' = R_i, whether
      stopping there was right. Without it the terminator would sit below every scored
      token and be pushed down in every group.
    """
    valid = response_mask.bool()
    outcome = sequence_scores(token_rewards, response_mask)
    if dense_rewards is None:
        return broadcast(outcome, response_mask)
    if dense_rewards.shape != response_mask.shape:
        raise ValueError(f"dense_rewards must be [B,T]={tuple(response_mask.shape)}, "
                         f"got {tuple(dense_rewards.shape)}")
    dense = torch.where(valid, as_float(dense_rewards.detach()), 0.0)
    finished = torch.ones_like(outcome, dtype=torch.bool) if truncated is None else ~truncated.bool()
    last = last_token_mask(valid)
    terminator = last & finished.unsqueeze(-1)
    dense = torch.where(terminator, outcome.unsqueeze(-1).to(dense.dtype), dense)
    return torch.where(valid, dense + outcome_weight * outcome.unsqueeze(-1), 0.0)


def _check_params(std: str, eps: float, outcome_weight: float) -> None:
    """The parameters ``bot_grpo`` and its control ``grpo_dense`` share."""
    if std not in BOT_STDS:
        raise ValueError(f"advantage.std must be one of {', '.join(BOT_STDS)}; got {std!r}")
    if isinstance(outcome_weight, bool) or not isinstance(outcome_weight, (int, float)):
        raise TypeError(f"advantage.outcome_weight must be a number, got {outcome_weight!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"advantage.eps must be a number >= 0, got {eps!r}")
    if not eps >= 0:
        raise ValueError(f"advantage.eps must be a number >= 0, got {eps!r}")


@ADVANTAGES.register("bot_grpo")
def bot_grpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    batch=None,
    std: str = "population",
    eps: float = 1e-6,
    outcome_weight: float = 1.0,
) -> Tensor:
    """BoT-GRPO (paper not located; formalised from its abstract, INFERRED).

    Token rewards from :func:`bot_token_rewards` (``batch.dense_rewards`` when the recipe
    has a ``token_reward``, plus ``outcome_weight`` times the broadcast outcome; else the
    broadcast outcome), then :func:`bag_of_tokens_advantages` with ``std`` and ``eps``.

    Args:
        std: "population" (spec default) or "unbiased" (= ``grpo`` for sequence rewards).
        eps: added to σ_w.
        outcome_weight: weight of the outcome R_i added to every token's dense reward;
            ignored without dense rewards.
    """
    _check_params(std, eps, outcome_weight)
    check_shapes(token_rewards, response_mask, group_ids)
    dense = getattr(batch, "dense_rewards", None)
    truncated = getattr(batch, "truncated", None)
    rewards = bot_token_rewards(token_rewards, response_mask, dense, truncated, float(outcome_weight))
    return bag_of_tokens_advantages(rewards, response_mask, group_ids, std=std, eps=float(eps))


def sequence_dense_scores(token_rewards: Tensor, response_mask: Tensor, reduce: str = "sum") -> Tensor:
    """One score per response from per-token rewards r_{i,t}, shape [B]:

    - ``reduce="sum"``:  s_i = Σ_t r_{i,t};
    - ``reduce="mean"``: s_i = (1/T_i) Σ_t r_{i,t} = r̄_i, the per-response mean that BoT's μ_w
      averages (0 for a response with no valid token).
    """
    if reduce not in DENSE_REDUCTIONS:
        raise ValueError(f"unknown reduction {reduce!r}; allowed: {', '.join(DENSE_REDUCTIONS)}")
    valid = response_mask.bool()
    r = torch.where(valid, as_float(token_rewards.detach()), 0.0)
    total = r.sum(-1)
    return total if reduce == "sum" else total / mask_count(valid, dim=-1).clamp_min(1.0)


@ADVANTAGES.register("grpo_dense")
def grpo_dense(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    batch=None,
    reduce: str = "sum",
    std: str = "unbiased",
    eps: float = 1e-6,
    outcome_weight: float = 1.0,
) -> Tensor:
    """GRPO on BoT-GRPO's own token rewards, reduced to one score per response: the
    sequence-level control for ``bot_grpo`` with a ``token_reward`` (same information, credit per
    response instead of per token).

    r_{i,t} are exactly the rewards ``bot_grpo`` pools (:func:`bot_token_rewards`: the dense
    process reward with the terminator rule, plus ``outcome_weight`` · R_i on every token);
    s_i = :func:`sequence_dense_scores` (``reduce``: ``sum`` or ``mean``), and

        A_{i,t} = (s_i − mean_g s) / (std_g s + eps)   on every valid token of response i,

    with the group std unbiased (``std: unbiased``, our ``grpo`` and verl
    ``compute_grpo_outcome_advantage``) or population (``std: population``, ``bot_grpo``'s
    default). A group with fewer than two non-empty responses gets 0. With a reward constant along
    each response and ``reduce: mean`` this is ``bot_grpo`` with the same ``std`` (tested): the two
    differ only where rewards vary within a response, i.e. in token-level credit.

    Requires a recipe ``token_reward`` (checked at load); a baseline of the BoT-GRPO comparison,
    not a method of its own (docs/methods/bot_grpo.md, "Controls").
    """
    if reduce not in DENSE_REDUCTIONS:
        raise ValueError(f"advantage.reduce must be one of {', '.join(DENSE_REDUCTIONS)}; got {reduce!r}")
    _check_params(std, eps, outcome_weight)
    check_shapes(token_rewards, response_mask, group_ids)
    dense = getattr(batch, "dense_rewards", None)
    if dense is None:
        raise ValueError("advantage 'grpo_dense' needs dense rewards: add a token_reward to the recipe "
                         "(e.g. token_reward: {name: arithmetic_steps})")
    rewards = bot_token_rewards(token_rewards, response_mask, dense, getattr(batch, "truncated", None),
                                float(outcome_weight))
    scores = sequence_dense_scores(rewards, response_mask, reduce)
    # A response's score on each of its tokens: bag_stats then gives the group's mean and std of s
    # (each response weighs 1), so both std conventions share bot_grpo's code.
    return bag_of_tokens_advantages(broadcast(scores, response_mask), response_mask, group_ids,
                                    std=std, eps=float(eps))


def _check_grpo_dense(recipe, need) -> None:
    need(recipe.token_reward is not None,
         "advantage 'grpo_dense' sums a token-level reward per response: add a token_reward "
         "(e.g. token_reward: {name: arithmetic_steps}), or use advantage 'grpo' for the outcome alone")


grpo_dense.check_recipe = _check_grpo_dense
