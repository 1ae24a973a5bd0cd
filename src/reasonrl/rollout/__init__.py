"""Group sampling: prompts in, scored ``RolloutBatch`` out."""
