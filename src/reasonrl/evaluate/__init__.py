"""Evaluation: accuracy on held-out problems, plots."""
