"""Tiny random checkpoints the tests make themselves (no hub download).

``make_tiny_llama(path)`` writes a Hugging Face Llama checkpoint (config.json, model.safetensors)
plus a byte-level BPE tokenizer trained on a few lines of Python, so the whole pipeline
(tokenize -> engine -> detokenize) runs on real files in well under a second per model.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for i in range(10):\n    print(i, i * i)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n",
    "The quick brown fox jumps over the lazy dog. A speculative decoder drafts tokens and the target verifies them.",
    "import numpy as np\nx = np.zeros((3, 4))\nprint(x.shape)\n",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tokenizer(path: Path, vocab_size: int = 384):
    """Train a byte-level BPE tokenizer on CORPUS and save it (tokenizer.json etc.) under ``path``.

    Returns the ``PreTrainedTokenizerFast``; ``eos_token`` is ``<|endoftext|>`` (id 0).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.save_pretrained(str(path))
    return fast


def make_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
) -> Path:
    """Write a random tiny LlamaForCausalLM + tokenizer to ``path`` and return it.

    The vocabulary is the trained tokenizer's (a few hundred tokens), fp32 weights, seeded.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def make_pass_through(head):
    """Make a one-layer EAGLE-1 head (``EagleHead``, with ``fc.bias``) pass its feature input through, in
    place: fc = [0 | I] and the layer's outputs zeroed. Then lm_head of its output guesses the root again
    ("repeat" drafts, accepted where the tiny model repeats itself). Returns ``head``."""
    import torch

    hidden = head.fc.weight.shape[0]
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    return head
