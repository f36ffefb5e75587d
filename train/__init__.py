"""Training draft heads and draft models from the target by self-distillation (``specbuild.train``).

Modules: :mod:`.config` (the recipe's ``train:`` section, no torch), :mod:`.data` (target-generated
training data and cached target features), :mod:`.loop` (seeded, resumable training loop with a progress
bar), :mod:`.evaluate` (held-out acceptance through the reference engine) and :mod:`.stage` (the cached
``train-draft`` stage). Each method trains its own weights in its folder (``specbuild.methods.<m>.train``,
e.g. :mod:`specbuild.methods.eagle.train`), named by its ``Training.train`` entry.
"""
