"""YAML loading that remembers the line of every key, so errors can name it.

PyYAML's safe loader silently keeps the last of two equal keys; here a duplicate key
is an error, because in a training spec it is almost always a mistake.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..errors import Issue, Loc


MAX_NODES = 100_000


class YamlDocument:
    """Plain Python data from a YAML text plus a map from field location to line number."""

    def __init__(self, data: Any, lines: dict[Loc, int]):
        self.data = data
        self.lines = lines

    def line_of(self, loc: Loc) -> int | None:
        """The line of the deepest known prefix of loc (1-based)."""
        for n in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:n]))
            if line is not None:
                return line
        return None


class YamlParseError(Exception):
    def __init__(self, issue: Issue):
        super().__init__(issue.message)
        self.issue = issue


def load_yaml(text: str) -> YamlDocument:
    loader = yaml.SafeLoader(text)
    lines: dict[Loc, int] = {}
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else None
            problem = exc.problem or str(exc)
            raise YamlParseError(Issue((), f"YAML syntax error: {problem}", line)) from None
        if root is None:
            return YamlDocument({}, {(): 1})

        budget = [MAX_NODES]
        active: set[int] = set()

        def walk(node: yaml.Node, loc: Loc) -> Any:
            budget[0] -= 1
            if budget[0] < 0:
                raise YamlParseError(Issue(loc, f"the document expands to more than {MAX_NODES} values "
                                                "(aliases nested too deep?)", node.start_mark.line + 1))
            if id(node) in active:
                raise YamlParseError(Issue(loc, "a YAML alias refers to itself", node.start_mark.line + 1))
            lines.setdefault(loc, node.start_mark.line + 1)
            if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
                active.add(id(node))
                try:
                    return walk_collection(node, loc)
                finally:
                    active.discard(id(node))
            return loader.construct_object(node, deep=True)

        def walk_collection(node: yaml.Node, loc: Loc) -> Any:
            if isinstance(node, yaml.MappingNode):
                loader.flatten_mapping(node)
                out: dict[Any, Any] = {}
                for key_node, value_node in node.value:
                    key = loader.construct_object(key_node, deep=True)
                    if not isinstance(key, (str, int)):
                        raise YamlParseError(
                            Issue(loc, f"mapping keys must be strings, got {key!r}", key_node.start_mark.line + 1)
                        )
                    key = str(key)
                    if key in out:
                        raise YamlParseError(
                            Issue(loc + (key,), "duplicate key (the earlier value would be silently lost)",
                                  key_node.start_mark.line + 1)
                        )
                    lines[loc + (key,)] = key_node.start_mark.line + 1
                    out[key] = walk(value_node, loc + (key,))
                return out
            return [walk(item, loc + (i,)) for i, item in enumerate(node.value)]

        data = walk(root, ())
    finally:
        loader.dispose()
    return YamlDocument(data, lines)
