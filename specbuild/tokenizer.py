"""Tokenizer loading, shared by the client, the pipeline, training and the Triton models.

A tokenizer always comes from a local folder (an engine's ``tokenizer/``, a checkpoint), never from
the hub: what is served and what is checked read the same files.
"""

from __future__ import annotations

import os


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]):
    """A transformers tokenizer from the local folder ``tokenizer_dir``.

    Raises:
        ImportError: transformers is missing (the message says what to install).
        OSError: the folder holds no tokenizer (transformers' own message).
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError("loading a tokenizer needs transformers: pip install 'specbuild[engine]'") from exc
    return AutoTokenizer.from_pretrained(os.fspath(tokenizer_dir), local_files_only=True)
