"""The batched decoding worker: ONE target forward per iteration over every request in flight.

Each iteration (:meth:`Worker.step`), as TensorRT-LLM's in-flight batching runs it::

    generation rows   the running requests the iteration's token budget (max_num_tokens) has room
                      for draft their blocks (engine.block; rows of one batched proposer in one call:
                      the Medusa heads, the EAGLE head or the draft model run once per depth or
                      draft token for all of them); one
                      target pass over all of them (engine.forward), then per row: acceptance (greedy
                      tree walk or speculative sampling), KV commit (root + accepted path), emit,
                      drafter update
    context rows      requests admitted since the last iteration prefill (one pass each) and emit
                      their first token, while the budget lasts; they generate from the next iteration

    iteration   1        2             3                4
    A           prefill  [r d d d]     [r d]            [r d d d]
    B                    prefill       [r]  (k = 0)     [r]
    C                                  prefill          [r n n n n n]   (a tree)
    target      A        A | B         A B | C          A B C           ("|": the context pass after)

Every row keeps its own draft length, method state, sampling parameters and seed, so its tokens and
its acceptance counts are the same alone or in any batch (greedy: token for token; sampled: the same
draws from the row's own generator). On CPU this holds bit for bit: the target's and the draft heads'
linears run row-invariant kernels (rowgemm or oneDNN: a row's bits do not depend on the rows beside
it, engine.kernels) and each row attends in its own call over exactly its own positions. With ``kernels="eager"``
or on CUDA a batched GEMM may round a row differently, so a near-tie may break the other way.

A row whose drafter or acceptance fails is finished with that error and the others go on; if the
shared target pass itself fails, every row in it gets the error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from specbuild.interface import avg_decoded_tokens_per_iter

from .acceptance import accept_speculative, accept_tree_greedy
from .block import Block
from .drafters import Drafter, PlainDrafter, StepResult, batch_key
from .forward import RowBlock, forward_blocks
from .kv_pool import KVPool, KVShape
from .sampling import Sampler
from .spec_controls import RuntimeControls, SpeculationGate, runtime_draft_len
from .stream import DecodeState, StepOutput


@dataclass(eq=False)
class InflightRequest:
    """One request in the worker: its validated fields, drafter, sampler, output so far and KV slot.

    Build it with :meth:`specbuild.runtime.ReferenceEngine.prepare` (validated), or directly around
    one drafter to run it through :func:`run_alone`.
    """

    input_ids: list[int]
    max_tokens: int
    end_id: int
    drafter: Drafter
    sampler: Sampler | None = None
    state: DecodeState = field(init=False)
    slot: int | None = None
    prefilled: bool = False

    def __post_init__(self) -> None:
        self.state = DecodeState(list(self.input_ids), self.max_tokens, self.end_id)

    @property
    def done(self) -> bool:
        return self.state.done


Event = tuple[InflightRequest, "StepOutput | BaseException"]
"""What an iteration produced for one request: its step, or the error that ended it."""


class Worker:
    """Runs decoding iterations over the requests in flight (see the module docstring).

    Args:
        model: the target (transformers causal LM, ``eager`` or ``sdpa`` attention).
        max_batch_size: requests in flight at once (KV slots).
        max_seq_len: prompt + generated tokens of one request, at most.
        max_block: the widest block a step may bring (``1 + max_draft_len``, lookahead's step size).
        max_num_tokens: tokens per iteration (TensorRT-LLM ``max_num_tokens``): context and generation
            rows together; a request waits for the next iteration rather than exceed it, except that
            every iteration runs at least one row.
        controls: the engine's runtime controls (``draft_len_schedule``, ``max_concurrency``, the
            acceptance gate; :mod:`~specbuild.engine.spec_controls`), None for none: each iteration's
            draft length K (:attr:`runtime_draft_len`) then caps every row's drafts, 0 drafting none.
        gate: the engine's acceptance gate (shared by its workers), fed by every request that finishes,
            except those that asked for no speculation (``num_draft_tokens=0``: TensorRT-LLM's LLM API
            has no such per-request switch, and ``specbuild verify``'s baselines would close the gate).
    """

    def __init__(self, model: Any, *, max_batch_size: int, max_seq_len: int, max_block: int, max_num_tokens: int,
                 controls: RuntimeControls | None = None, gate: SpeculationGate | None = None) -> None:
        self.model = model
        self.max_num_tokens = max_num_tokens
        self.controls, self.gate = controls, gate
        self.runtime_draft_len: int | None = None  # the latest iteration's K; None: no controls, no cap
        self.pool = KVPool(
            KVShape.of(model), num_slots=max_batch_size, capacity=max_seq_len + max_block, dtype=model.dtype,
            device=model.device,
        )
        self.running: list[InflightRequest] = []
        self.max_block = max_block

    @property
    def has_room(self) -> bool:
        return len(self.running) < self.pool.num_slots

    def add(self, seq: InflightRequest) -> None:
        """Admit ``seq``: it takes a KV slot and prefills at the next iteration.

        Raises:
            KVCacheFullError: every slot is taken (check :attr:`has_room`).
        """
        seq.slot = self.pool.allocate()
        self.running.append(seq)

    def remove(self, seq: InflightRequest) -> None:
        """Drop ``seq`` (finished, cancelled, failed) and free its slot. Removing twice is a no-op."""
        if seq in self.running:
            self.running.remove(seq)
            self.pool.release(seq.slot)

    def step(self) -> list[Event]:
        """One iteration: a batched generation pass over the running rows, then the new rows' prefills.

        Finished and failed rows are removed (their slots freed) before this returns.
        """
        self.runtime_draft_len = self._choose_draft_len()
        with torch.inference_mode():
            budget = self.max_num_tokens
            events, budget = self._generate([s for s in self.running if s.prefilled], budget)
            for seq in [s for s in self.running if not s.prefilled]:
                if len(seq.input_ids) > budget and events:
                    break  # waits for an iteration with room (an oversized prompt runs alone)
                budget -= len(seq.input_ids)
                events.append(self._guarded(seq, self._prefill))
        for seq, item in events:
            if isinstance(item, BaseException) or item.is_final:
                self.remove(seq)
            if self.gate is not None and not isinstance(item, BaseException) and item.is_final and type(seq.drafter) is not PlainDrafter:
                self.gate.record(_avg_decoded_tokens_per_iter(seq))
        return events

    def _choose_draft_len(self) -> int | None:
        """This iteration's K from the controls over the running requests (None: no controls)."""
        if self.controls is None:
            return None
        return runtime_draft_len(self.controls, self.gate, num_active=len(self.running),
                                 max_batch_size=self.pool.num_slots, max_num_tokens=self.max_num_tokens)

    def _max_accept(self, seq: InflightRequest) -> int:
        """Drafts ``seq`` may have accepted this iteration: what it may still emit, less the bonus token,
        capped at the iteration's K (a tree drafter gets K as its node cap instead: :meth:`_caps`)."""
        room = seq.state.remaining - 1
        if self.runtime_draft_len is None or getattr(seq.drafter, "tree_drafts", False):
            return room
        return min(room, self.runtime_draft_len)

    def _caps(self, drafter) -> dict:
        """``max_draft_tokens`` for a tree drafter (the iteration's K caps its nodes: ``1 + K`` tokens, what
        the scheduler reserved), nothing for the others (K is their ``max_accept``)."""
        return {"max_draft_tokens": self.runtime_draft_len} if getattr(drafter, "tree_drafts", False) else {}

    def _guarded(self, seq: InflightRequest, work) -> Event:
        try:
            return seq, work(seq)
        except Exception as exc:  # noqa: BLE001 - this row fails, the others go on
            return seq, exc

    def _prefill(self, seq: InflightRequest) -> StepOutput:
        wants_hidden = seq.drafter.wants_hidden
        out = forward_blocks(
            self.model, self.pool, [RowBlock(seq.slot, seq.input_ids, logits_from=len(seq.input_ids) - 1)],
            hidden_states=wants_hidden,
        )
        self.pool.commit(seq.slot, list(range(len(seq.input_ids))))
        logits = out.logits[0]  # [1, vocab]
        first = int(logits[0].argmax()) if seq.sampler is None else seq.sampler.sample(seq.sampler.probs(logits)[0])
        seq.prefilled = True
        step = seq.state.first(first)
        if not seq.done:
            seq.drafter.start(seq.input_ids, first, out.hidden_states[0] if wants_hidden else None)
        return step

    def _generate(self, rows: list[InflightRequest], budget: int) -> tuple[list[Event], int]:
        """Draft every row that fits ``budget``, one target pass, then accept and emit per row.

        A generation row reserves the widest block (``max_block`` tokens; ``1 + K`` under the runtime
        controls' K) when it is scheduled, as TensorRT-LLM's scheduler reserves a request's draft
        tokens; what its block leaves unused goes
        to this iteration's context rows. Rows left out wait at the front of the queue for the next
        iteration. Rows whose drafters share a batched proposer draft together (:meth:`_draft_all`).
        """
        if not rows:
            return [], budget
        reserve = self.max_block if self.runtime_draft_len is None else min(self.max_block, 1 + self.runtime_draft_len)
        scheduled: list[InflightRequest] = []
        waiting: list[InflightRequest] = []
        for seq in rows:
            if scheduled and budget < reserve:
                waiting.append(seq)  # no room in this iteration: it goes first next time
                continue
            scheduled.append(seq)
            budget -= reserve
        if waiting:
            self.running = waiting + [s for s in self.running if s not in waiting]
        events: list[Event] = []
        drafted: list[tuple[InflightRequest, Block]] = []
        for seq, item in zip(scheduled, self._draft_all(scheduled)):
            if isinstance(item, BaseException):
                budget += reserve
                events.append((seq, item))
            else:
                budget += reserve - len(item.tokens)
                drafted.append((seq, item))
        if not drafted:
            return events, budget
        wants_hidden = any(seq.drafter.wants_hidden for seq, _ in drafted)
        try:
            out = forward_blocks(
                self.model,
                self.pool,
                [RowBlock(seq.slot, block.tokens, block.positions, block.allowed) for seq, block in drafted],
                hidden_states=wants_hidden,
            )
        except Exception as exc:  # noqa: BLE001 - the shared pass failed: every row in it fails
            return events + [(seq, exc) for seq, _ in drafted], budget
        for b, (seq, block) in enumerate(drafted):
            hidden = out.hidden_states[b] if wants_hidden else None
            events.append(self._guarded(seq, lambda s: self._accept(s, block, out.logits[b], hidden)))
        return events, budget

    def _draft_all(self, rows: list[InflightRequest]) -> list[Block | BaseException]:
        """Each row's block (or the error that ends it), in the order of ``rows``.

        Rows whose drafters are :class:`~specbuild.engine.drafters.BatchDrafter` s of one class with the
        same ``batch_key`` draft in one call of their class's ``draft_batch`` (one draft-model pass per
        draft depth for all of them); if that call fails, each row of the group drafts alone, so only a
        row that fails alone fails.
        """
        results: list[Block | BaseException | None] = [None] * len(rows)
        groups: dict[Any, list[int]] = {}
        for i, seq in enumerate(rows):
            key = batch_key(seq.drafter)
            if key is None:
                results[i] = self._guarded(seq, self._draft)[1]
            else:
                groups.setdefault((type(seq.drafter), key), []).append(i)
        for (kind, _), members in groups.items():
            seqs = [rows[i] for i in members]
            try:
                blocks = kind.draft_batch(
                    [s.drafter for s in seqs], [s.state.context for s in seqs],
                    max_accepts=[self._max_accept(s) for s in seqs], samplers=[s.sampler for s in seqs],
                    **self._caps(seqs[0].drafter),
                )
                for block in blocks:
                    self._check_block(block)
            except Exception:  # noqa: BLE001 - find the row at fault: each drafts alone
                blocks = [self._guarded(s, self._draft)[1] for s in seqs]
            for i, block in zip(members, blocks):
                results[i] = block
        return results  # type: ignore[return-value]

    def _draft(self, seq: InflightRequest) -> Block:
        return self._check_block(seq.drafter.draft(seq.state.context, max_accept=self._max_accept(seq), sampler=seq.sampler,
                                                   **self._caps(seq.drafter)))

    def _check_block(self, block: Block) -> Block:
        if len(block.tokens) > self.max_block:
            raise ValueError(f"a block of {len(block.tokens)} tokens exceeds the build's widest step ({self.max_block})")
        return block

    def _accept(self, seq: InflightRequest, block: Block, logits: torch.Tensor, hidden: tuple | None) -> StepOutput:
        """Acceptance for one row (``logits [T, vocab]``), KV commit, emit, drafter update."""
        target_tokens = None
        if seq.sampler is None:
            target_tokens = logits.argmax(dim=-1).tolist()  # [T]
            tree_targets = [target_tokens[block.block_index(i)] for i in range(block.tree.num_nodes + 1)]
            acceptance = accept_tree_greedy(block.tree, block.tree_tokens(), tree_targets)
            accepted_nodes, emitted = acceptance.accepted_nodes, acceptance.emitted_tokens
        else:
            if not block.is_chain:
                raise ValueError("sampled requests verify chains only (speculative sampling)")
            probs = seq.sampler.probs(logits)  # [k + 1, vocab]
            acceptance = accept_speculative(block.chain_drafts, block.draft_probs, probs, sampler=seq.sampler)
            accepted_nodes, emitted = list(range(1, acceptance.num_accepted + 1)), acceptance.emitted_tokens
        keep = block.keep(accepted_nodes)
        self.pool.commit(seq.slot, keep)
        step = seq.state.step(emitted, drafted=block.drafted, accepted=len(accepted_nodes))
        if not seq.done:
            seq.drafter.update(seq.state.context, StepResult(block, keep, emitted, target_tokens, hidden))
        return step


def _avg_decoded_tokens_per_iter(seq: InflightRequest) -> float:
    """Tokens a finished request emitted per target pass, its prefill included (plain decoding: 1.0);
    what the acceptance gate records: TensorRT-LLM's ``avg_decoded_tokens_per_iter``
    (``LlmRequest::getAvgDecodedTokensPerIter``, generated tokens / decoding iterations, "for standard
    model it is 1")."""
    return avg_decoded_tokens_per_iter(len(seq.state.output), seq.state.iterations)


def run_alone(model: Any, seq: InflightRequest, *, max_block: int, controls: RuntimeControls | None = None,
              gate: SpeculationGate | None = None, max_num_tokens: int | None = None) -> Iterator[StepOutput]:
    """``seq``'s steps in a worker of its own (batch of one): the prefill's token, then one step per pass.

    ``controls`` / ``gate`` as :class:`Worker` (a batch of one: the schedule's entry for batch size 1);
    ``max_num_tokens``: the build's, for ``max_concurrency``'s count (None: the prompt or one step).
    Each step runs when the iterator is advanced. Raises what the step raised.
    """
    worker = Worker(
        model, max_batch_size=1, max_seq_len=len(seq.input_ids) + seq.max_tokens, max_block=max_block,
        max_num_tokens=max(len(seq.input_ids), max_block, max_num_tokens or 0), controls=controls, gate=gate,
    )
    worker.add(seq)
    while True:
        for _, item in worker.step():
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.is_final:
                return
