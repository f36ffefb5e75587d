"""The opt-in request log of a deployment (recipe ``serve.request_log``): the prompts it was sent, for
``specbuild train-draft RECIPE --from-log LOG``.

One JSON line per request, in the format ``train.prompts`` reads (:func:`specbuild.prompts.load_prompts`)::

    {"prompt": "<|im_start|>user\\nHow do I ...<|im_end|>\\n<|im_start|>assistant\\n"}

Only the prompt text is written: never outputs, token ids, sampling settings, client addresses or times.
The ``preprocessing`` model writes it, where every request enters the deployment (Triton clients and
the OpenAI front alike, which sends the chat template's rendering of ``messages``), so a chat request
is logged as the exact text the target read. Lines are appended with one ``write()`` on a file opened
``O_APPEND`` (mode 0600, created on first use): concurrent instances and threads add whole lines, and
an interrupted write leaves at worst one partial last line, which the reader reports by file and line.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class RequestLog:
    """Appends ``{"prompt": text}`` lines to ``path`` (parent directories created).

    Raises:
        OSError: the file cannot be created or opened for appending (at construction, so a deployment
            with an unwritable ``serve.request_log`` fails to load instead of dropping lines).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def write(self, prompts: list[str]) -> None:
        """Append one line per prompt (one ``write()`` each)."""
        for text in prompts:
            line = (json.dumps({"prompt": text}, ensure_ascii=False) + "\n").encode("utf-8")
            with self._lock:
                written = os.write(self._fd, line)
            if written != len(line):  # a full disk: say so rather than leave a silent partial line
                raise OSError(f"request log {self.path}: wrote {written} of {len(line)} bytes")

    def close(self) -> None:
        os.close(self._fd)
