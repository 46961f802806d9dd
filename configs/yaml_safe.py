"""YAML read safely and strictly: PyYAML's safe loader (nothing is executed), numbers as YAML
1.2 reads them, and no key written twice in one mapping.

YAML 1.1, which PyYAML follows, reads ``4:00:00`` (a Slurm time limit) as the base-60 integer
14400 and ``1:30`` as 90; here they stay text. A key written twice is an error rather than
PyYAML's silent last-one-wins.
"""

from __future__ import annotations

import re

import yaml

from ropelab.common.errors import ConfigError


class DuplicateKey(ConfigError):
    """A key written twice in one YAML mapping."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's base-60 numbers (``1:30`` is text, not 90), and
    without duplicate keys: PyYAML keeps the last of two, so a key written twice in one
    mapping (a setting, a grid's axis or variant) would silently lose its first value."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first != key_node.start_mark.line:
                    raise DuplicateKey(f"the key {key!r} is written twice in one mapping (lines {first + 1} and "
                                       f"{key_node.start_mark.line + 1}), and only the second would count; "
                                       "keep one")
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if not tag.endswith((":int", ":float"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def load_yaml(text: str):
    """``text`` as YAML, read safely (see the module doc for numbers)."""
    return yaml.load(text, Loader=_Loader)
