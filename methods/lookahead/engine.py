"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", §3): Jacobi iterations over a 2D window build an n-gram pool; pool n-grams are verified.

No draft model. Each step is ONE target forward over three parts (§3.1-§3.3):

* the last emitted token (the only token that is certainly right);
* the *lookahead branch*: a window of ``w`` columns x ``n - 1`` levels of Jacobi guesses. Level ``l``,
  column ``j`` sits ``j + l`` positions after the last token; level 0 column 0 *is* the last token
  (TensorRT-LLM's layout), so the branch adds ``w * (n - 1) - 1`` tokens. The target's argmax at the top
  level, column ``j``, is the next level's guess for column ``j``; each column read bottom to top plus
  that new guess is an n-gram of the Jacobi trajectory and goes into the pool (§3.1, Fig. 2b);
* the *verification branch*: up to ``g`` pool n-grams whose first token is the last token, each
  contributing its ``n - 1`` following tokens (§3.2). They are the draft tokens; the longest prefix the
  target agrees with is accepted (:func:`specbuild.engine.acceptance.accept_tree_greedy`; the candidates
  form a trie from the last token).

Token budget (TensorRT-LLM, ``lookahead_max_draft_len``): one step runs
``1 + (w * (n - 1) - 1) + g * (n - 1) = (w + g) * (n - 1)`` tokens, which for ``n > 1`` equals
``1 + max_draft_len(w, n, g)`` with ``max_draft_len = (n - 2) + (w - 1 + g) * (n - 1)``; for ``n == 1``
it is the single last token (plain decoding, ``max_draft_len == 0``). :func:`build_step_layout` asserts it.

Warm-up (§3.1, "we fill the window in the first N - 2 steps"): the window starts with level 0 only, its
columns 1.. drawn at random (seeded) from the prompt; each step adds one level until there are ``n - 1``,
and only then are n-grams collected. Like TensorRT-LLM, the pool is also seeded with the prompt's
n-grams and fed the n-grams of the emitted tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specbuild.engine.block import Block
from specbuild.engine.drafters import EngineMethod, MethodContext, PlainDrafter
from specbuild.engine.tree import SpecTree

from . import LookaheadSpeculation, lookahead_max_draft_len

if TYPE_CHECKING:
    from specbuild.engine.validation import ResolvedRequest


@dataclass(frozen=True)
class LookaheadParams:
    """One request's lookahead shape ``(w, n, g)``; ``(1, 1, 0)`` is plain decoding.

    Attributes:
        window: ``w``, Jacobi window width (columns), ``>= 1``.
        ngram: ``n``, n-gram size (the window has ``n - 1`` levels), ``>= 1``.
        verification_set: ``g``, n-grams verified per step at most, ``>= 0``.
    """

    window: int
    ngram: int
    verification_set: int

    @property
    def max_draft_len(self) -> int:
        """TensorRT-LLM's draft budget for ``(w, n, g)``: ``(0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)``."""
        return lookahead_max_draft_len(self.window, self.ngram, self.verification_set)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one full step runs through the target: ``(w + g) * (n - 1)``, or 1 when ``n == 1``."""
        if self.ngram == 1:
            return 1
        return (self.window + self.verification_set) * (self.ngram - 1)


@dataclass(frozen=True)
class LookaheadConfig:
    """The engine's built maxima ``(W, N, G)`` (TensorRT-LLM ``LookaheadDecodingConfig`` names), from the
    method's settings (:func:`load_lookahead`).

    Attributes:
        max_window_size: ``W >= 1``.
        max_ngram_size: ``N >= 1``.
        max_verification_set_size: ``G >= 0``.
    """

    max_window_size: int
    max_ngram_size: int
    max_verification_set_size: int

    def __post_init__(self) -> None:
        for name, low in (("max_window_size", 1), ("max_ngram_size", 1), ("max_verification_set_size", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    @property
    def maxima(self) -> tuple[int, int, int]:
        return (self.max_window_size, self.max_ngram_size, self.max_verification_set_size)

    @property
    def max_draft_len(self) -> int:
        """The engine's ``max_draft_len`` for ``(W, N, G)``; e.g. (7, 7, 7) -> 83, (4, 3, 4) -> 15."""
        return lookahead_max_draft_len(*self.maxima)

    def resolve(self, window: tuple[int, int, int] | None = None) -> LookaheadParams:
        """A request's ``(w, n, g)`` checked against ``(W, N, G)``; ``None`` -> ``(W, N, G)``.

        Raises:
            ValueError: ``w < 1``, ``n < 1``, ``g < 0``, or any of them above the configured maximum.
        """
        w, n, g = self.maxima if window is None else window
        if not (1 <= w <= self.max_window_size and 1 <= n <= self.max_ngram_size and 0 <= g <= self.max_verification_set_size):
            raise ValueError(
                f"lookahead (w, n, g) = {(w, n, g)} must satisfy 1 <= w <= {self.max_window_size}, "
                f"1 <= n <= {self.max_ngram_size}, 0 <= g <= {self.max_verification_set_size}"
            )
        return LookaheadParams(w, n, g)


def load_lookahead(config: LookaheadSpeculation, context: MethodContext) -> LookaheadConfig:
    """The engine state of "lookahead": its built ``(W, N, G)``; each request resolves its own (w, n, g)."""
    del context
    return LookaheadConfig(*config.maxima)


class NGramPool:
    """The n-gram pool of §3.1: first token -> up to ``capacity`` distinct continuations of ``n - 1`` tokens.

    A newly added continuation goes to the back; re-adding one moves it there; past ``capacity`` the
    oldest is dropped (TensorRT-LLM's ``LookaheadPoolManager`` keeps ``G`` per key the same way).

    Example (n = 3, capacity 2): add [5, 6, 7], [5, 8, 9], [5, 6, 7] -> guesses(5, 2) == [(6, 7), (8, 9)].
    """

    def __init__(self, ngram: int, capacity: int) -> None:
        """Raises ValueError for ``ngram < 2`` or ``capacity < 0``."""
        if ngram < 2 or capacity < 0:
            raise ValueError(f"an n-gram pool needs ngram >= 2 and capacity >= 0, got {ngram}, {capacity}")
        self.ngram = ngram
        self.capacity = capacity
        self._pool: dict[int, list[tuple[int, ...]]] = {}

    def add(self, ngram: Sequence[int]) -> None:
        """Add one n-gram of exactly ``self.ngram`` tokens (ValueError otherwise)."""
        if len(ngram) != self.ngram:
            raise ValueError(f"pool holds {self.ngram}-grams, got {len(ngram)} tokens")
        if self.capacity == 0:
            return
        entries = self._pool.setdefault(int(ngram[0]), [])
        continuation = tuple(int(t) for t in ngram[1:])
        if continuation in entries:
            entries.remove(continuation)
        entries.append(continuation)
        del entries[: -self.capacity]

    def add_all(self, tokens: Sequence[int]) -> None:
        """Add every n-gram of ``tokens`` (``len(tokens) - n + 1`` of them)."""
        for start in range(len(tokens) - self.ngram + 1):
            self.add(tokens[start : start + self.ngram])

    def guesses(self, first_token: int, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` continuations of ``first_token``, newest first."""
        return list(reversed(self._pool.get(int(first_token), [])))[:limit]

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())


@dataclass(frozen=True)
class StepLayout:
    """The token block of one lookahead step, with relative positions and the attention structure.

    Attributes:
        tokens: ``[T]`` token ids; index 0 is the last emitted token.
        positions: ``[T]`` positions relative to the last token (add the cache length for position_ids).
        allowed: ``[T, T]`` bool, ``allowed[i, k]``: block token ``i`` may attend to block token ``k``
            (every token also attends to the whole cached prefix).
        lookahead_index: ``[levels][w]`` block index of window level ``l``, column ``j`` (``[0][0] == 0``).
        candidates: the verified continuations, ``[c][m]`` tokens each.
        candidate_index: ``[c][m]`` block index of each candidate token.
    """

    tokens: list[int]
    positions: list[int]
    allowed: torch.Tensor
    lookahead_index: list[list[int]]
    candidates: list[list[int]]
    candidate_index: list[list[int]]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_draft_tokens(self) -> int:
        """Verification-branch tokens (the draft tokens the target can accept)."""
        return sum(len(c) for c in self.candidates)


def build_step_layout(
    last_token: int, levels: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]], params: LookaheadParams
) -> StepLayout:
    """Lay out ``[last] + lookahead branch + verification branch`` and its attention mask (§3.3, Fig. 2b).

    Block order: the last token, the window row by row (level 0 columns 1..w-1, then levels 1.. all
    columns), then each candidate. Visibility inside the block (every token also sees the cached prefix):

    * window level ``l``, column ``j`` sees level 0 columns ``0..j`` and column ``j`` levels ``1..l``:
      exactly one token at each position ``0 .. j + l``, the chain of guesses that produced it;
    * candidate token ``i`` sees the last token and its own candidate's tokens ``0..i``, no other
      candidate and no window token; the window sees no candidate.

    Worked example, ``(w, n, g) = (3, 3, 2)``: last token ``a``; window level 0 ``[a, b1, b2]``, level 1
    ``[c0, c1, c2]``; candidates ``[u0, u1]`` and ``[v0, v1]``. 10 tokens = (3 + 2) * (3 - 1)
    = 1 + max_draft_len(3, 3, 2) = 1 + 9::

        index     0   1   2   3   4   5   6   7   8   9
        token     a   b1  b2  c0  c1  c2  u0  u1  v0  v1
        position  0   1   2   1   2   3   1   2   1   2
        --------+---------------------------------------
         0 a    | x
         1 b1   | x   x
         2 b2   | x   x   x
         3 c0   | x           x
         4 c1   | x   x           x
         5 c2   | x   x   x           x
         6 u0   | x                       x
         7 u1   | x                       x   x
         8 v0   | x                               x
         9 v1   | x                               x   x

    The argmax after ``c0, c1, c2`` gives the new level ``[d0, d1, d2]``; the n-grams ``(a, c0, d0)``,
    ``(b1, c1, d1)``, ``(b2, c2, d2)`` go into the pool. The argmax after ``a, u0, u1`` (``a, v0, v1``)
    verifies ``u`` (``v``).

    Args:
        last_token: the last emitted token, not yet in the KV cache.
        levels: ``L`` window levels (``1 <= L <= n - 1``), ``w`` tokens each; ``levels[0][0]`` is ignored
            (the last token takes that slot).
        candidates: at most ``g`` continuations, each ``1 .. n - 1`` tokens.
        params: the request's ``(w, n, g)``.

    Raises:
        ValueError: ``n == 1`` with window levels or candidates, too many or too long candidates, more
            than ``n - 1`` levels, or a level whose width is not ``w``.
    """
    w, n, g = params.window, params.ngram, params.verification_set
    if n == 1 and (levels or candidates):
        raise ValueError("n == 1 is plain decoding: no window levels and no candidates")
    if len(levels) > max(n - 1, 0) or any(len(level) != w for level in levels):
        raise ValueError(f"need at most {n - 1} window levels of {w} tokens, got widths {[len(v) for v in levels]}")
    if len(candidates) > g or any(not 1 <= len(c) <= n - 1 for c in candidates):
        raise ValueError(f"need at most {g} candidates of 1..{n - 1} tokens, got lengths {[len(c) for c in candidates]}")

    tokens, positions, sees = [int(last_token)], [0], [[0]]
    lookahead_index = [[0] * w for _ in levels]
    for level, row in enumerate(levels):
        for column, token in enumerate(row):
            if level == 0 and column == 0:
                continue
            lookahead_index[level][column] = len(tokens)
            chain = [lookahead_index[0][k] for k in range(column + 1)] + [
                lookahead_index[k][column] for k in range(1, level + 1)
            ]
            tokens.append(int(token))
            positions.append(column + level)
            sees.append(chain)
    candidate_index = []
    for candidate in candidates:
        indices = list(range(len(tokens), len(tokens) + len(candidate)))
        for i, token in enumerate(candidate):
            tokens.append(int(token))
            positions.append(i + 1)
            sees.append([0, *indices[: i + 1]])
        candidate_index.append(indices)

    assert len(tokens) <= params.tokens_per_step <= 1 + params.max_draft_len, (len(tokens), params)
    allowed = torch.zeros(len(tokens), len(tokens), dtype=torch.bool)  # [T, T]
    for row, visible in enumerate(sees):
        allowed[row, visible] = True
    return StepLayout(tokens, positions, allowed, lookahead_index, [list(c) for c in candidates], candidate_index)


@dataclass
class LookaheadState:
    """Per-request lookahead state: the Jacobi window and the n-gram pool.

    Attributes:
        params: the request's ``(w, n, g)``.
        levels: ``[L][w]`` window levels, oldest first (``1 <= L <= n - 1``; empty when ``n == 1``).
        pool: the n-gram pool (None when ``n == 1``).
    """

    params: LookaheadParams
    levels: list[list[int]]
    pool: NGramPool | None

    @classmethod
    def start(cls, prompt: Sequence[int], params: LookaheadParams, *, seed: int = 0) -> LookaheadState:
        """Level 0 drawn at random (seeded) from the prompt, the pool seeded with the prompt's n-grams.

        Raises:
            ValueError: on an empty prompt.
        """
        if not prompt:
            raise ValueError("lookahead needs a non-empty prompt to initialise its window")
        if params.ngram == 1:
            return cls(params, [], None)
        rng = random.Random(seed)
        level0 = [int(prompt[-1])] + [int(rng.choice(prompt)) for _ in range(params.window - 1)]
        pool = NGramPool(params.ngram, params.verification_set)
        pool.add_all(prompt)
        return cls(params, [level0], pool)

    def candidates(self, last_token: int, max_len: int) -> list[list[int]]:
        """Up to ``g`` pool continuations of ``last_token``, cut to ``max_len`` tokens (none if ``max_len < 1``)."""
        if self.pool is None or max_len < 1:
            return []
        return [list(c[:max_len]) for c in self.pool.guesses(last_token, self.params.verification_set)]

    def advance(self, new_level: Sequence[int], emitted_context: Sequence[int], next_last_token: int) -> None:
        """Take one Jacobi step: collect the window's n-grams (once full), slide, re-anchor on the last token.

        Args:
            new_level: ``[w]`` the target's argmax after each top-level window token.
            emitted_context: the tail of prompt + output that includes the tokens just emitted (their
                n-grams join the pool, as TensorRT-LLM's ``accept`` does).
            next_last_token: the new last token; it takes level 0, column 0.
        """
        if self.pool is None:
            return
        n = self.params.ngram
        if len(self.levels) == n - 1:
            for column, token in enumerate(new_level):
                self.pool.add([*(level[column] for level in self.levels), token])
            self.levels = [*self.levels[1:], list(new_level)]
        else:
            self.levels.append(list(new_level))
        self.pool.add_all(emitted_context)
        self.levels[0][0] = int(next_last_token)

    def keep_up(self, emitted_context: Sequence[int], next_last_token: int) -> None:
        """After a step that ran without the window (draft length 0): the emitted tokens' n-grams join the
        pool and level 0 re-anchors on the new last token, so lookahead resumes from the current context."""
        if self.pool is None:
            return
        self.pool.add_all(emitted_context)
        self.levels[0][0] = int(next_last_token)


# --- drafting: the request's window and pool as one block ---------------------------------------------


class LookaheadDrafter(PlainDrafter):
    """Lookahead (Fu et al. 2024, §3): candidates from the n-gram pool, the Jacobi window as extra rows.

    One step of a request::

        slot holds context[:-1]; last = context[-1]
        block      = [last] + window (w x (n-1) Jacobi guesses, minus the slot `last` fills)
                     + up to g pool n-grams starting with `last`                 (w + g) * (n - 1) tokens
        target     = one pass over the block with the 4D lookahead mask (build_step_layout)
        accepted   = the candidate with the longest prefix equal to the target's argmax; bonus after it
        slot       = keep prefix + last + accepted
        window     = argmax after the top window level becomes the next level; full columns -> pool
    """

    def __init__(self, params: LookaheadParams) -> None:
        self.params = params
        self.state: LookaheadState | None = None
        self.layout: StepLayout | None = None

    def start(self, prompt, first_token, hidden_states) -> None:
        self.state = LookaheadState.start(prompt, self.params)

    def draft(self, context, *, max_accept, sampler) -> Block:
        last = context[-1]
        if max_accept <= 0:  # K = 0: a plain step; update() still feeds the pool and re-anchors the window
            self.layout = None
            return Block.chain(last)
        layout = build_step_layout(last, self.state.levels, self.state.candidates(last, max_accept), self.params)
        self.layout = layout
        # candidate c, token i  <->  tree path (c, 0, .., 0) of depth i + 1
        tree = SpecTree.from_choices([[c] + [0] * i for c, cand in enumerate(layout.candidates) for i in range(len(cand))])
        tree_index = (0, *(layout.candidate_index[path[0]][len(path) - 1] for path in tree.paths))
        return Block(layout.tokens, tree, layout.positions, layout.allowed, tree_index, None, layout.num_draft_tokens)

    def update(self, context, step) -> None:
        if self.layout is None:  # a plain step: no window rows ran; the window keeps its levels
            self.state.keep_up(context[-(len(step.emitted) + self.params.ngram - 1) :], context[-1])
            return
        top = self.layout.lookahead_index[-1] if self.layout.lookahead_index else []
        new_level = [step.target_tokens[i] for i in top]
        emitted = len(step.emitted)
        self.state.advance(new_level, context[-(emitted + self.params.ngram - 1) :], context[-1])


def make_drafter(config: LookaheadConfig, request: ResolvedRequest) -> LookaheadDrafter:
    """A request's drafter for its ``lookahead_config`` ``(w, n, g)`` (None: the built ``(W, N, G)``)."""
    return LookaheadDrafter(config.resolve(request.lookahead_config))


ENGINE = EngineMethod(make_drafter=make_drafter, load=load_lookahead, resolve_window=LookaheadConfig.resolve, greedy_only=True)
"""No draft model: the built ``(W, N, G)``, each request's ``(w, n, g)`` resolved when its drafter is made."""
