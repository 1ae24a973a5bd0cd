"""SURGE checkpoint fusion (``reasonrl fuse``).

One research method in one package: importing it registers its components. See ``docs/methods/surge.md``."""

