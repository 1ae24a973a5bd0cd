"""The training loop and what it needs: objective, checkpoints, metrics."""
