"""Typed run configuration: YAML presets in this folder, the schema, and the loader.

``load_config("configs/quickstart.yaml", ["model.pos.kind=alibi"])`` -> ``RunConfig``.
"""

from configs.load import config_from_dict, config_to_dict, load_config, parse_override, save_config
from configs.schema import (DataConfig, EvalConfig, HubConfig, LocalConfig, LogConfig, RunConfig,
                            TokenizerConfig, TrainConfig)

__all__ = [
    "DataConfig", "EvalConfig", "HubConfig", "LocalConfig", "LogConfig", "RunConfig",
    "TokenizerConfig", "TrainConfig", "config_from_dict", "config_to_dict", "load_config",
    "parse_override", "save_config",
]
