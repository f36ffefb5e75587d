"""Plans beyond one node: llama-eagle3-70b-2node (Llama-3.3-70B + EAGLE-3, TP=8 on 2 x 4 GPUs) and an
engine-path variant, with the launches upstream documents (trtllm-serve under Slurm with
trtllm-llmapi-launch or mpirun; Triton leader mode under srun)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from specbuild.builder.recipe import RecipeError, load_recipe, parse_recipe
from specbuild.builder.trtllm_plan import plan_for, with_trtllm_version
from specbuild.triton_repo.tensorrtllm import multi_node_lines
from specbuild.triton_repo.tensorrtllm import repository_lines
from test_trtllm_plan import TRTLLM_SERVE_FLAGS, flags
from upstream_trtllm import check_speculative_config

REPO = Path("/out/triton_repo")


def test_two_node_pytorch_plan(tmp_path):
    loaded = load_recipe("llama-eagle3-70b-2node")
    plan = plan_for(loaded, tmp_path)
    assert (plan.parallel.world_size, plan.parallel.nodes, plan.parallel.ranks_per_node) == (8, 2, 4)
    assert "world size 8 on 2 nodes" in plan.lines()[0]
    serve = list(plan.serve_argv)
    assert flags(serve) <= TRTLLM_SERVE_FLAGS and serve[serve.index("--tp_size") + 1] == "8" and serve[serve.index("--gpus_per_node") + 1] == "4"
    model = yaml.safe_load(next(f for f in plan.files if f.path.name == "model.yaml").text)
    assert (model["tensor_parallel_size"], model["pipeline_parallel_size"], model["gpus_per_node"]) == (8, 1, 4)
    lines = multi_node_lines(plan, REPO)
    joined = " ".join(serve)
    lines = [line.strip() for line in lines]
    assert f"trtllm-serve, Slurm: $ srun --nodes 2 --ntasks-per-node 4 --mpi=pmix trtllm-llmapi-launch {joined}" in lines
    assert f"trtllm-serve, mpirun: $ mpirun -np 8 -H NODE1:4,NODE2:4 trtllm-llmapi-launch {joined}" in lines
    assert any("trtllm-llmapi-launch /opt/tritonserver/bin/tritonserver --model-repository /out/triton_repo" in line for line in lines)
    assert any(line.strip().startswith("trtllm-serve, Slurm") for line in repository_lines(loaded, plan, REPO))
    for version in ("1.2.1", "1.3.0", "1.4.0"):
        config = yaml.safe_load(plan_for(with_trtllm_version(loaded, version), tmp_path).files[0].text)["speculative_config"]
        assert check_speculative_config(config, version) == []


def engine_recipe(tp: int, gpus_per_node: int, method: str = "eagle") -> str:
    speculation = {"eagle": "{method: eagle, eagle_model: yuhuili/EAGLE-LLaMA3.1-Instruct-8B}",
                   "draft_target": "{method: draft_target, draft_checkpoint: meta-llama/Llama-3.2-1B-Instruct}"}[method]
    return (f"name: t\ntarget: {{checkpoint: meta-llama/Llama-3.1-70B-Instruct, dtype: float16}}\nspeculation: {speculation}\n"
            f"build: {{backend: tensorrt, tp_size: {tp}, gpus_per_node: {gpus_per_node}, trtllm_version: '1.2.1'}}\n")


def test_two_node_engine_plan_uses_leader_mode_under_srun(tmp_path):
    loaded = parse_recipe(engine_recipe(8, 4), Path("t.yaml"))
    plan = plan_for(loaded, tmp_path)
    build = next(s for s in plan.steps if s.name == "build-target")
    assert build.argv[build.argv.index("--workers") + 1] == "8"
    lines = multi_node_lines(plan, REPO)
    assert ("  Triton leader mode, Slurm: $ srun --nodes 2 --ntasks-per-node 4 --mpi=pmix tritonserver --model-repository=/out/triton_repo "
            "--disable-auto-complete-config '--backend-config=python,shm-region-prefix-name=prefix${SLURM_PROCID}_'") in lines
    assert any("launch_triton_server.py --world_size 8" in line and "--oversubscribe" in line for line in lines)
    assert not multi_node_lines(plan_for(parse_recipe(engine_recipe(4, 4), Path("t.yaml")), tmp_path), REPO)  # one node


def test_what_cannot_span_nodes_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"build.gpus_per_node: .*orchestrator mode .* one node only"):
        plan_for(parse_recipe(engine_recipe(8, 4, "draft_target"), Path("t.yaml")), tmp_path)
    with pytest.raises(RecipeError, match=r"build.gpus_per_node: tp_size \* pp_size = 6 spans 2 nodes of 4 GPUs unevenly"):
        plan_for(parse_recipe(engine_recipe(6, 4), Path("t.yaml")), tmp_path)
