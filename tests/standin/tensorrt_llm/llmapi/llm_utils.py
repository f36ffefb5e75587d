"""Stand-in ``tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict``: the extra dict's
keys over the LLM arguments, ``speculative_config`` turned into its config class."""

from __future__ import annotations

from tensorrt_llm.llmapi import DecodingBaseConfig


def update_llm_args_with_extra_dict(llm_args: dict, llm_args_dict: dict, extra_llm_api_options=None) -> dict:
    merged = {**llm_args, **llm_args_dict}
    if isinstance(merged.get("speculative_config"), dict):
        merged["speculative_config"] = DecodingBaseConfig.from_dict(merged["speculative_config"])
    return merged
