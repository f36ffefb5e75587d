"""Stand-in ``tensorrt_llm.llmapi``: the 1.2 line's speculative config classes by decoding_type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodingBaseConfig:
    max_draft_len: int | None = None
    speculative_model_dir: str | None = None
    draft_len_schedule: dict | None = None

    @classmethod
    def from_dict(cls, data: dict):
        """As 1.2.1's: look the class up by ``decoding_type`` (no ``Eagle3`` there)."""
        data = dict(data)
        config_class = _CLASSES.get(data.get("decoding_type"))
        if config_class is None:
            raise ValueError(f"Invalid decoding type: {data.get('decoding_type')}")
        data.pop("decoding_type")
        return config_class(**data)


@dataclass
class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 4
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


@dataclass
class EagleDecodingConfig(DecodingBaseConfig):
    eagle3_one_model: bool = True


@dataclass
class DraftTargetDecodingConfig(DecodingBaseConfig):
    pass


_CLASSES = {"NGram": NGramDecodingConfig, "Eagle": EagleDecodingConfig, "DraftTarget": DraftTargetDecodingConfig}
