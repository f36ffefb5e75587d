"""A seeded, resumable training loop with a rich progress bar (loss, tokens/s) and periodic checkpoints.

Determinism: everything random in a step is a function of ``(seed, step)`` (the batch order via
:class:`PackedBatches`, feature noise via :func:`step_generator`), and the model's initial weights are
drawn under ``torch.manual_seed(seed)`` by the caller, so a run resumed from a checkpoint at step ``s``
continues exactly as the uninterrupted run would (same thread count and device).

Checkpoint directory layout (only the newest is kept)::

    <ckpt_dir>/step-000300/trainable.safetensors   the trainable parameters (names as in the model)
    <ckpt_dir>/step-000300/optimizer.pt            AdamW state (read back with weights_only=True)
    <ckpt_dir>/step-000300/state.json              step, losses so far
    <ckpt_dir>/init.safetensors                    optional: weights to start from instead of the fresh
                                                   initialisation (fine-tuning an existing draft,
                                                   ``train-draft --from-log``); read at step 0 only
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import TrainConfig


def step_generator(seed: int, step: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded by ``(seed, step)`` for the randomness of one step (e.g. feature noise)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + step)
    return g


class PackedBatches:
    """Deterministic packing of variable-length pieces into steps of at most ``batch_tokens`` tokens.

    Pieces are ``(sequence, start, end)`` windows (long sequences are cut into ``batch_tokens`` windows).
    Epoch ``e`` shuffles the pieces with a generator seeded by ``(seed, e)`` and packs them greedily in
    that order; step ``s`` is the ``s``-th pack counted over epochs. Example: lengths ``[3, 2, 4]``,
    ``batch_tokens=5`` -> one epoch might pack ``[(2, 0, 4)], [(0, 0, 3), (1, 0, 2)]``.
    """

    def __init__(self, lengths: Sequence[int], batch_tokens: int, seed: int) -> None:
        self.pieces = [(i, a, min(a + batch_tokens, n)) for i, n in enumerate(lengths) for a in range(0, n, batch_tokens)]
        if not self.pieces:
            raise ValueError("no training positions: every sequence is too short")
        self.batch_tokens, self.seed = batch_tokens, seed
        self._epochs: list[list[list[tuple[int, int, int]]]] = []

    def _epoch(self, e: int) -> list[list[tuple[int, int, int]]]:
        while len(self._epochs) <= e:
            g = torch.Generator().manual_seed(self.seed * 7919 + len(self._epochs))
            packs, current, used = [], [], 0
            for k in torch.randperm(len(self.pieces), generator=g).tolist():
                piece = self.pieces[k]
                size = piece[2] - piece[1]
                if current and used + size > self.batch_tokens:
                    packs.append(current)
                    current, used = [], 0
                current.append(piece)
                used += size
            packs.append(current)
            self._epochs.append(packs)
        return self._epochs[e]

    def __call__(self, step: int) -> list[tuple[int, int, int]]:
        e = 0
        while step >= len(self._epoch(e)):
            step -= len(self._epoch(e))
            e += 1
        return self._epoch(e)[step]

    def steps_per_epoch(self) -> int:
        return len(self._epoch(0))


def block_causal_mask(pieces: Sequence[tuple[int, int, int]], device) -> torch.Tensor:
    """``[S, S]`` bool mask over packed pieces: causal inside a piece, nothing across pieces."""
    sizes = [b - a for _, a, b in pieces]
    mask = torch.zeros(sum(sizes), sum(sizes), dtype=torch.bool, device=device)
    start = 0
    for n in sizes:
        mask[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        start += n
    return mask


@dataclass(frozen=True)
class StepOutput:
    """One step's loss (to backpropagate), tokens it covered and metrics to show (floats)."""

    loss: torch.Tensor
    tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainResult:
    """What a run did: steps, wall seconds of this process, the loss curve (every step), last metrics,
    and ``total_seconds``: training seconds over every run that made these weights (resumes included)."""

    steps: int
    seconds: float
    losses: list[float]
    metrics: dict[str, float]
    resumed_from: int = 0
    total_seconds: float = 0.0


def lr_factor(step: int, *, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10% at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_beside_target(
    target: torch.nn.Module,
    build: Callable[[], torch.nn.Module],
    objective: Callable[[torch.nn.Module], Callable[[int], StepOutput]],
    config: TrainConfig,
    ckpt_dir: Path,
    **train_options: Any,
) -> tuple[torch.nn.Module, TrainResult]:
    """The shape every method's trainer shares: freeze ``target``'s parameters, seed torch with
    ``config.seed``, ``build()`` the model to train (its initial weights drawn after the seed, so a run
    is repeatable), then :func:`train` it on ``objective(model)`` with ``train_options`` (``description``,
    ``on_step``, ``log``, ``show_progress``). Returns the trained model (the caller saves it in its
    method's format) and the result."""
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(config.seed)
    model = build()
    return model, train(model, objective(model), config, ckpt_dir, **train_options)


def settings_free(train_head: Callable[..., TrainResult]) -> Callable[..., TrainResult]:
    """A :attr:`~specbuild.methods.Training.train` for a trainer that neither the method's settings nor
    the tokenizer choose anything of (EAGLE's and EAGLE-3's heads): ``train_for(spec, target, tokenizer,
    data, config, out_dir, ckpt_dir, **common)`` calls ``train_head(target, data, config, out_dir,
    ckpt_dir, **common)``."""

    def train_for(spec, target, tokenizer, data, config: TrainConfig, out_dir: Path, ckpt_dir: Path, **common) -> TrainResult:
        del spec, tokenizer
        return train_head(target, data, config, out_dir, ckpt_dir, **common)

    return train_for


def train(
    model: torch.nn.Module,
    step_fn: Callable[[int], StepOutput],
    config: TrainConfig,
    ckpt_dir: Path,
    *,
    description: str,
    on_step: Callable[[int, StepOutput], None] | None = None,
    log: Callable[[str], None] = print,
    show_progress: bool = True,
) -> TrainResult:
    """Run ``config.steps`` AdamW steps of ``step_fn`` over ``model``'s trainable parameters.

    Resumes from the newest checkpoint in ``ckpt_dir`` if there is one (``ckpt_dir`` is created).
    ``on_step(step, output)`` runs after each optimizer step (tests interrupt a run from it).
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(params.values(), lr=config.learning_rate, weight_decay=config.weight_decay)
    start, losses, earlier_s, metrics = _resume(ckpt_dir, model, params, optimizer, log)
    began = time.perf_counter()
    tokens_seen = 0
    with _progress(description, config.steps, start, show_progress) as advance:
        for step in range(start, config.steps):
            for group in optimizer.param_groups:
                group["lr"] = config.learning_rate * lr_factor(step, warmup=config.warmup_steps, total=config.steps)
            out = step_fn(step)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), config.grad_clip)
            optimizer.step()
            losses.append(float(out.loss.detach()))
            metrics = dict(out.metrics)
            tokens_seen += out.tokens
            rate = tokens_seen / max(1e-9, time.perf_counter() - began)
            advance(losses[-1], rate, metrics)
            done = step + 1
            if done % config.checkpoint_every == 0 or done == config.steps:
                _save(ckpt_dir, done, params, optimizer, losses, earlier_s + time.perf_counter() - began, metrics)
                shown = " ".join(f"{k}={v:.3f}" for k, v in metrics.items())
                log(f"{description}: step {done}/{config.steps} loss={_mean_tail(losses):.4f} {shown} {rate:.0f} tok/s")
            if on_step is not None:
                on_step(step, out)
    seconds = time.perf_counter() - began
    return TrainResult(config.steps, seconds, losses, metrics, resumed_from=start, total_seconds=earlier_s + seconds)


def _mean_tail(losses: list[float], n: int = 20) -> float:
    tail = losses[-n:]
    return sum(tail) / max(1, len(tail))


class _progress:
    """A rich progress bar showing step, smoothed loss, tokens/s and the step's metrics."""

    def __init__(self, description: str, total: int, start: int, enabled: bool) -> None:
        self.description, self.total, self.start, self.enabled = description, total, start, enabled
        self.smoothed: float | None = None

    def __enter__(self):
        if not self.enabled:
            return lambda loss, rate, metrics: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), transient=False,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task(self.description, total=self.total, completed=self.start, info="")

        def advance(loss: float, rate: float, metrics: dict[str, float]) -> None:
            self.smoothed = loss if self.smoothed is None else 0.9 * self.smoothed + 0.1 * loss
            extra = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            self.bar.update(self.task, advance=1, info=f"loss {self.smoothed:.4f} {extra} {rate:,.0f} tok/s")

        return advance

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)


def _save(ckpt_dir: Path, step: int, params: dict[str, torch.nn.Parameter], optimizer, losses: list[float],
          seconds: float, metrics: dict[str, float]) -> None:
    final = ckpt_dir / f"step-{step:06d}"
    tmp = ckpt_dir / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({n: p.detach().cpu().contiguous() for n, p in params.items()}, str(tmp / "trainable.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "losses": losses, "seconds": seconds, "metrics": metrics}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in ckpt_dir.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete ``step-N`` directory in ``ckpt_dir``, or None."""
    done = sorted(p for p in ckpt_dir.glob("step-*") if (p / "state.json").is_file())
    return done[-1] if done else None


INIT_WEIGHTS = "init.safetensors"


def load_initial_weights(params: dict[str, torch.nn.Parameter], tensors: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``tensors`` (a saved draft's, named as on disk) into the trainable ``params`` (named as in the
    model). A parameter takes the tensor of the same name, or the one whose name ends its own or is ended
    by it at a dot (``heads.0.0.linear.weight`` <- ``0.0.linear.weight``, Medusa's on-disk names).

    Raises:
        ValueError: a parameter with no tensor, with several candidates, or of another shape; the message
            names it and says the saved draft was made with other settings (``where``: its path).
    """
    def matches(param: str, saved: str) -> bool:
        return param == saved or param.endswith("." + saved) or saved.endswith("." + param)

    problems = []
    chosen = {}
    for name, p in params.items():
        found = [t for t in tensors if t == name] or [t for t in tensors if matches(name, t)]
        if len(found) != 1:
            problems.append(f"{name}: {'no tensor' if not found else f'{len(found)} candidates ' + str(found[:3])}")
        elif tuple(tensors[found[0]].shape) != tuple(p.shape):
            problems.append(f"{name}: saved {list(tensors[found[0]].shape)}, the model has {list(p.shape)}")
        else:
            chosen[name] = tensors[found[0]]
    if problems:
        raise ValueError(f"{where}: the saved draft does not fit the model being trained ({'; '.join(problems[:4])}); "
                         "it was trained with other settings (num_layers, heads, target): fine-tune with the settings it "
                         "was trained with, or train a new draft without --from-log")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(chosen[name].to(p.device, p.dtype))


def _resume(ckpt_dir: Path, model, params, optimizer, log) -> tuple[int, list[float], float, dict[str, float]]:
    """``(step, losses, training seconds so far, last metrics)`` of the newest checkpoint, loaded into
    ``params`` and ``optimizer``; ``(0, [], 0.0, {})`` when there is none (then the parameters start
    from ``<ckpt_dir>/init.safetensors`` where that exists: :func:`load_initial_weights`)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    latest = latest_checkpoint(ckpt_dir)
    if latest is None:
        init = ckpt_dir / INIT_WEIGHTS
        if init.is_file():
            load_initial_weights(params, load_file(str(init)), str(init))
            log(f"starting from the weights in {init} (fine-tuning)")
        return 0, [], 0.0, {}
    state = json.loads((latest / "state.json").read_text())
    saved = load_file(str(latest / "trainable.safetensors"))
    if set(saved) != set(params):
        raise ValueError(f"{latest}: checkpoint parameters do not match the model; delete {ckpt_dir} to start over")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(saved[name].to(p.device))
    optimizer.load_state_dict(torch.load(latest / "optimizer.pt", map_location=next(iter(params.values())).device, weights_only=True))
    log(f"resuming from {latest} (step {state['step']})")
    return int(state["step"]), list(state["losses"]), float(state.get("seconds", 0.0)), dict(state.get("metrics", {}))
