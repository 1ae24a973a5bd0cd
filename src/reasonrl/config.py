"""The recipe API with every built-in component registered: ``Recipe``, ``load_recipe``,
``recipe_from_dict``, ``ConfigError`` and the section types.

An entry point, like the CLI and ``reasonrl.api``: it imports ``reasonrl.components`` (the one
list of packages that register components, research methods included) and re-exports the loader
of ``reasonrl.recipe``, the schema of ``reasonrl.sections`` and the errors of ``reasonrl.params``.
Code inside the library imports those modules, never this one, so the core never depends on a
research method.
"""

from __future__ import annotations

import reasonrl.components  # noqa: F401  (registers every built-in component)
from reasonrl.params import Component, ConfigError, build_section
from reasonrl.recipe import apply_override, flatten, load_recipe, recipe_from_dict
from reasonrl.sections import (
    EvalConfig, KLConfig, LogConfig, LoraConfig, LossConfig, ModelConfig, OptimConfig, Recipe, RewardConfig,
    RolloutConfig, TeacherConfig, TinyConfig, TrainConfig,
)

__all__ = ["ConfigError", "Recipe", "load_recipe", "recipe_from_dict", "apply_override", "build_section", "flatten",
           "Component", "EvalConfig", "KLConfig", "LogConfig", "LoraConfig", "LossConfig", "ModelConfig", "OptimConfig",
           "RewardConfig", "RolloutConfig", "TeacherConfig", "TinyConfig", "TrainConfig"]
