"""YAML -> RunConfig: inheritance, dotted overrides, key and type checks.

A file may say ``inherit: base.yaml`` or ``inherit: [base.yaml, pe/alibi.yaml]`` (paths
relative to that file); parents merge in order, then the file itself, then command-line
overrides (``model.pos.kind=alibi``, values parsed as YAML). Mappings merge key by key,
everything else (lists included) is replaced. Every leaf remembers which file or override
set it, so a bad key or value is reported with its origin. Unknown keys are rejected with
the closest valid key suggested (torchtitan-style strictness, not nanoGPT's silent globals).
A single string where a list of strings is expected (``data.local.train=corpus.txt``) is that
one-element list. YAML is read by configs/yaml_safe.py: the safe loader (nothing is executed),
numbers as YAML 1.2 reads them, and no key written twice.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence, Union

import yaml

from ropelab.configs.schema import RandomPositionsConfig, RunConfig
from ropelab.configs.yaml_safe import DuplicateKey, load_yaml
from ropelab.common.errors import ConfigError
from ropelab.model.encodings import DEFAULT_KIND, sized_by_max_len

# PyYAML follows YAML 1.1, where `3e-4` and `1e6` (no dot) are strings, not numbers.
# Numeric fields accept exactly these spellings so the usual notation works.
_EXPONENT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


Origins = dict[str, str]  # dotted key -> file or override that set it last
PathOrPaths = Union[str, Path, Sequence[Union[str, Path]]]


def _as_paths(paths: PathOrPaths) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    if not paths:
        raise ConfigError("no config file given")
    return [Path(p) for p in paths]


# ---------------------------------------------------------------- YAML files and merging

def _closest_file(path: Path) -> str:
    """" (did you mean …?)" for a misspelt config file name: the closest YAML file beside where it
    was looked for, as misspelt keys get the closest key."""
    folder = path.parent
    if not folder.is_dir():
        return ""
    close = difflib.get_close_matches(path.name, sorted(p.name for p in folder.glob("*.y*ml")), n=1, cutoff=0.6)
    return f" (did you mean {folder / close[0]}?)" if close else ""


def overlay_alone(path: str | Path) -> str:
    """Why the config file ``path``, given alone to train.py, is an overlay and no run's config
    ("" when it is one): it inherits nothing and sets only model keys (configs/pe/*.yaml), so it
    would train on the schema's defaults (name: run, a 256-token vocabulary), not on a preset."""
    tree = _read_yaml(Path(path))
    if not tree or "inherit" in tree or set(tree) != {"model"}:
        return ""
    leaves = _leaves(tree)
    simple = len(leaves) <= 4 and all(isinstance(v, (str, int, float, bool)) for v in leaves.values())
    overrides = " ".join(f"{k}={v}" for k, v in leaves.items()) if simple else ""
    here = Path(path)
    how = (f"python train.py configs/quickstart.yaml {overrides}, or " if overrides else "") + \
          f"a config of your own that inherits a preset and it (in configs/: inherit: [quickstart.yaml, " \
          f"{here.parent.name}/{here.name}])"
    return (f"{path} sets only model settings and inherits no preset: it is an overlay, meant on top of a run's "
            f"config, and alone it would train on the schema's defaults (name: run, vocab_size: 256); train a "
            f"preset with it: {how}")


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read_yaml(path: Path) -> dict:
    if path.is_dir():
        examples = sorted(p.name for p in path.glob("*.yaml"))[:4]
        raise ConfigError(f"{path} is a directory; give a YAML config file" +
                          (f", e.g. {path / examples[0]} (it holds {', '.join(examples)})" if examples else
                           " such as configs/quickstart.yaml"))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}{_closest_file(path)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not a text (UTF-8) file (byte {e.start}: {e.reason}); give a YAML "
                          "config file") from None
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path}: {e.strerror}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    except DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys to values, "
                          f"got {type(data).__name__}")
    return data


def _merge(dst: dict, src: dict, origin: str, origins: Origins, prefix: str = "") -> None:
    """Deep-merge ``src`` into ``dst`` (later wins), recording each key's origin."""
    for key, value in src.items():
        if not isinstance(key, str):
            raise ConfigError(f"{origin}: keys must be strings, got {key!r} under '{prefix or '<top>'}'")
        path = f"{prefix}{key}"
        origins[path] = origin
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, origin, origins, path + ".")
        else:
            dst[key] = _copy(value)
            if isinstance(value, dict):  # a fresh section: record its children too
                _record(value, origin, origins, path + ".")


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _record(d: dict, origin: str, origins: Origins, prefix: str) -> None:
    for key, value in d.items():
        origins[f"{prefix}{key}"] = origin
        if isinstance(value, dict):
            _record(value, origin, origins, f"{prefix}{key}.")


def _load_tree(path: Path, stack: tuple[Path, ...] = ()) -> tuple[dict, Origins]:
    """The merged mapping of ``path`` and everything it inherits, with key origins."""
    path = path.resolve()
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack, path))
        raise ConfigError(f"config inheritance cycle: {chain}")
    raw = _read_yaml(path)
    parents = raw.pop("inherit", [])
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(f"{path}: inherit must be a file name or a list of file names")
    merged: dict = {}
    origins: Origins = {}
    for parent in parents:
        parent_path = path.parent / parent
        if not parent_path.is_file():
            raise ConfigError(f"{path}: inherited file not found: {parent} (looked for {parent_path})")
        parent_tree, parent_origins = _load_tree(parent_path, (*stack, path))
        _merge(merged, parent_tree, "", origins)
        origins.update(parent_origins)
    _merge(merged, raw, str(path), origins)
    return merged, origins


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b.c=value`` -> (``a.b.c``, value parsed as a YAML scalar or list)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise ConfigError(f"override '{text}' is not of the form dotted.key=value "
                          "(e.g. model.pos.kind=alibi)")
    if key.split(".")[0] == "inherit":
        raise ConfigError(f"override '{text}': inherit only works inside YAML files")
    try:
        return key, load_yaml(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': value is not valid YAML: {e}") from None


def load_config_tree(paths: PathOrPaths, overrides: Iterable[str] = ()) -> tuple[dict, Origins]:
    """The merged plain mapping for the file(s) + overrides, and where each key came from.

    Several files merge in order, exactly as if a file inherited them all.
    """
    tree: dict = {}
    origins: Origins = {}
    for path in _as_paths(paths):
        file_tree, file_origins = _load_tree(path)
        _merge(tree, file_tree, "", origins)
        origins.update(file_origins)
    for text in overrides:
        key, value = parse_override(text)
        for part in reversed(key.split(".")):
            value = {part: value}
        _merge(tree, value, f"override '{text}'", origins)
    return tree, origins


# ---------------------------------------------------------------- typed construction

def all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key the schema accepts below ``cls``."""
    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        keys.append(prefix + name)
        if typing.get_origin(tp) is dict:  # named entries: their keys are the user's
            continue
        if dataclasses.is_dataclass(tp):
            keys.extend(all_keys(tp, f"{prefix}{name}."))
    return keys


def _unknown_key(cls: type, key: str, prefix: str, origin: str) -> ConfigError:
    fields = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean '{prefix}{close[0]}'?"
    else:  # maybe the key lives in another section (e.g. seq_len at the top level)
        elsewhere = [k for k in all_keys(RunConfig)
                     if difflib.get_close_matches(key, [k.rsplit(".", 1)[-1]], n=1, cutoff=0.8)]
        hint = (f"did you mean '{elsewhere[0]}'?" if elsewhere
                else f"valid keys here: {', '.join(fields)}")
    return _located(f"{origin}: unknown key '{prefix}{key}'; {hint}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"a list (each {_type_name(typing.get_args(tp)[0])})"
    if typing.get_origin(tp) is dict:
        return f"a mapping of names to {_type_name(typing.get_args(tp)[1])}s"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             type(None): "null"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, key: str, origins: Origins) -> Any:
    """``value`` checked against type ``tp`` (and gently converted: 2.0 -> 2, 3e-4 -> 0.0003)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return _build(tp, value, key + ".", origins)
    elif origin is Union:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(value, options[0], key, origins)
        for option in options:  # e.g. bool | Literal["auto"]: the first that takes the value
            try:
                return _coerce(value, option, key, origins)
            except ConfigError:
                continue
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
    elif origin is dict:  # named entries (model.layers.types): any name, each value typed
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: _coerce({} if v is None else v, args[1], f"{key}.{k}", origins) for k, v in value.items()}
    elif origin is list:
        if isinstance(value, str) and args[0] is str:  # one path where a list is expected
            value = [value]
        if isinstance(value, list):
            return [_coerce(v, args[0], f"{key}[{i}]", origins) for i, v in enumerate(value)]
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp in (int, float):
        if isinstance(value, str) and _EXPONENT.match(value):
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise _located(f"{_origin_of(key, origins)}: {key} must be a finite number, got {value!r}")
            if tp is float:
                return float(value)
            if isinstance(value, int) or value.is_integer():
                return int(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"configs/loader.py cannot check fields of type {tp!r} ({key})")
    raise _located(f"{_origin_of(key, origins)}: {key} must be {_type_name(tp)}, got {value!r}"
                   f"{_closest_choice(value, tp)}")


def _closest_choice(value: Any, tp: Any) -> str:
    """"; did you mean 'x'?" for a misspelt choice of a Literal (e.g. a task or encoding name)."""
    if typing.get_origin(tp) is not Literal or not isinstance(value, str):
        return ""
    choices = [a for a in typing.get_args(tp) if isinstance(a, str)]
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _located(message: str) -> ConfigError:
    """A ConfigError whose message already names the file or override it came from."""
    error = ConfigError(message)
    error.located = True
    return error


def _origin_of(key: str, origins: Origins) -> str:
    key = key.split("[")[0]
    while key not in origins and "." in key:
        key = key.rsplit(".", 1)[0]
    return origins.get(key, origins.get("", "config"))


def _build(cls: type, data: dict, prefix: str, origins: Origins) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise _unknown_key(cls, key, prefix, _origin_of(prefix + key, origins))
        kwargs[key] = _coerce(value, hints[key], prefix + key, origins)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if getattr(e, "located", False):
            raise
        # A value check from __post_init__: it names the key; add the config it came from.
        raise _located(f"{origins.get('', 'config')}: {e}") from None


def _fill_learned_max_len(tree: dict) -> None:
    """A learned table of null size (``pos.max_len``, model/encodings.py) defaults to the
    positions training uses (pe/learned.yaml): train.seq_len, or the range of
    train.random_positions when that is set."""
    model = tree.get("model")
    pos = model.get("pos") if isinstance(model, dict) else None
    if isinstance(pos, dict) and sized_by_max_len(pos.get("kind")) and pos.get("max_len") is None:
        train = tree.get("train", {})
        train = train if isinstance(train, dict) else {}
        seq_len = train.get("seq_len")
        pos["max_len"] = seq_len if seq_len is not None else RunConfig().train.seq_len
        randomized = train.get("random_positions")
        if isinstance(randomized, dict):
            drawn = randomized.get("max_len", RandomPositionsConfig().max_len)
            pos["max_len"] = drawn if isinstance(drawn, int) else pos["max_len"]  # else its own error


def config_from_dict(tree: dict, origins: Origins | None = None) -> RunConfig:
    """A plain mapping (e.g. a saved config.yaml) -> validated RunConfig.

    ``origins`` maps dotted keys to the file/override that set them (for messages); its
    "" entry names the config as a whole.
    """
    if not isinstance(tree, dict):
        raise ConfigError(f"a config must be a mapping, got {type(tree).__name__}")
    tree = _copy(tree)
    _fill_learned_max_len(tree)
    _resolve_layer_types(tree)
    return _build(RunConfig, tree, "", origins or {})


def _resolve_layer_types(tree: dict) -> None:
    """Each layer type's ``pos`` as a whole (model/layer_config.py): the default's
    (``model.pos``) with the type's keys merged in when the type keeps the default's kind,
    the type's own when it names another kind, the default's when it sets none."""
    model = tree.get("model")
    layers = model.get("layers") if isinstance(model, dict) else None
    types = layers.get("types") if isinstance(layers, dict) else None
    if not isinstance(types, dict):
        return
    default = model.get("pos") if isinstance(model.get("pos"), dict) else {}
    default_kind = default.get("kind", DEFAULT_KIND)
    for name, layer in types.items():
        layer = {} if layer is None else layer
        types[name] = layer
        if not isinstance(layer, dict):
            continue  # typed construction says it must be a mapping
        own = layer.get("pos")
        if own is None:
            layer["pos"] = _copy(default)
        elif isinstance(own, dict) and own.get("kind", default_kind) == default_kind:
            merged = _copy(default)
            _merge(merged, own, "", {})
            layer["pos"] = merged


def override_section(section: Any, tree: dict, origin: str, prefix: str) -> Any:
    """``section`` (a config dataclass such as EvalConfig) with the keys of ``tree`` merged in.

    The same merge and typed checks as a YAML file: unknown keys get a suggestion, wrong
    types and impossible values an error naming ``origin`` and the key under ``prefix``.
    """
    if not isinstance(tree, dict):
        raise ConfigError(f"{origin}: '{prefix.rstrip('.')}' must be a mapping of keys to values")
    merged, origins = dataclasses.asdict(section), {"": origin}
    _merge(merged, tree, origin, origins, prefix)
    return _build(type(section), merged, prefix, origins)


def config_to_dict(cfg: RunConfig) -> dict:
    """The config as plain YAML-safe types; ``config_from_dict`` inverts it exactly."""
    return dataclasses.asdict(cfg)


def load_config(paths: PathOrPaths, overrides: Iterable[str] = ()) -> RunConfig:
    """Load YAML config file(s) (with inheritance) and apply ``key=value`` overrides.

    ``paths`` is one file or a list merged in order (e.g. a preset and a pe/ overlay).
    """
    overrides = list(overrides)
    tree, origins = load_config_tree(paths, overrides)
    names = " + ".join(str(p) for p in _as_paths(paths))
    origins[""] = names + (f" with overrides {' '.join(overrides)}" if overrides else "")
    return config_from_dict(tree, origins)


def config_to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML text; ``config_from_dict(yaml.safe_load(text))`` inverts it."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)
    return "# Resolved ropelab config (written by save_config).\n" + text


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML; ``load_config(path)`` gives back an equal config."""
    Path(path).write_text(config_to_yaml(cfg), encoding="utf-8")
