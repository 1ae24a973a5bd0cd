"""Language drift of the chain of thought: its reference perplexity, logged in training and compared across runs.

One research method in one package: importing it registers its components. See ``docs/methods/drift.md``."""

from reasonrl.methods.drift import method  # noqa: F401  (registration)
