"""GRPODropout (entropy-push rollout selection).

One research method in one package: importing it registers its components. See ``docs/methods/grpo_dropout.md``."""

from reasonrl.methods.grpo_dropout import stages  # noqa: F401  (registration)
