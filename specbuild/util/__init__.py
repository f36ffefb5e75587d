"""The ground floor: helpers every other layer may import, and which import nothing of specbuild's but each other
and the top-level torch-free modules (``specbuild.cache``).

- :mod:`.strict`: the strict pydantic base model and field problems (recipe, method settings, training config).
- :mod:`.atomic`: crash-safe file and directory writes (staging directory, then one rename).
- :mod:`.checkpoints`: where a checkpoint lives (local path or Hugging Face Hub id) and its materialisation.
- :mod:`.tokenizer_identity`: the token table of a tokenizer, to prove a draft and a target share one.
- :mod:`.draft_len_schedule`: the draft-length schedule check shared by the recipe and the engine.

The layer map and its import-linter contracts: docs/architecture.md and ``[tool.importlinter]`` in pyproject.toml.
"""
