"""Typed run configuration: YAML presets in this folder, the schema, the loader, grids,
and what makes two configs the same experiment.

``load_config("configs/quickstart.yaml", ["model.pos.kind=alibi"])`` -> ``RunConfig``.
"""

from ropelab.configs.loader import (config_from_dict, config_to_dict, config_to_yaml, load_config, override_section,
                            parse_override, save_config)
from ropelab.configs.schema import (DataConfig, EvalConfig, EvalCorpus, HubConfig, LocalConfig, LogConfig, RunConfig,
                            TokenizerConfig, TrainConfig)

__all__ = [
    "DataConfig", "EvalConfig", "EvalCorpus", "HubConfig", "LocalConfig", "LogConfig", "RunConfig",
    "TokenizerConfig", "TrainConfig", "config_from_dict", "config_to_dict", "config_to_yaml",
    "load_config", "override_section", "parse_override", "save_config",
]
