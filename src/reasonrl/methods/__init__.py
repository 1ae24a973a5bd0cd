"""Research methods, one package each: ``methods/<name>/`` holds all of one paper's parts, each
file named by the stage it plugs into (``advantage.py``, ``loss.py``, ``method.py``, ``reward.py``,
``task.py``, ``sampler.py``, ``env.py``, ``loop.py``, ...), and registers them on import.

A method imports only the core (``reasonrl.algos``, ``policy``, ``rewards``, ``tasks``, ``envs``,
``rollout``, ``evaluate``, ``train`` and the base modules), never another method; what two
methods share lives in the core. ``reasonrl.components`` is the one list of the packages that
register components; this package imports none of them. The rules are import-linter contracts
in ``pyproject.toml``, checked by the test suite (``tests/test_architecture.py``).
"""
