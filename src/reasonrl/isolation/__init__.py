"""Process isolation: where code that may misbehave runs.

- ``timeout`` / ``timeout_worker``: a picklable call under a wall-clock timeout, in a worker
  process (``math_verify``'s checker);
- ``workers`` / ``worker_procs`` / ``worker_protocol``: the forked processes that run the scorer's
  reward calls (start, watch, kill, reap) and what crosses their pipes;
- ``sandbox``: the hardened sandbox for model-written Python (namespaces, limits, no network);
- ``frames`` / ``parent_watch``: what both kinds of worker above share: length-prefixed frames
  over a pipe (write one, read exactly n bytes, read one), and the thread that ends a worker
  when its parent dies.

Nothing here knows a reward, a task or a method: the scorer (``reasonrl.rewards.scorer``) and the
code-running rewards use these pieces.
"""
