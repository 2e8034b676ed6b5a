"""YAML loading that remembers the line of every key, so errors can name it.

PyYAML's safe loader silently keeps the last of two equal keys; here a duplicate key
is an error, because in a training spec it is almost always a mistake.

Hostile input ends in a YamlParseError with a line, never in an exception from PyYAML or
Python (each limit below says why it is what it is):

- a text over MAX_BYTES is refused before parsing (PyYAML is pure Python here: a 50 MB
  comment took 19 s);
- raw control characters (ESC, NUL, ...), which PyYAML's reader refuses, name their line
  and the field on it;
- nesting deeper than MAX_DEPTH is refused while parsing, before PyYAML's recursive composer
  descends (500 nested `[` overflowed Python's stack);
- more than MAX_NODES values are refused while parsing, and again while aliases and merge
  keys expand (billion laughs);
- values PyYAML cannot construct (`2001-02-30`, `!!int abc`, `!foo x`), YAML 1.1's base-60
  numbers (`time: 1:30:00` is the integer 5400), lone surrogates from `"\\ud800"`, keys with
  control characters and keys that YAML reads as booleans are refused with their line.

Merge keys (`<<: *base`) follow the YAML merge-key spec (yaml.org/type/merge.html): keys of
the mapping itself win over merged ones, earlier merged mappings over later ones. (PyYAML's
flatten_mapping copied every merged pair, so `{<<: *d, time: 1}` read as a duplicate key and
nested merges grew exponentially.)
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..common.errors import Issue, Loc

# Specs are a few KB; clusters.yaml too. Parsing a MiB of dense YAML already takes seconds.
MAX_BYTES = 1 << 20
# The deepest field of a spec is five levels down (stages.commands[0].resources.time); PyYAML's
# composer and walk() below recurse two or three Python frames per level.
MAX_DEPTH = 32
# Values in a document, after aliases and merge keys expand: room for data.inputs at the
# data.shards maximum (10000 files) and the rest of a spec, while keeping the parse of a
# pure-Python PyYAML around a second or two.
MAX_NODES = 20_000
# No field or variable name comes near it; it keeps error messages (which name the key) short.
MAX_KEY_CHARS = 1024

MERGE_TAG = "tag:yaml.org,2002:merge"
VALUE_TAG = "tag:yaml.org,2002:value"
STR_TAG = "tag:yaml.org,2002:str"
COLLECTION_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:omap",
                   "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:set"}
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# YAML 1.1's base-60 integers and floats, as PyYAML's resolver reads them (resolver.py).
_SEXAGESIMAL_RE = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 0x0b: "VT", 0x0c: "FF", 0x1b: "ESC", 0x7f: "DEL"}
# PyYAML's reader: what YAML allows in a stream (reader.py NON_PRINTABLE).
NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE


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

    def loc_at_line(self, line: int) -> Loc:
        """The deepest field whose key or value starts on this line (the root if none)."""
        best: Loc = ()
        for loc, at in self.lines.items():
            if at == line and len(loc) > len(best):
                best = loc
        return best


class YamlParseError(Exception):
    def __init__(self, issue: Issue):
        super().__init__(issue.message)
        self.issue = issue


def describe_char(ch: str) -> str:
    code = ord(ch)
    name = _NAMES.get(code)
    return f"U+{code:04X}" + (f" ({name})" if name else "")


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def line_at(text: str, position: int) -> int:
    """1-based line of a character offset, counting line breaks as PyYAML's reader does."""
    head = text[:position]
    return 1 + head.count("\n") + head.count("\x85") + head.count("\u2028") + head.count("\u2029") + \
        len(re.findall("\r(?!\n)", head))


def field_at_line(text: str, line: int) -> Loc:
    """The field on a line of a text that cannot be parsed as it is: the text with every character
    YAML refuses blanked out, parsed again; the root if that fails too."""
    try:
        return load_yaml(NON_PRINTABLE.sub(" ", text)).loc_at_line(line)
    except YamlParseError:
        return ()


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer counts the events it takes: depth and node limits are checked
    here, before PyYAML's recursive compose_node descends a level. It follows the path of keys
    and indexes to the current event, so that the error can name the field."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._nodes = 0
        # One frame per open collection: [is_mapping, next_is_key, key or index of the current child]
        self._frames: list[list[Any]] = []

    def _path(self) -> Loc:
        """The path to the current event, up to its last key and the list index after it (a path
        through 32 nested lists would name 32 indexes)."""
        path = tuple(frame[2] for frame in self._frames if frame[2] is not None)
        keys = [i for i, part in enumerate(path) if isinstance(part, str)]
        return path[:keys[-1] + 2] if keys else path[:1]

    def get_event(self) -> Any:
        event = super().get_event()
        is_node = isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent, yaml.AliasEvent))
        if is_node and self._frames:
            frame = self._frames[-1]
            if frame[0]:  # a mapping: keys and values alternate
                if frame[1]:
                    frame[2] = event.value if isinstance(event, yaml.ScalarEvent) else None
                frame[1] = not frame[1]
            else:
                frame[2] = 0 if frame[2] is None else frame[2] + 1
        if is_node:
            self._nodes += 1
            if self._nodes > MAX_NODES:
                raise YamlParseError(Issue(self._path(), f"more than {MAX_NODES} values: a spec holds a few hundred "
                                                         "(list many input files with a glob)",
                                           event.start_mark.line + 1))
        if isinstance(event, yaml.CollectionStartEvent):
            if len(self._frames) >= MAX_DEPTH:
                raise YamlParseError(Issue(self._path(), f"nested more than {MAX_DEPTH} levels deep; a spec needs "
                                                         "five", event.start_mark.line + 1))
            self._frames.append([isinstance(event, yaml.MappingStartEvent), True, None])
        elif isinstance(event, yaml.CollectionEndEvent):
            self._frames.pop()
        return event


def load_yaml(text: str) -> YamlDocument:
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlParseError(Issue((), f"more than {MAX_BYTES} bytes (1 MiB): a spec is a few KB"))
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        bad = NON_PRINTABLE.findall(text)
        line = line_at(text, exc.position)
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        ch = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise YamlParseError(Issue(
            field_at_line(text, line),
            f"a raw control character {describe_char(ch)}{more}: YAML does not allow it in a file; remove it, or "
            f"write it as an escape inside double quotes (\"\\x{ord(ch):02x}\")", line)) from None
    lines: dict[Loc, int] = {}
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else None
            problem = exc.problem or str(exc)
            if exc.context and not exc.context.startswith("while "):
                problem += f" ({exc.context})"
            raise YamlParseError(Issue((), f"YAML syntax error: {problem}", line)) from None
        except yaml.YAMLError as exc:
            raise YamlParseError(Issue((), f"YAML syntax error: {exc}")) from None
        if root is None:
            return YamlDocument({}, {(): 1})

        budget = [MAX_NODES]
        active: set[int] = set()

        def spend(node: yaml.Node, loc: Loc) -> None:
            budget[0] -= 1
            if budget[0] < 0:
                raise YamlParseError(Issue(loc, f"the document expands to more than {MAX_NODES} values "
                                                "(aliases or merge keys nested too deep?)", node.start_mark.line + 1))

        def walk(node: yaml.Node, loc: Loc, depth: int) -> Any:
            spend(node, loc)
            line = node.start_mark.line + 1
            if depth > MAX_DEPTH:
                raise YamlParseError(Issue(loc, f"nested more than {MAX_DEPTH} levels deep (through aliases)", line))
            if id(node) in active:
                raise YamlParseError(Issue(loc, "a YAML alias refers to itself", line))
            lines.setdefault(loc, line)
            if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
                if node.tag not in COLLECTION_TAGS:
                    raise YamlParseError(Issue(loc, f"the YAML tag {node.tag} is not read here: write plain YAML",
                                               line))
                active.add(id(node))
                try:
                    return walk_collection(node, loc, depth)
                finally:
                    active.discard(id(node))
            return scalar(node, loc)

        def scalar(node: yaml.Node, loc: Loc) -> Any:
            line = node.start_mark.line + 1
            raw = node.value if isinstance(node.value, str) else ""
            try:
                value = loader.construct_object(node, deep=True)
            except yaml.MarkedYAMLError as exc:
                raise YamlParseError(Issue(loc, f"cannot read the YAML value {_shown(raw)}: {exc.problem}",
                                           line)) from None
            except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
                raise YamlParseError(Issue(loc, f"cannot read the YAML value {_shown(raw)} ({exc}); quote it to "
                                                "make it a string", line)) from None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and node.style is None \
                    and _SEXAGESIMAL_RE.match(raw.strip()):
                raise YamlParseError(Issue(loc, f"YAML 1.1 reads the unquoted {raw} as the base-60 number {value}; "
                                                f"quote it (\"{raw}\")", line))
            if isinstance(value, str) and _SURROGATE_RE.search(value):
                raise YamlParseError(Issue(loc, "a lone UTF-16 surrogate (an escape such as \"\\ud83d\") cannot be "
                                                "written as UTF-8: write the character itself or \\UXXXXXXXX", line))
            return value

        def key_of(key_node: yaml.Node, loc: Loc) -> str:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlParseError(Issue(loc, "mapping keys must be plain strings, not lists or mappings", line))
            if key_node.tag == VALUE_TAG:
                key_node = yaml.ScalarNode(STR_TAG, key_node.value, key_node.start_mark, key_node.end_mark)
            key = scalar(key_node, loc)
            if isinstance(key, bool):
                raise YamlParseError(Issue(loc, f"the key {key_node.value} reads as the boolean {key} in YAML 1.1 "
                                                f"(yes/no/on/off/true/false): quote it (\"{key_node.value}\")", line))
            if not isinstance(key, (str, int)):
                raise YamlParseError(Issue(loc, f"mapping keys must be strings, got {_shown(key)}", line))
            key = str(key)
            if len(key) > MAX_KEY_CHARS:
                raise YamlParseError(Issue(loc, f"a key of {len(key)} characters: no field or variable name is "
                                                f"longer than {MAX_KEY_CHARS}", line))
            bad = _CONTROL_RE.search(key)
            if bad:
                raise YamlParseError(Issue(loc, f"the key {_shown(key)} holds the control character "
                                                f"{describe_char(bad.group())}", line))
            return key

        def pairs_of(node: yaml.MappingNode, loc: Loc, depth: int) -> list[tuple[str, yaml.Node, yaml.Node]]:
            """(key, key node, value node) of a mapping with its merge keys applied."""
            own: list[tuple[str, yaml.Node, yaml.Node]] = []
            seen: set[str] = set()
            merges: list[yaml.Node] = []
            merge_line = None
            for key_node, value_node in node.value:
                if key_node.tag == MERGE_TAG:
                    line = key_node.start_mark.line + 1
                    if merge_line is not None:
                        raise YamlParseError(Issue(loc + ("<<",), "duplicate key (the earlier value would be "
                                                                  "silently lost)", line))
                    merge_line = line
                    items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                    for item in items:
                        if not isinstance(item, yaml.MappingNode):
                            raise YamlParseError(Issue(loc, "the merge key << takes a mapping or a list of "
                                                            "mappings (e.g. <<: *defaults)", line))
                        merges.append(item)
                    continue
                key = key_of(key_node, loc)
                if key in seen:
                    raise YamlParseError(Issue(loc + (key,), "duplicate key (the earlier value would be silently "
                                                             "lost)", key_node.start_mark.line + 1))
                seen.add(key)
                own.append((key, key_node, value_node))
            for item in merges:  # keys of the mapping win, then earlier merged mappings
                if depth > MAX_DEPTH:
                    raise YamlParseError(Issue(loc, f"merge keys nested more than {MAX_DEPTH} levels deep",
                                               item.start_mark.line + 1))
                if id(item) in active:
                    raise YamlParseError(Issue(loc, "a YAML merge refers to itself", item.start_mark.line + 1))
                active.add(id(item))
                try:
                    merged = pairs_of(item, loc, depth + 1)
                finally:
                    active.discard(id(item))
                for key, key_node, value_node in merged:
                    spend(key_node, loc)
                    if key not in seen:
                        seen.add(key)
                        own.append((key, key_node, value_node))
            return own

        def walk_collection(node: yaml.Node, loc: Loc, depth: int) -> Any:
            if isinstance(node, yaml.MappingNode):
                out: dict[str, Any] = {}
                for key, key_node, value_node in pairs_of(node, loc, depth):
                    lines[loc + (key,)] = key_node.start_mark.line + 1
                    out[key] = walk(value_node, loc + (key,), depth + 1)
                return out
            return [walk(item, loc + (i,), depth + 1) for i, item in enumerate(node.value)]

        try:
            data = walk(root, (), 0)
        except RecursionError:  # the limits above keep well inside Python's; never a traceback
            raise YamlParseError(Issue((), f"nested too deeply (more than {MAX_DEPTH} levels)")) from None
    finally:
        loader.dispose()
    return YamlDocument(data, lines)
