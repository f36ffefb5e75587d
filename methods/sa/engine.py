"""Suffix-automaton (SA) speculation: drafts continue the longest earlier match of the context's suffix.

TensorRT-LLM's ``SADecodingConfig`` (``tensorrt_llm/llmapi/llm_args.py``; its automaton is
``cpp/tensorrt_llm/kernels/speculativeDecoding/suffixAutomaton/suffixAutomaton.h``, adapted there from
Baseten's sa_spec) names the knobs; the automaton is the textbook online construction (Blumer et al.
1985, "The smallest automaton recognizing the subwords of a text"). Each request keeps the suffix
automaton of its context (prompt + emitted tokens); every state records ``firstpos``, the end of the
first occurrence of its strings, so the longest suffix of the context that occurred earlier, and where
it first ended, is a walk of at most a few suffix links::

    context  a b c a b          longest earlier suffix "a b" (first ends at 1) -> draft c a b ...
    context  a a a a            longest earlier suffix "a a a" (first ends at 2) -> draft a

With ``max_matching_ngram_size = n > 0`` the suffix is at most ``n`` tokens (TensorRT-LLM tries sizes
``n`` down to 1), which drafts exactly what prompt lookup with ``is_use_oldest=True`` drafts
(:func:`~specbuild.methods.ngram.find_ngram_draft`). With ``enable_global_pool`` a request also
searches the automata of the other requests in flight and of finished ones kept in the pool
(:class:`SAPool`), as TensorRT-LLM's global search kernel does.

Drafts never change what a request outputs: the target verifies them (greedy: its own argmax tokens;
sampled: speculative sampling). They change only how many tokens a step emits.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.engine.drafters import EngineMethod, MethodContext, chain_drafter

from . import SASpeculation

# TensorRT-LLM's global search compares at most this many trailing tokens of a request
# (``kMaxGlobalSuffixLen``; SADecodingConfig.enable_global_pool: "suffix matching is capped at 64 tokens").
GLOBAL_SUFFIX_CAP = 64
# TensorRT-LLM's global_pool_size default: max(64, max_batch_size).
GLOBAL_POOL_FLOOR = 64


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of a suffix: ``length`` tokens matched, the continuation starts at ``start``."""

    length: int
    start: int


class SuffixAutomaton:
    """The suffix automaton of a token sequence, built online: :meth:`extend` is amortized O(1) per token.

    States are list indices (0 is the root). ``length[s]`` is the longest string of state ``s``;
    ``link[s]`` its suffix link (-1 for the root); ``firstpos[s]`` the index of the last token of the
    first occurrence of its strings; ``edges[s]`` its transitions ``token -> state``. A sequence of
    ``n`` tokens has at most ``2n - 1`` states.

    Example: ``SuffixAutomaton([1, 2, 3, 1, 2]).longest_match()`` -> ``Match(length=2, start=2)``:
    ``[1, 2]`` ended first at index 1, so a draft continues with ``tokens[2:]`` = ``[3, 1, 2]``.
    """

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self.length: list[int] = [0]
        self.link: list[int] = [-1]
        self.firstpos: list[int] = [-1]
        self.edges: list[dict[int, int]] = [{}]
        self.last = 0
        self.extend_all(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend_all(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.extend(token)

    def extend(self, token: int) -> None:
        """Append one token (Blumer et al.'s online step: new state, suffix-link walk, clone on a split)."""
        length, link, firstpos, edges = self.length, self.link, self.firstpos, self.edges
        self.tokens.append(token)
        cur = len(length)
        length.append(length[self.last] + 1)
        link.append(0)
        firstpos.append(len(self.tokens) - 1)
        edges.append({})
        p = self.last
        while p != -1 and token not in edges[p]:
            edges[p][token] = cur
            p = link[p]
        if p != -1:
            q = edges[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                firstpos.append(firstpos[q])
                edges.append(dict(edges[q]))
                while p != -1 and edges[p].get(token) == q:
                    edges[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur

    def longest_match(self, max_len: int = -1) -> Match | None:
        """The longest suffix of the tokens (at most ``max_len`` tokens; -1: any) that also ended
        earlier, with where its first occurrence's continuation starts; None if no suffix repeats.

        Example: tokens ``[7, 1, 8, 1, 9, 1]`` -> ``Match(1, 2)`` (``[1]`` ended first at index 1);
        ``[5, 5, 5]`` -> ``Match(2, 2)``; ``[1, 2, 3]`` -> None.
        """
        state, matched = self.last, len(self.tokens)
        if 0 < max_len < matched:
            while self.length[self.link[state]] >= max_len:
                state = self.link[state]
            matched = max_len
        return self._continuation(state, matched)

    def match_query(self, query: Sequence[int]) -> Match | None:
        """The longest suffix of ``query`` that occurs in the tokens followed by at least one token, at
        its first such occurrence; None if not even its last token does (matching statistics: the query
        walks the automaton, falling back along suffix links on a mismatch).

        Example: tokens ``[4, 1, 2, 3]``, query ``[9, 1, 2]`` -> ``Match(2, 3)`` (draft ``[3]``).
        """
        state, matched = 0, 0
        edges, link, length = self.edges, self.link, self.length
        for token in query:
            while state and token not in edges[state]:
                state = link[state]
                matched = length[state]
            nxt = edges[state].get(token)
            if nxt is None:
                state, matched = 0, 0
            else:
                state, matched = nxt, matched + 1
        return self._continuation(state, matched)

    def _continuation(self, state: int, matched: int) -> Match | None:
        """``matched`` tokens ending in ``state``; shorten along suffix links until the first occurrence
        is followed by a token (the strings of one state share their end positions)."""
        end = len(self.tokens) - 1
        while matched > 0 and self.firstpos[state] >= end:
            state = self.link[state]
            matched = self.length[state]
        return Match(matched, self.firstpos[state] + 1) if matched > 0 else None

    def continuation(self, match: Match, count: int) -> list[int]:
        """At most ``count`` tokens following ``match`` (fewer near the end of the tokens)."""
        return self.tokens[match.start : match.start + count]


@dataclass
class _Entry:
    automaton: SuffixAutomaton
    active: bool = True


class SAPool:
    """The engine's SA state: the settings and, with ``enable_global_pool``, every request's automaton.

    A request's automaton joins the pool when its proposer is made; when the proposer is dropped (the
    request finished or failed) it stays searchable as a finished entry until the pool holds more than
    ``pool_size`` automata, then the oldest finished one leaves (TensorRT-LLM's ``global_pool_size``:
    default ``max(64, max_batch_size)``, at least ``max_batch_size``). One lock covers every pool
    operation: requests of several workers may draft at once.

    Raises (on construction):
        ValueError: ``global_pool_size`` below the engine's ``max_batch_size``.
    """

    def __init__(self, params: SASpeculation, max_batch_size: int | None = None) -> None:
        self.params = params
        batch = max_batch_size or 1
        if params.global_pool_size is not None and params.global_pool_size < batch:
            raise ValueError(
                f"speculative_config.global_pool_size={params.global_pool_size} is below the build's max_batch_size={batch}: "
                "every request in flight needs a slot; raise it or leave it unset (default max(64, max_batch_size))"
            )
        self.pool_size = params.global_pool_size or max(GLOBAL_POOL_FLOOR, batch)
        # re-entrant: a dropped proposer's finalizer (leave) may run inside a locked section when the
        # garbage collector frees it there
        self.lock = threading.RLock()
        self._entries: dict[int, _Entry] = {}  # insertion order = arrival order
        self._next_id = 0

    @property
    def global_pool(self) -> bool:
        return self.params.enable_global_pool

    def join(self, automaton: SuffixAutomaton) -> int:
        """Add a request's automaton (active), evicting the oldest finished ones past ``pool_size``; returns its id."""
        with self.lock:
            entry_id, self._next_id = self._next_id, self._next_id + 1
            self._entries[entry_id] = _Entry(automaton)
            self._evict()
            return entry_id

    def leave(self, entry_id: int) -> None:
        """The request ended: keep its automaton as finished, then evict the oldest finished ones past ``pool_size``."""
        with self.lock:
            entry = self._entries.get(entry_id)
            if entry is not None:
                entry.active = False
            self._evict()

    def _evict(self) -> None:
        finished = [i for i, e in self._entries.items() if not e.active]
        for i in finished[: max(0, len(self._entries) - self.pool_size)]:
            del self._entries[i]

    def entries(self) -> list[tuple[int, SuffixAutomaton]]:
        """``(id, automaton)`` of every automaton in the pool, oldest first (call with :attr:`lock` held)."""
        return [(i, e.automaton) for i, e in self._entries.items()]


def global_match(own_id: int, own: SuffixAutomaton, pool: SAPool, max_ngram: int) -> tuple[SuffixAutomaton, Match] | None:
    """The best match for the last ``max_ngram`` tokens of ``own`` (``max_ngram`` -1: the last 64) among
    the pool's automata (``own`` included: its earlier occurrences), as TensorRT-LLM's global
    search ranks them: the longest match, then the request's own automaton, then the longest
    continuation, then the oldest automaton. Call with ``pool.lock`` held.
    """
    cap = max_ngram if max_ngram > 0 else GLOBAL_SUFFIX_CAP
    query = own.tokens[-cap:]
    best: tuple[tuple[int, int, int], SuffixAutomaton, Match] | None = None
    for entry_id, automaton in pool.entries():
        match = automaton.longest_match(len(query)) if automaton is own else automaton.match_query(query)
        if match is None:
            continue
        rank = (match.length, int(entry_id == own_id), len(automaton) - match.start)
        if best is None or rank > best[0]:
            best = (rank, automaton, match)
    return None if best is None else (best[1], best[2])


class SAProposer:
    """:class:`~specbuild.engine.drafters.Proposer` for SA: one request's suffix automaton.

    The automaton follows the request's context (prompt + emitted tokens), never its draft tokens: each
    :meth:`propose` and :meth:`update` first appends the context tokens it has not seen, so steps
    without drafting (``num_draft_tokens`` 0 for a while, a per-iteration draft-length schedule) leave
    it exactly as if it had seen every step.

    ``pool``: the engine's :class:`SAPool` (settings; with the global pool, the other automata).
    """

    def __init__(self, pool: SAPool) -> None:
        self.pool = pool
        self.params = pool.params
        self.automaton = SuffixAutomaton()
        self.entry_id: int | None = None
        if pool.global_pool:
            self.entry_id = pool.join(self.automaton)
            weakref.finalize(self, pool.leave, self.entry_id)

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: object = None) -> list[int]:
        """Up to ``min(num_draft_tokens, max_draft_len)`` tokens continuing the best earlier match of the
        context's suffix; ``[]`` when no suffix occurred before. Deterministic: ``sampler`` is unused
        (acceptance treats the draft distribution as one-hot)."""
        del sampler
        return self.match(context, num_draft_tokens)[1]

    def match(self, context: Sequence[int], num_draft_tokens: int) -> tuple[int, list[int]]:
        """``(match length, draft)``: how many trailing tokens of the context matched earlier (0: none) and
        the draft :meth:`propose` returns; the length is what TensorRT-LLM's SA enhancer compares with
        ``sa_config.threshold`` (``SADraftEnhancer.maybe_override_all_draft_tokens``)."""
        count = min(num_draft_tokens, self.params.max_draft_len)
        if self.pool.global_pool:
            with self.pool.lock:  # the other automata grow under the same lock
                self._sync(context)
                found = global_match(self.entry_id, self.automaton, self.pool, self.params.max_matching_ngram_size)
                return (0, []) if found is None else (found[1].length, found[0].continuation(found[1], count))
        self._sync(context)
        match = self.automaton.longest_match(self.params.max_matching_ngram_size)
        return (0, []) if match is None else (match.length, self.automaton.continuation(match, count))

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """After a verified step: append the emitted tokens (so the pool sees them before anyone drafts next)."""
        del num_accepted
        if self.pool.global_pool:
            with self.pool.lock:
                self._sync(context)
        else:
            self._sync(context)

    def _sync(self, context: Sequence[int]) -> None:
        seen = len(self.automaton)
        if len(context) < seen:
            raise ValueError(f"the context shrank from {seen} to {len(context)} tokens; an SA proposer follows one request")
        self.automaton.extend_all(context[seen:])


def load(params: SASpeculation, context: MethodContext) -> SAPool:
    """:attr:`~specbuild.engine.drafters.EngineMethod.load`: the engine's pool (raises ValueError, see :class:`SAPool`)."""
    return SAPool(params, context.max_batch_size)


ENGINE = EngineMethod(make_drafter=chain_drafter(SAProposer), load=load)
"""Per-request suffix automata (and the global pool), a chain of at most ``num_draft_tokens`` per step."""
