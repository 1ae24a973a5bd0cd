import pytest
import torch

from reasonrl.batch import RolloutBatch


def make(n, p, t, offset=0):
    return RolloutBatch(
        prompt_ids=torch.arange(n * p).view(n, p) + 1,
        prompt_mask=torch.ones(n, p, dtype=torch.long),
        completion_ids=torch.arange(n * t).view(n, t) + 1,
        completion_mask=torch.ones(n, t, dtype=torch.long),
        group_ids=torch.arange(n) // 2 + offset,
        rewards=torch.arange(n, dtype=torch.float32),
        truncated=torch.zeros(n, dtype=torch.bool),
        policy_version=offset,
        meta={"prompt": [f"p{i}" for i in range(n)]},
    )


def test_select_split_keep_rows_aligned():
    b = make(6, 3, 4)
    s = b.select([4, 1])
    assert s.rewards.tolist() == [4.0, 1.0] and s.meta["prompt"] == ["p4", "p1"]
    assert torch.equal(s.completion_ids[0], b.completion_ids[4])
    parts = b.split(4)
    assert [len(x) for x in parts] == [4, 2]
    assert torch.equal(torch.cat([x.rewards for x in parts]), b.rewards)
    with pytest.raises(ValueError):
        b.split(0)


def test_concat_pads_prompts_left_and_completions_right():
    a, b = make(2, 3, 4), make(2, 5, 2, offset=10)
    c = RolloutBatch.concat([a, b], pad_id=0)
    assert c.prompt_ids.shape == (4, 5) and c.completion_ids.shape == (4, 4)
    assert c.prompt_ids[0].tolist()[:2] == [0, 0] and c.prompt_mask[0].tolist() == [0, 0, 1, 1, 1]
    assert c.completion_ids[2].tolist()[2:] == [0, 0] and c.completion_mask[2].tolist() == [1, 1, 0, 0]
    assert c.meta["prompt"] == ["p0", "p1", "p0", "p1"]
    assert c.policy_version == 0  # the stalest part
    assert c.input_ids.shape == (4, 9) and c.attention_mask.shape == (4, 9)


def test_row_count_mismatch_is_rejected():
    b = make(3, 2, 2)
    with pytest.raises(ValueError, match="rewards has 2 rows"):
        RolloutBatch(**{**b.__dict__, "rewards": torch.zeros(2)})
