import pytest
import torch

from reasonrl.batch import RolloutBatch

from helpers import make


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
