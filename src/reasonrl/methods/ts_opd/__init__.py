"""TS-OPD (Transfer-Stratified On-Policy Distillation).

One research method in one package: importing it registers its components. See ``docs/methods/ts_opd.md``."""

from reasonrl.methods.ts_opd import method  # noqa: F401  (registration)
