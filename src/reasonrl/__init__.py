"""reasonrl: RL post-training of language models for reasoning (GRPO and its family).

The Python API: ``train`` (``reasonrl.api.train``), ``Recipe``, ``load_recipe`` and
``recipe_from_dict`` (``reasonrl.recipe``). They load on first use: importing ``reasonrl``
imports neither torch nor the recipe machinery.
"""

__version__ = "0.1.0"

# ``reasonrl.train`` names both the API function and the subpackage of the training loop
# (``reasonrl.train.trainer``, ...). The subpackage (an empty __init__) is imported first, so
# importing its modules later never rebinds the name; the callable below delegates attribute
# access to it, so ``reasonrl.train.trainer`` and ``import reasonrl.train.trainer as t`` still work.
import reasonrl.train as _train_package  # noqa: E402

_CONFIG_NAMES = ("Recipe", "load_recipe", "recipe_from_dict")


class _Train:
    """train(recipe, run_dir=None, *, overrides=None, resume=False, log=None) -> the run's summary.

    Train with ``recipe`` (a ``Recipe``, a dict or a YAML path); see ``reasonrl.api.train``."""

    def __call__(self, *args, **kwargs):
        from reasonrl.api import train

        return train(*args, **kwargs)

    def __getattr__(self, name: str):
        if name == "__wrapped__":  # inspect.signature(reasonrl.train) shows the API's signature
            from reasonrl.api import train

            return train
        return getattr(_train_package, name)

    def __repr__(self) -> str:
        return "<function reasonrl.train (reasonrl.api.train)>"


train = _Train()


def __getattr__(name: str):
    if name in _CONFIG_NAMES:
        # The loader itself (no torch); the components a recipe names register on the first
        # lookup (``reasonrl.registry.load_components``).
        from reasonrl import recipe

        return getattr(recipe, name)
    raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")


__all__ = ["Recipe", "load_recipe", "recipe_from_dict", "train"]
