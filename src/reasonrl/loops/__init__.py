"""Methods with a loop of their own, built from the Trainer's pieces (``Trainer`` runs, the
``Learner``, the ``Evaluator``), never a fork of them: ``expdis`` (Exploration–Distillation)."""
