"""Policy backends: anything that samples completions and scores tokens."""
