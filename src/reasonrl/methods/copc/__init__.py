"""COPC (Coupled Off-Policy Correction): a behaviour ratio driving the token mask and Retrace traces.

One research method in one package: importing it registers its components. See ``docs/methods/copc.md``."""

from reasonrl.methods.copc import advantage  # noqa: F401  (registration)
