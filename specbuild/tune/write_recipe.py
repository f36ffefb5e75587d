"""``specbuild tune ... --write-recipe OUT.yaml``: the tuned schedule as a deployable recipe.

The source recipe (the deployment's own, by name or path) is copied with:

- ``speculation.max_draft_len`` = ``schedule[1]`` where the recipe sets it (TensorRT-LLM's rule:
  batch size 1 drafts the most; MTP's ``num_nextn_predict_layers`` is left as it is);
- ``build.draft_len_schedule`` = the schedule and ``build.max_concurrency`` (speculation off above
  it), which the reference engine runs; on the PyTorch path, the TensorRT-LLM form of :mod:`.schedules`
  (floored at 1 for one-engine methods, max_concurrency folded in, keys up to the recipe's
  max_batch_size: every TensorRT-LLM line reads it the same way);
- lookahead: ``speculation.max_ngram_size`` = the N the schedule was measured with
  (:attr:`~specbuild.tune.schedules.Schedule.lookahead_ngram`); Medusa: ``medusa_choices`` cut to the
  first ``schedule[1]`` nodes when that is below the tree's size (its max_draft_len is the node count);
- ``name`` suffixed ``-scheduled``, so its deployment directory does not overwrite the source's;
- relative paths that exist next to the source recipe made absolute, so they still resolve.

The result is parsed with the recipe schema before it is written. Comments are not kept.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from specbuild.builder.recipe import RecipeError, find_recipe, parse_recipe

from .schedules import Schedule
from .schedules import EngineSchedules


class WriteRecipeError(ValueError):
    """No schedule to write, or a source recipe that cannot be found or parsed; says which."""


def scheduled_recipe(source: str | Path, schedule: Schedule, engines: EngineSchedules | None = None) -> str:
    """The YAML text of ``source`` (a recipe name or path) with ``schedule`` deployed in it.

    Raises:
        WriteRecipeError: ``schedule`` has no draft_len_schedule, or the source is not a recipe.
        RecipeError: the written recipe does not validate (the message names file, line and field).
    """
    if not schedule.draft_len_schedule:
        raise WriteRecipeError(f"{schedule.deployment}: no schedule to write ({schedule.note or 'speculation off'})")
    try:
        path = find_recipe(str(source))
    except RecipeError as exc:
        raise WriteRecipeError(f"--write-recipe needs the deployment's recipe: {exc}") from None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec = data.get("speculation") or {}
    if spec.get("method") == "eagle3" and spec.get("use_dynamic_tree"):
        raise WriteRecipeError(
            f"{path.name}: an EAGLE-3 dynamic tree's draft_len_schedule counts draft layers (max_draft_len), while "
            "tune measured num_draft_tokens, which counts the tree's nodes: no schedule written; tune the recipe "
            "with use_dynamic_tree: false (a chain, where both count tokens) to deploy a schedule")
    build = data.setdefault("build", {})
    entries, max_concurrency = dict(schedule.draft_len_schedule), schedule.max_concurrency
    if build.get("backend") == "pytorch" and engines is not None and engines.trtllm is not None:
        from specbuild.builder.recipe import load_recipe

        from .schedules import trtllm_config

        recipe = load_recipe(str(path)).recipe  # the schedule's keys end at the recipe's max_batch_size
        trtllm = trtllm_config(schedule.draft_len_schedule, schedule.max_concurrency, recipe.speculation.method, [],
                               max_batch_size=recipe.build.max_batch_size)
        entries, max_concurrency = dict(trtllm["draft_len_schedule"]), None
    if max_concurrency is not None:
        build["max_concurrency"] = max_concurrency
    build["draft_len_schedule"] = dict(sorted(entries.items()))
    if "max_draft_len" in data["speculation"]:
        data["speculation"]["max_draft_len"] = entries[1]
    if schedule.lookahead_ngram is not None:  # lookahead: the shape whose whole step the schedule runs
        data["speculation"]["max_ngram_size"] = schedule.lookahead_ngram
    _cut_medusa_tree(data, path, entries[1])
    data["name"] = f"{data.get('name', path.stem)}-scheduled"
    data = _absolute_paths(data, path.parent)
    text = f"# {data['name']}: {path.name} with the draft-length schedule `specbuild tune` measured for {schedule.deployment}\n"
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return text


def write_scheduled_recipe(out: str | Path, source: str | Path, schedule: Schedule, engines: EngineSchedules | None = None) -> Path:
    """:func:`scheduled_recipe` validated with the recipe schema at ``out``, then written there."""
    out = Path(out)
    text = scheduled_recipe(source, schedule, engines)
    parse_recipe(text, out.resolve())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def _cut_medusa_tree(data: dict, path: Path, max_draft_len: int) -> None:
    """Medusa's max_draft_len is its tree's node count: a schedule whose batch-1 entry is below it builds
    the tree's first ``max_draft_len`` nodes (node order: what a request's ``num_draft_tokens`` verifies,
    what ``tune`` measured), e.g. 2 of ``[[0], [1], [0, 0], [0, 0, 0]]`` -> ``[[0], [1]]``."""
    spec = data["speculation"]
    if spec.get("method") != "medusa":
        return
    from specbuild.builder.recipe import load_recipe
    from specbuild.engine.tree import SpecTree
    from specbuild.methods.medusa import MC_SIM_7B_63

    recipe = load_recipe(str(path)).recipe.speculation
    if max_draft_len >= recipe.max_draft_len:
        return
    tree = SpecTree.from_choices(recipe.medusa_choices or MC_SIM_7B_63).first(max_draft_len)
    spec["medusa_choices"] = [list(p) for p in tree.paths]
    spec.pop("max_draft_len", None)


def _absolute_paths(value, base: Path):
    """Strings that name an existing file or folder relative to ``base``, made absolute."""
    if isinstance(value, dict):
        return {k: _absolute_paths(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute_paths(v, base) for v in value]
    if isinstance(value, str) and ("/" in value or value.startswith(".")) and not Path(value).expanduser().is_absolute():
        candidate = base / value
        return str(candidate.resolve()) if candidate.exists() else value
    return value


def refuse_disturbed(report) -> None:
    """Raise when a point of the sweep had its baseline disturbed (its speed-up above its tokens per
    step, :attr:`~.analysis.TuneReport.disturbed`): the k = 0 points were measured on a slower machine
    than the others, so every comparison of that sweep is suspect and a schedule from it may switch
    speculation on where it does not pay. ``specbuild tune --force`` writes it anyway.

    Raises:
        WriteRecipeError: naming the points and the fix (``--repeats 3``).
    """
    bad = list(getattr(report, "disturbed", []))
    if bad:
        raise WriteRecipeError(
            f"--write-recipe: not writing a recipe from a sweep whose baseline was disturbed "
            f"({', '.join(f'{c.label} {c.prompt_set}' for c in bad)}: speed-up above tokens/step, the k=0 points ran on a "
            "slower machine); rerun with --repeats 3 on a quieter machine, or pass --force to write it anyway")


def pick_schedule(report) -> tuple[Schedule, EngineSchedules | None]:
    """The schedule to deploy from a :class:`~.analysis.TuneReport`: that of the recommended deployment
    and prompt set (the first prompt set when there are several), else the only schedule there is.

    Raises:
        WriteRecipeError: no schedule, or several and no recommendation to choose by.
    """
    pairs = list(zip(report.schedules, report.engine_schedules or [None] * len(report.schedules)))
    for prompt_set, best in sorted(report.recommendations.items()):
        for schedule, engines in pairs:
            if (schedule.deployment, schedule.prompt_set) == (best.deployment, prompt_set) and schedule.draft_len_schedule:
                return schedule, engines
    usable = [(s, e) for s, e in pairs if s.draft_len_schedule]
    if len(usable) == 1:
        return usable[0]
    notes = "; ".join(f"{s.deployment} {s.prompt_set}: {s.note or 'has one'}" for s in report.schedules)
    raise WriteRecipeError(f"--write-recipe: no single schedule to write ({notes or 'no schedules'})")
