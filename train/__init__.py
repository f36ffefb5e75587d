"""Training draft heads and draft models from the target by self-distillation (``specbuild.train``).

Modules: :mod:`.config` (the recipe's ``train:`` section, no torch), :mod:`.data` (target-generated
training data and cached target features), :mod:`.loop` (seeded, resumable training loop with a progress
bar), one module per artefact (:mod:`.eagle`, :mod:`.medusa`, :mod:`.draft`), :mod:`.evaluate` (held-out
acceptance through the reference engine) and :mod:`.stage` (the cached ``train-draft`` stage).
"""
