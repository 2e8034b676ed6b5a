"""The CycleCloud cluster template, cluster_init/lingjun-slurm/templates/lingjun-slurm.txt, checked
against cyclecloud-slurm's own templates/slurm.txt (4.0.9, the newest, and 4.0.0) and against the
parameter file CycleCloud Workspace for Slurm feeds to it (fixtures/cyclecloud-templates/, see
SOURCES.md there).

CycleCloud cannot run here, so the template is parsed by the small reader below, written from the
format as the upstream templates use it and as CycleCloud documents it (cluster-template-reference:
"the number of square brackets represents the rank", case insensitive throughout):

- `[kind name]` headers whose bracket count is the depth: `[cluster X]` and `[parameters X]` at the
  top, `[[node X]]`/`[[nodearray X]]`/`[[parameters X]]`, `[[[cluster-init P:S:V]]]`,
  `[[[configuration]]]`, `[[[parameter X]]]`, and `[[[[list Config.Entries]]]]` (repeated, 4.0.0);
- `Key = value` and `Key := value` (an expression), full-line `#` comments, `'''` values over
  several lines, tabs and spaces mixed (4.0.9 has both), `Description` and `description` alike.

configobj does not read these files faithfully (checked with configobj 5.0.9 on both fixtures): with
list_values on it stops at 4.0.9 line 107 (the ComputerName expression); with it off it reads
`Config.Filter :=` as a key named "Config.Filter :", and it rejects 4.0.0 outright at line 779,
the second `[[[[list Config.Entries]]]]` ("Duplicate section name").

Spec order follows CycleCloud's cluster-init reference: specs run in the order listed, those of
`[[node defaults]]` first. A nodearray that `Extends` another is taken to inherit that node's specs
ahead of its own, the same way; CycleCloud does not document that case (see docs/cluster-init.md,
"Not verified here (the template and CCW)").
"""

from __future__ import annotations

import configparser
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cluster_init.node import PROJECT

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cyclecloud-templates"
TEMPLATE = PROJECT / "templates" / "lingjun-slurm.txt"
CCW_SPECS = PROJECT / "templates" / "ccw-cluster-init-specs.json"
UPSTREAM = FIXTURES / "cyclecloud-slurm-4.0.9-slurm.txt"
UPSTREAM_4_0_0 = FIXTURES / "cyclecloud-slurm-4.0.0-slurm.txt"
CCW_PARAMS = FIXTURES / "ccw-2026.07.02-initial_params.json"
CONFIG_KEYS = PROJECT / "specs/default/cluster-init/files/lib/config-keys.tsv"
NCCL_DIR = PROJECT / "specs/execute/cluster-init/files/nccl"
INSTANCE_TYPES = NCCL_DIR / "instance-types.tsv"

# ---------------------------------------------------------------------------------------------
# The reader


@dataclass
class Attr:
    key: str
    op: str  # "=" or ":="
    value: str
    line: int


@dataclass
class Section:
    depth: int
    kind: str  # lower case: cluster, node, nodearray, configuration, cluster-init, parameters, ...
    name: str
    line: int
    parent: Section | None = None
    attrs: list[Attr] = field(default_factory=list)
    children: list[Section] = field(default_factory=list)

    def attr(self, key: str) -> Attr | None:
        found = [a for a in self.attrs if a.key.lower() == key.lower()]
        return found[-1] if found else None

    def get(self, key: str) -> str | None:
        found = self.attr(key)
        return None if found is None else found.value

    def sections(self, *kinds: str) -> list[Section]:
        return [c for c in self.children if c.kind in kinds]

    def child(self, kind: str, name: str) -> Section | None:
        for c in self.children:
            if c.kind == kind and c.name.lower() == name.lower():
                return c
        return None


class TemplateError(ValueError):
    pass


_HEADER = re.compile(r"^\s*(\[+)([^\[\]]*)(\]+)\s*$")
_ATTR = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*(:=|=)\s*(.*?)\s*$")


@dataclass
class Template:
    path: str
    sections: list[Section]

    @property
    def cluster(self) -> Section:
        clusters = [s for s in self.sections if s.kind == "cluster"]
        if len(clusters) != 1:
            raise TemplateError(f"{self.path}: expected one [cluster] section, found {len(clusters)}")
        return clusters[0]

    def nodes(self) -> dict[str, Section]:
        return {s.name.lower(): s for s in self.cluster.sections("node", "nodearray")}

    def parameter_groups(self) -> list[Section]:
        return [s for s in self.sections if s.kind == "parameters"]

    def parameters(self) -> dict[str, tuple[tuple[str, ...], Section]]:
        """Parameter name (lower case) -> (the names of the groups it is in, its section)."""
        found: dict[str, tuple[tuple[str, ...], Section]] = {}

        def walk(section: Section, path: tuple[str, ...]) -> None:
            for c in section.children:
                if c.kind == "parameters":
                    walk(c, path + (c.name,))
                elif c.kind == "parameter":
                    if c.name.lower() in found:
                        raise TemplateError(f"{self.path}:{c.line}: parameter {c.name} defined twice")
                    found[c.name.lower()] = (path, c)

        for group in self.parameter_groups():
            walk(group, (group.name,))
        return found


def parse_template(text: str, path: str = "<template>") -> Template:
    top: list[Section] = []
    stack: list[Section] = []  # the open section at each depth
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        raw = lines[n]
        n += 1
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(raw)
        if header:
            opening, content, closing = header.groups()
            depth = len(opening)
            if len(closing) != depth:
                raise TemplateError(f"{path}:{n}: {len(opening)} '[' but {len(closing)} ']' in {stripped!r}")
            words = content.split(None, 1)
            if not words:
                raise TemplateError(f"{path}:{n}: empty section header")
            if depth > len(stack) + 1:
                raise TemplateError(f"{path}:{n}: {stripped!r} (depth {depth}) has no enclosing "
                                    f"depth-{depth - 1} section")
            del stack[depth - 1:]
            section = Section(depth, words[0].lower(), words[1].strip() if len(words) > 1 else "", n,
                              stack[-1] if stack else None)
            (stack[-1].children if stack else top).append(section)
            stack.append(section)
            continue
        attr = _ATTR.match(raw)
        if not attr:
            raise TemplateError(f"{path}:{n}: neither a [section], a KEY = VALUE line nor a comment: {stripped!r}")
        if not stack:
            raise TemplateError(f"{path}:{n}: attribute {attr.group(1)} before any [section]")
        key, op, value = attr.groups()
        line = n
        if value.startswith("'''") and (len(value) < 6 or not value.endswith("'''")):
            start = n
            parts = [value[3:]]
            while True:
                if n >= len(lines):
                    raise TemplateError(f"{path}:{start}: ''' opened for {key} is never closed")
                more = lines[n]
                n += 1
                if "'''" in more:
                    parts.append(more[:more.index("'''")])
                    break
                parts.append(more)
            value = "\n".join(parts)
        elif value.startswith("'''"):
            value = value[3:-3]
        stack[-1].attrs.append(Attr(key, op, value, line))
    return Template(path, top)


def load(path: Path) -> Template:
    return parse_template(path.read_text(), str(path))


# ---------------------------------------------------------------------------------------------
# The checks: each returns a list of problems, empty when the template passes


def norm(value: str | None) -> str | None:
    return None if value is None else " ".join(value.split())


_KEYWORDS = {"true", "false", "undefined", "isnt", "is", "in", "and", "or", "not", "null"}
_BUILTINS = {"clustername"}  # CycleCloud's own: the cluster's name
_EXPRESSION_ATTRS = ("conditions.", "disabled")  # in [[[parameter]]] sections


def _expression_names(expr: str) -> list[str]:
    """Parameter names an expression refers to: identifiers, minus string literals, function calls
    (a name followed by "(") and the expression keywords."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    names = []
    for m in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)(?!\w)(?!\s*\()", expr):
        if m.group(1).lower() not in _KEYWORDS:
            names.append(m.group(1))
    return names


def references(tpl: Template) -> list[tuple[Section, Attr, str]]:
    """Every parameter reference: $Name and ${...} in the cluster, expressions in parameters."""
    found = []

    def walk(section: Section) -> None:
        for a in section.attrs:
            for m in re.finditer(r"\$(?!\{)([A-Za-z_]\w*)", a.value):
                found.append((section, a, m.group(1)))
            for m in re.finditer(r"\$\{(.*)\}", a.value):
                found.extend((section, a, name) for name in _expression_names(m.group(1)))
        for c in section.children:
            walk(c)

    walk(tpl.cluster)
    for _path, p in tpl.parameters().values():
        for a in p.attrs:
            if a.key.lower().startswith(_EXPRESSION_ATTRS) or a.key.lower() == "disabled":
                found.extend((p, a, name) for name in _expression_names(a.value))
    return found


def reference_problems(tpl: Template) -> list[str]:
    params = tpl.parameters()
    return [f"{tpl.path}:{a.line}: {a.key} refers to ${name}, which no [[[parameter]]] defines"
            for _s, a, name in references(tpl)
            if name.lower() not in params and name.lower() not in _BUILTINS]


@dataclass(frozen=True)
class SpecRef:
    text: str
    source: str  # "cyclecloud" (CycleCloud's GitHub projects), a locker, or "" (the default locker)
    project: str
    spec: str
    version: str


def spec_ref(section: Section) -> SpecRef:
    """A [[[cluster-init]]] section's spec: the short form SOURCE/PROJECT:SPEC:VERSION, or the
    Project/Spec/Version attributes (CycleCloud's cluster-init reference)."""
    text = section.name
    if not text:
        text = ":".join(x for x in (section.get("Project"), section.get("Spec"), section.get("Version")) if x)
    source, _, rest = text.rpartition("/")
    parts = rest.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise TemplateError(f"line {section.line}: cluster-init {text!r} is not PROJECT:SPEC[:VERSION]")
    return SpecRef(text, source, parts[0], parts[1], parts[2] if len(parts) == 3 else "")


def extends_chain(tpl: Template, name: str) -> list[Section]:
    """[[node defaults]], then the Extends chain from its root, then the node itself."""
    nodes = tpl.nodes()
    chain: list[Section] = []
    current: Section | None = nodes[name.lower()]
    while current is not None:
        if current in chain:
            raise TemplateError(f"{tpl.path}:{current.line}: Extends loop at {current.name}")
        chain.insert(0, current)
        base = current.get("Extends")
        if base is not None and base.lower() not in nodes:
            raise TemplateError(f"{tpl.path}:{current.line}: {current.name} extends unknown node {base}")
        current = nodes[base.lower()] if base is not None else None
    if "defaults" in nodes and name.lower() != "defaults":
        chain.insert(0, nodes["defaults"])
    return chain


def specs_run(tpl: Template, name: str) -> list[SpecRef]:
    """The specs a node runs, in order (a spec listed again keeps its first place)."""
    run: list[SpecRef] = []
    for section in extends_chain(tpl, name):
        for ci in section.sections("cluster-init"):
            ref = spec_ref(ci)
            if ref.text not in [r.text for r in run]:
                run.append(ref)
    return run


def concrete_nodes(tpl: Template) -> list[str]:
    return [key for key, s in tpl.nodes().items()
            if key != "defaults" and (s.get("Abstract") or "").lower() != "true"]


def is_slurm(ref: SpecRef) -> bool:
    return ref.source == "cyclecloud" and ref.project == "slurm"


def project_ini() -> configparser.SectionProxy:
    ini = configparser.ConfigParser()
    ini.read(PROJECT / "project.ini")
    return ini["project"]


def spec_problems(tpl: Template) -> list[str]:
    """lingjun-slurm's specs: the project and version of project.ini, specs that exist; the default
    spec after cyclecloud/slurm:default and before lingjun-slurm's role spec; the role spec after
    every cyclecloud/slurm spec of the node (Slurm and its headers are installed by then), and of
    the same role as cyclecloud/slurm's."""
    project = project_ini()
    problems = []
    for name in concrete_nodes(tpl):
        # Upstream lists healthagent and monitoring both in [[node defaults]] and in each node;
        # what CycleCloud makes of a spec listed twice is not documented, so ours never are.
        listed = [spec_ref(ci) for s in extends_chain(tpl, name) for ci in s.sections("cluster-init")]
        texts = [r.text.lower() for r in listed if r.project == project["name"]]
        for dup in sorted({t for t in texts if texts.count(t) > 1}):
            problems.append(f"{name}: {dup} is listed more than once (in defaults, a base node or itself)")
        run = specs_run(tpl, name)
        ours = [(i, r) for i, r in enumerate(run) if r.project == project["name"]]
        slurm = [(i, r) for i, r in enumerate(run) if is_slurm(r)]
        for i, r in ours:
            if r.source:
                problems.append(f"{name}: {r.text}: a locker project is named without a source prefix")
            if r.version != project["version"]:
                problems.append(f"{name}: {r.text}: version {r.version or '(none)'} "
                                f"but project.ini says {project['version']}")
            if not (PROJECT / "specs" / r.spec / "cluster-init").is_dir():
                problems.append(f"{name}: {r.text}: the project has no spec {r.spec}")
            for j, s in slurm:
                # the default spec only checks the configuration: it follows cyclecloud/slurm:default
                # (both in [[node defaults]]); a role spec follows every cyclecloud/slurm spec
                if i < j and (r.spec != "default" or s.spec == "default"):
                    problems.append(f"{name}: {r.text} runs before {s.text}")
        roles = [r for _i, r in ours if r.spec != "default"]
        if roles:
            if not ours or ours[0][1].spec != "default":
                problems.append(f"{name}: {project['name']}:default must run before {roles[0].text}")
            slurm_roles = {s.spec for _j, s in slurm} - {"default"}
            for r in roles:
                if r.spec not in slurm_roles:
                    problems.append(f"{name}: {r.text} on a node whose cyclecloud/slurm role is {sorted(slurm_roles)}")
            if len(roles) > 1:
                problems.append(f"{name}: more than one role spec: {[r.text for r in roles]}")
    return problems


def config_keys() -> dict[str, tuple[str, str]]:
    """config-keys.tsv: key -> (type, default)."""
    keys = {}
    for line in CONFIG_KEYS.read_text().splitlines():
        if line and not line.startswith("#"):
            key, type_, default, _meaning = line.split("\t")
            keys[key] = (type_, "" if default == '""' else default)
    return keys


LINGJUN_GROUP = "lingjun-slurm"


def configuration_attrs(tpl: Template) -> list[tuple[Section, Attr]]:
    found = []

    def walk(section: Section) -> None:
        if section.kind == "configuration":
            found.extend((section, a) for a in section.attrs)
        for c in section.children:
            walk(c)

    walk(tpl.cluster)
    return found


def entry_values(entries: str) -> list[str]:
    """The Value= of each entry of a Config.Entries list: {[Value="a"], [Value=undefined; Label="x"]}."""
    return [m.group(1) or m.group(2) for m in re.finditer(r'Value=(?:"([^"]*)"|([^;\]\s]+))', entries)]


# Parameters whose default on a CycleCloud Slurm cluster differs from the installer's own, on purpose.
CYCLECLOUD_DEFAULTS = {
    # cyclecloud-slurm installs and holds enroot 4.0.1 and puts it back whenever its installer reruns;
    # over an upgraded enroot that rerun stops at dpkg's enroot.conf prompt (docs/admin-guide.md,
    # test_packages_real.py test_a_cyclecloud_rerun_over_the_upgraded_enroot_stops_at_the_conffile_prompt).
    "lingjun_slurm.enroot.min_version": "4.0.1",
}


def lingjun_problems(tpl: Template) -> list[str]:
    """Every lingjun_slurm.* key the template sets is the installer's, set in [[node defaults]]
    from its own parameter (configuration_ + the key with "_" for "."), whose default is the
    installer's default and whose choices are the key's."""
    keys = config_keys()
    params = tpl.parameters()
    problems = []
    used: set[str] = set()
    for section, a in configuration_attrs(tpl):
        if not a.key.lower().startswith("lingjun"):
            continue
        where = f"{tpl.path}:{a.line}: {a.key}"
        if a.key not in keys:
            problems.append(f"{where}: not a key of config-keys.tsv")
            continue
        if section.name or section.parent is None or section.parent.name.lower() != "defaults":
            problems.append(f"{where}: set outside [[node defaults]] [[[configuration]]]")
        expected = "configuration_" + a.key.replace(".", "_")
        if a.value != f"${expected}":
            problems.append(f"{where}: expected = ${expected}, found {a.value}")
            continue
        used.add(expected.lower())
        if expected.lower() not in params:
            continue  # reference_problems names it
        path, p = params[expected.lower()]
        if path[0] != LINGJUN_GROUP:
            problems.append(f"{where}: parameter {expected} is not in [parameters {LINGJUN_GROUP}]")
        type_, default = keys[a.key]
        default = CYCLECLOUD_DEFAULTS.get(a.key, default)
        shown = p.get("DefaultValue")
        ptype = (p.get("ParameterType") or "").lower()
        if default == "":
            if shown not in (None, "=undefined"):
                problems.append(f"{where}: the installer's default is empty, "
                                f"the parameter's {shown!r} (use =undefined)")
        elif type_ == "bool":
            if ptype != "boolean" or (shown or "").lower() != default:
                problems.append(f"{where}: expected a Boolean parameter defaulting to {default}, "
                                f"found {ptype or 'no type'} {shown!r}")
        elif type_ == "int":
            if ptype != "integer" or shown != default:
                problems.append(f"{where}: expected an Integer parameter defaulting to {default}, "
                                f"found {ptype or 'no type'} {shown!r}")
        elif shown != default:
            problems.append(f"{where}: the installer's default is {default!r}, the parameter's {shown!r}")
        if type_ == "secret" and ptype != "password":
            problems.append(f"{where}: a secret needs ParameterType = Password")
        if type_.startswith("enum:"):
            choices = type_[5:].split("|")
            if entry_values(p.get("Config.Entries") or "") != choices:
                problems.append(f"{where}: Config.Entries must offer exactly {choices}")
        if a.key == "lingjun_slurm.nccl.profile":
            profiles = sorted(f.stem for f in NCCL_DIR.glob("*.conf"))
            if entry_values(p.get("Config.Entries") or "") != ["undefined", *profiles]:
                problems.append(f"{where}: Config.Entries must be undefined (from the VM size) "
                                f"and the profiles {profiles}")
    for name, (path, p) in params.items():
        if path[0] == LINGJUN_GROUP and name.startswith("configuration_") and name not in used:
            problems.append(f"{tpl.path}:{p.line}: parameter {p.name} sets no lingjun_slurm key")
    return problems


# Attributes of a [[[parameter]]] that change what the cluster gets or what may be entered;
# labels, descriptions and notes (Label, Description, Widget.Label, Config.Label, Config.Template)
# are prose, this project's own.
FUNCTIONAL = {"parametertype", "defaultvalue", "required", "order", "hidelabel", "disabled",
              "conditions.hidden", "conditions.excluded", "conditions.required",
              "config.plugin", "config.entries", "config.freeform", "config.multiselect",
              "config.minvalue", "config.maxvalue", "config.integeronly", "config.increment",
              "config.os", "config.filter", "config.parametertype", "widget.plugin"}
# Where the template departs from upstream on purpose: (parameter, attribute) -> our value.
DEVIATIONS = {("gpumachinetype", "defaultvalue"): "Standard_ND96isr_H100_v5"}


def _attr_map(section: Section) -> dict[str, tuple[str, str]]:
    return {a.key.lower(): (a.op, norm(a.value)) for a in section.attrs}


def structure_problems(ours: Template, upstream: Template, deviations: dict | None = None) -> list[str]:
    """Everything of upstream that makes the cluster: the [cluster] attributes, every node and
    nodearray with its attributes and subsections (cyclecloud's specs in their order), every
    parameter in its group with its functional attributes, every group's Order. Ours may add only
    lingjun-slurm's specs, lingjun_slurm.* keys and the [parameters lingjun-slurm] group."""
    deviations = DEVIATIONS if deviations is None else deviations
    problems = []
    if _attr_map(ours.cluster) != _attr_map(upstream.cluster):
        problems.append(f"[cluster] attributes differ: {_attr_map(ours.cluster)} != {_attr_map(upstream.cluster)}")
    our_nodes, up_nodes = ours.nodes(), upstream.nodes()
    for extra in sorted(set(our_nodes) - set(up_nodes)):
        problems.append(f"node {extra}: not in upstream")
    project = project_ini()["name"]
    for key, up in up_nodes.items():
        mine = our_nodes.get(key)
        if mine is None or mine.kind != up.kind:
            problems.append(f"[[{up.kind} {up.name}]]: missing or of another kind")
            continue
        if _attr_map(mine) != _attr_map(up):
            problems.append(f"[[{up.kind} {up.name}]]: attributes differ: {_attr_map(mine)} != {_attr_map(up)}")
        up_specs = [spec_ref(c).text for c in up.sections("cluster-init")]
        my_specs = [spec_ref(c).text for c in mine.sections("cluster-init") if spec_ref(c).project != project]
        if my_specs != up_specs:
            problems.append(f"[[{up.kind} {up.name}]]: cluster-init {my_specs} instead of upstream's {up_specs}")
        subs = [c for c in up.children if c.kind != "cluster-init"]
        for sub in subs:
            theirs = mine.child(sub.kind, sub.name)
            label = f"[[{up.kind} {up.name}]] [[[{sub.kind} {sub.name}]]]".replace(" ]]]", "]]]")
            if theirs is None:
                problems.append(f"{label}: missing")
                continue
            a_mine, a_up = _attr_map(theirs), _attr_map(sub)
            if sub.kind == "configuration" and not sub.name:
                a_mine = {k: v for k, v in a_mine.items() if not k.startswith("lingjun_slurm.")}
            if a_mine != a_up:
                changed = sorted(k for k in set(a_mine) | set(a_up) if a_mine.get(k) != a_up.get(k))
                problems.append(f"{label}: differs in {changed}")
        for c in mine.children:
            if c.kind == "cluster-init":
                continue
            if up.child(c.kind, c.name) is None:
                problems.append(f"[[{up.kind} {up.name}]]: [[[{c.kind} {c.name}]]] is not upstream's")
    our_params, up_params = ours.parameters(), upstream.parameters()
    for name, (path, up) in up_params.items():
        if name not in our_params:
            problems.append(f"parameter {up.name}: missing")
            continue
        my_path, mine = our_params[name]
        if tuple(map(str.lower, map(norm, my_path))) != tuple(map(str.lower, map(norm, path))):
            problems.append(f"parameter {up.name}: in {my_path}, upstream in {path}")
        a_mine = {k: v for k, v in _attr_map(mine).items() if k in FUNCTIONAL}
        a_up = {k: v for k, v in _attr_map(up).items() if k in FUNCTIONAL}
        for (pname, attr), value in deviations.items():
            if pname == name:
                if a_mine.get(attr, (None, None))[1] != value:
                    problems.append(f"parameter {up.name}: the deviation {attr} = {value} is not in effect")
                a_mine[attr] = a_up.get(attr)
        if a_mine != a_up:
            changed = sorted(k for k in set(a_mine) | set(a_up) if a_mine.get(k) != a_up.get(k))
            problems.append(f"parameter {up.name}: differs in {changed}")
    for name in sorted(set(our_params) - set(up_params)):
        if our_params[name][0][0] != LINGJUN_GROUP:
            problems.append(f"parameter {our_params[name][1].name}: new, outside [parameters {LINGJUN_GROUP}]")

    def groups(tpl: Template) -> dict[tuple[str, ...], str | None]:
        found = {}
        for top in tpl.parameter_groups():
            found[(norm(top.name).lower(),)] = top.get("Order")
            for sub in top.sections("parameters"):
                found[(norm(top.name).lower(), norm(sub.name).lower())] = sub.get("Order")
        return found

    mine_g, up_g = groups(ours), groups(upstream)
    for path, order in up_g.items():
        if path not in mine_g:
            problems.append(f"parameter group {' / '.join(path)}: missing")
        elif mine_g[path] != order:
            problems.append(f"parameter group {' / '.join(path)}: Order {mine_g[path]}, upstream {order}")
    for path in sorted(set(mine_g) - set(up_g)):
        if path[0] != LINGJUN_GROUP:
            problems.append(f"parameter group {' / '.join(path)}: new, outside [parameters {LINGJUN_GROUP}]")
    tops = [g.get("Order") for g in ours.parameter_groups()]
    if len(set(tops)) != len(tops):
        problems.append(f"top-level parameter groups share an Order: {tops}")
    return problems


# ---------------------------------------------------------------------------------------------
# The reader on the upstream templates


@pytest.fixture(scope="module")
def ours() -> Template:
    return load(TEMPLATE)


@pytest.fixture(scope="module")
def upstream() -> Template:
    return load(UPSTREAM)


@pytest.fixture(scope="module")
def upstream_4_0_0() -> Template:
    return load(UPSTREAM_4_0_0)


def test_reader_on_cyclecloud_slurm_4_0_9(upstream):
    assert upstream.cluster.name == "Slurm"
    assert list(upstream.nodes()) == ["defaults", "scheduler", "scheduler-ha", "login", "nodearraybase",
                                      "hpc", "htc", "gpu", "dynamic"]
    assert [g.name for g in upstream.parameter_groups()] == [
        "About", "Required Settings", "Network Attached Storage", "Advanced Settings", "Monitoring"]
    params = upstream.parameters()
    assert len(params) == 97  # grep -c '^\s*\[\[\[parameter ' gives the same
    path, zone = params["schedulerzone"]
    assert path == ("Advanced Settings", "Advanced Networking")
    assert zone.attr("Config.Entries").op == ":="
    assert entry_values(zone.get("Config.Entries")) == ["1", "2", "3", "undefined"]
    # a ''' value over several lines (upstream lines 512-521), and a tab-indented line (158)
    about = params["about shared storage"][1].get("Config.Template")
    assert about.startswith("<p>The directories <code>/sched</code>") and about.rstrip().endswith("</p>")
    assert about.count("\n") == 9
    exports = upstream.nodes()["scheduler"].child("configuration", "cyclecloud.exports.builtinsched")
    assert exports.get("disabled") == "${!UseBuiltinSched || configuration_slurm_ha_enabled}"
    assert [spec_ref(c).text for c in upstream.nodes()["nodearraybase"].sections("cluster-init")] == [
        "cyclecloud/healthagent:default", "cyclecloud/monitoring:default", "cyclecloud/slurm:execute"]


def test_reader_on_cyclecloud_slurm_4_0_0(upstream_4_0_0):
    policy = upstream_4_0_0.parameters()["configuration_slurm_shutdown_policy"][1]
    entries = policy.sections("list")
    assert [(e.name, e.get("Name")) for e in entries] == [("Config.Entries", "Terminate"),
                                                           ("Config.Entries", "Deallocate")]
    assert policy.get("description").startswith("By default, autostop")  # lower-case key
    slurm_default = upstream_4_0_0.nodes()["defaults"].child("cluster-init", "cyclecloud/slurm:default:4.0.0")
    assert slurm_default.get("Optional") == "true"
    assert spec_ref(slurm_default) == SpecRef("cyclecloud/slurm:default:4.0.0", "cyclecloud", "slurm", "default",
                                              "4.0.0")


def test_reader_errors_name_the_line():
    with pytest.raises(TemplateError, match=r"t\.txt:3: 2 '\[' but 1 '\]'"):
        parse_template("[cluster c]\n  [[node defaults]]\n  [[node x]\n", "t.txt")
    with pytest.raises(TemplateError, match=r"t\.txt:2: '\[\[\[cluster-init a:b:1\]\]\]' \(depth 3\) has no enclosing"):
        parse_template("[cluster c]\n[[[cluster-init a:b:1]]]\n", "t.txt")
    with pytest.raises(TemplateError, match=r"t\.txt:1: attribute Order before any"):
        parse_template("Order = 1\n", "t.txt")
    with pytest.raises(TemplateError, match=r"t\.txt:3: ''' opened for Config.Template is never closed"):
        parse_template("[parameters p]\n[[parameter x]]\nConfig.Template = '''<p>\nmore\n", "t.txt")
    with pytest.raises(TemplateError, match=r"t\.txt:2: neither a \[section\]"):
        parse_template("[cluster c]\nthis is not an attribute\n", "t.txt")


def test_checks_pass_on_upstream_itself(upstream, upstream_4_0_0):
    """The reference and structure checks accept cyclecloud-slurm's own templates: they are not
    stricter than CycleCloud's format."""
    assert reference_problems(upstream) == []
    assert reference_problems(upstream_4_0_0) == []
    assert structure_problems(upstream, upstream, deviations={}) == []


def test_upstream_attaches_its_own_pyxis_spec_after_the_role_spec(upstream, upstream_4_0_0):
    """The precedent: cyclecloud-slurm 4.0.0-4.0.2 had a pyxis spec (it compiled pyxis), listed after
    the role spec on every node that has one (templates/slurm.txt lines 123-124, 187-188, 205-206);
    from 4.0.3 on pyxis is built inside the role spec itself (azure-slurm-install/ubuntu.sh, rhel.sh),
    so 4.0.9 has no pyxis spec and lingjun-slurm's must follow the role spec."""
    for name in ("scheduler", "login", "nodearraybase"):
        listed = [spec_ref(c) for c in upstream_4_0_0.nodes()[name].sections("cluster-init")]
        roles = [i for i, r in enumerate(listed) if is_slurm(r) and r.spec in ("scheduler", "login", "execute")]
        pyxis = [i for i, r in enumerate(listed) if is_slurm(r) and r.spec == "pyxis"]
        assert len(roles) == 1 and pyxis == [roles[0] + 1], (name, listed)
    assert not [r for name in upstream.nodes() for r in specs_run(upstream, name) if r.spec == "pyxis"]


# ---------------------------------------------------------------------------------------------
# The template


def test_template_keeps_upstream_structure_and_parameters(ours, upstream):
    assert structure_problems(ours, upstream) == []


def test_every_parameter_reference_resolves(ours):
    assert reference_problems(ours) == []


def test_lingjun_specs_follow_cyclecloud_slurm_on_every_node(ours):
    assert spec_problems(ours) == []


def test_which_nodes_get_which_spec(ours):
    project = project_ini()
    ours_only = {name: [r.spec for r in specs_run(ours, name) if r.project == project["name"]]
                 for name in concrete_nodes(ours)}
    assert ours_only == {
        "scheduler": ["default", "scheduler"],
        "scheduler-ha": ["default", "scheduler"],  # Extends = scheduler
        "login": ["default", "login"],
        "hpc": ["default"], "htc": ["default"], "dynamic": ["default"],  # no NCCL profile for CPU sizes
        "gpu": ["default", "execute"],
    }
    gpu = [r.text for r in specs_run(ours, "gpu")]
    assert gpu == ["cyclecloud/healthagent:default", "cyclecloud/monitoring:default", "cyclecloud/slurm:default",
                   f"lingjun-slurm:default:{project['version']}", "cyclecloud/slurm:execute",
                   f"lingjun-slurm:execute:{project['version']}"]


# The keys of config-keys.tsv that the template's lingjun-slurm page does not offer, each with why.
# They can still be set by hand in a [[[configuration]]] section (docs/cluster-init.md,
# "Parameters"); test_every_config_key_is_a_parameter_or_not_exposed keeps this list and the
# template together, so a new key must be put on the page or here.
NOT_EXPOSED = {
    "lingjun_slurm.monitoring.textfile_dir": "only for clusters whose node_exporter runs the textfile collector; "
                                             "the directory is that collector's setting, not a template choice",
    "lingjun_slurm.pins_file": "replaces every pinned version and checksum at once: a change to the project "
                               "(files/pins.tsv), tested with it, not a per-cluster choice",
    "lingjun_slurm.enroot.version": "a version needs its package checksums in the pins file; the per-cluster "
                                    "choice is enroot.min_version (keep what is installed)",
    "lingjun_slurm.enroot.libnvidia_container_version": "the same: its checksums come from the pins file; the "
                                                        "per-cluster choice is libnvidia_container_min_version",
    "lingjun_slurm.pyxis.version": "the same: its tarball checksum comes from the pins file; the per-cluster "
                                   "choice is pyxis.min_version",
    "lingjun_slurm.slurm.conf_dir": "cyclecloud-slurm writes slurm.conf to /etc/slurm; another directory would "
                                    "not be the one slurmd reads on this template's nodes",
    "lingjun_slurm.slurm.restart_slurmd": "slurmd loads a changed pyxis plugin only when restarted; off is for "
                                          "nodes managed by hand, where someone restarts it",
    "lingjun_slurm.storage.nvme_mount": "where the RAID0 is mounted, not what enroot uses: the Scratch directory "
                                        "parameter (storage.scratch) chooses that",
    "lingjun_slurm.storage.nvme_exclude_models": "a safety list (the default keeps Azure's remote NVMe disks from "
                                                 "being formatted); changing it can wipe a disk",
    "lingjun_slurm.enroot.caps": "enroot+caps lets users import images without root, which pyxis does for every "
                                 "--container-image; off only where file capabilities are forbidden",
    "lingjun_slurm.enroot.extra_packages": "the distribution packages enroot needs (pigz, squashfuse, "
                                           "fuse-overlayfs); fewer breaks enroot, more is the image's business",
    "lingjun_slurm.enroot.squash_options": "enroot.conf tuning with a working default; set by hand when needed",
    "lingjun_slurm.enroot.restrict_dev": "enroot.conf tuning with a working default; set by hand when needed",
    "lingjun_slurm.enroot.rootfs_writable": "enroot.conf tuning with a working default; set by hand when needed",
    "lingjun_slurm.enroot.mellanox_visible_devices": "enroot.conf tuning with a working default (all RDMA devices); "
                                                     "set by hand when needed",
    "lingjun_slurm.enroot.hooks": "enroot.conf tuning with a working default (Slurm PMI and PyTorch hooks); set by "
                                  "hand when needed",
    "lingjun_slurm.pyxis.plugin_dir": "detected from slurm.conf PluginDir, which cyclecloud-slurm sets; only for "
                                      "a Slurm installed elsewhere",
    "lingjun_slurm.pyxis.slurm_include": "detected (cyclecloud-slurm installs the headers in /usr/include); only "
                                         "for a Slurm installed elsewhere",
    "lingjun_slurm.pyxis.runtime_path": "derived from the scratch directory on execute nodes, /run/pyxis elsewhere",
    "lingjun_slurm.nccl.instance_type": "each node reads its own VM size from jetpack; one value for every node "
                                        "would be wrong for the CPU nodearrays and a second GPU one; the NCCL "
                                        "profile parameter is the per-cluster override",
}


def test_lingjun_keys_and_parameters(ours):
    assert lingjun_problems(ours) == []
    keys = {a.key for _s, a in configuration_attrs(ours) if a.key.startswith("lingjun_slurm.")}
    assert {"lingjun_slurm.pyxis.mode", "lingjun_slurm.pyxis.container_scope", "lingjun_slurm.enroot.credentials",
            "lingjun_slurm.nccl.profile", "lingjun_slurm.health.boot_check", "lingjun_slurm.checksums"} <= keys
    # the keys issue 14 added: site health figures that survive a rerun, nvidia-container-cli,
    # and the floors for adopting cyclecloud-slurm's enroot and pyxis
    assert {"lingjun_slurm.health.gpu_count", "lingjun_slurm.health.ib_port_count",
            "lingjun_slurm.health.ib_rate_gbps", "lingjun_slurm.enroot.nvidia_container_cli",
            "lingjun_slurm.enroot.min_version", "lingjun_slurm.enroot.libnvidia_container_min_version",
            "lingjun_slurm.pyxis.min_version"} <= keys


def exposed_keys(tpl: Template) -> set[str]:
    return {a.key for _s, a in configuration_attrs(tpl) if a.key.startswith("lingjun_slurm.")}


def test_every_config_key_is_a_parameter_or_not_exposed(ours):
    keys, exposed = set(config_keys()), exposed_keys(ours)
    assert exposed & set(NOT_EXPOSED) == set(), "on the page and listed as not exposed"
    assert set(NOT_EXPOSED) <= keys, "NOT_EXPOSED names a key config-keys.tsv no longer has"
    assert keys - exposed - set(NOT_EXPOSED) == set(), "neither a parameter nor listed in NOT_EXPOSED"
    assert all(reason.strip() for reason in NOT_EXPOSED.values())


def test_every_config_key_is_a_parameter_or_not_exposed_catches_a_dropped_one():
    tpl = mutated("        lingjun_slurm.health.gpu_count = $configuration_lingjun_slurm_health_gpu_count\n", "")
    assert set(config_keys()) - exposed_keys(tpl) - set(NOT_EXPOSED) == {"lingjun_slurm.health.gpu_count"}


DOCS = PROJECT.parent.parent / "docs" / "cluster-init.md"


def test_docs_list_the_parameters_and_what_is_not_exposed(ours):
    """docs/cluster-init.md, "Parameters": one table row per parameter of the page, and every key
    NOT_EXPOSED named in the list of keys left off it."""
    text = DOCS.read_text()
    section = text[text.index("### Parameters"):text.index("### The tests")]
    rows = {m.group(2): m.group(1) for m in
            re.finditer(r"^\| `(configuration_lingjun_slurm_\w+)` \| `(lingjun_slurm\.[\w.]+)` \|", section, re.M)}
    assert rows == {key: "configuration_" + key.replace(".", "_") for key in exposed_keys(ours)}
    left_off = section[section.index("#### Keys not on the page"):]
    assert [k for k in NOT_EXPOSED if f"`{k}`" not in left_off] == []


def test_gpu_vm_size_default_has_a_profile_and_thresholds(ours):
    """The one departure from upstream: its default GPU size (Standard_NC24rs_v3) is unknown to the
    execute spec, which refuses an instance type without an NCCL profile."""
    size = ours.parameters()["gpumachinetype"][1].get("DefaultValue")
    table = dict(line.split("\t") for line in INSTANCE_TYPES.read_text().splitlines() if not line.startswith("#"))
    assert size in table
    assert (PROJECT / "specs/execute/cluster-init/files/health/thresholds" / f"{table[size]}.conf").is_file()
    assert "Standard_NC24rs_v3" not in table


def test_ccw_parameter_file_fits_the_template(ours, upstream):
    """CycleCloud Workspace for Slurm creates its cluster from the stock template with this parameter
    file (bicep/install.sh: create_cluster slurm_template_VERSION ... -p slurm_params.json); a file
    exported from such a cluster must mean the same here. Names the stock template no longer has
    (renamed since) are ignored by both alike."""
    ccw = {name.lower() for name in json.loads(CCW_PARAMS.read_text())}
    up, mine = set(upstream.parameters()), set(ours.parameters())
    assert ccw & up == ccw & mine
    assert ccw - up == {"configuration_slurm_accounting_certificate_url", "configuration_slurm_disable_pmc",
                        "configuration_slurm_shutdown_policy"}


def test_ccw_cluster_init_specs_file(ours):
    """templates/ccw-cluster-init-specs.json: the *ClusterInitSpecs values for a cluster that keeps the
    stock template, in the form CCW's own create_cc_param.py writes (set_cluster_init_params: Order,
    Spec, Name, Project, Locker, Version; CCW numbers its own specs from Order 10000)."""
    project = project_ini()
    data = json.loads(CCW_SPECS.read_text())
    roles = {"SchedulerClusterInitSpecs": "scheduler", "LoginClusterInitSpecs": "login",
             "GPUClusterInitSpecs": "execute"}
    assert set(data) == set(roles)
    params = ours.parameters()
    for target, specs in data.items():
        assert params[target.lower()][1].get("ParameterType") == "Cloud.ClusterInitSpecs"
        for key, entry in specs.items():
            assert set(entry) == {"Order", "Spec", "Name", "Project", "Locker", "Version"}
            assert key == entry["Name"] == f"{entry['Project']}:{entry['Spec']}:{entry['Version']}"
            assert (entry["Project"], entry["Version"], entry["Locker"]) == (
                project["name"], project["version"], "azure-storage")
            assert entry["Order"] > 10000
        order = sorted(specs.values(), key=lambda e: e["Order"])
        assert [e["Spec"] for e in order] == ["default", roles[target]]


# ---------------------------------------------------------------------------------------------
# The checks fail on broken templates


def ci(ref: str) -> str:
    """A [[[cluster-init]]] line as the template indents it."""
    return f"        [[[cluster-init {ref}]]]\n"


def mutated(old: str, new: str, count: int = 1) -> Template:
    text = TEMPLATE.read_text()
    assert text.count(old) >= count, old
    return parse_template(text.replace(old, new, count), "mutated.txt")


def test_a_spec_before_cyclecloud_slurm_is_caught():
    text = TEMPLATE.read_text().replace(ci("cyclecloud/slurm:scheduler"), "")
    tpl = parse_template(text.replace(ci("lingjun-slurm:scheduler:1.0.0"),
                                      ci("lingjun-slurm:scheduler:1.0.0") + ci("cyclecloud/slurm:scheduler")), "mutated.txt")
    problems = spec_problems(tpl)
    assert "scheduler: lingjun-slurm:scheduler:1.0.0 runs before cyclecloud/slurm:scheduler" in problems
    assert "scheduler-ha: lingjun-slurm:scheduler:1.0.0 runs before cyclecloud/slurm:scheduler" in problems


def test_an_execute_spec_in_the_base_before_slurm_is_caught():
    tpl = mutated(ci("cyclecloud/slurm:execute"), ci("lingjun-slurm:execute:1.0.0") + ci("cyclecloud/slurm:execute"))
    problems = spec_problems(tpl)
    assert "hpc: lingjun-slurm:execute:1.0.0 runs before cyclecloud/slurm:execute" in problems
    assert "gpu: lingjun-slurm:execute:1.0.0 is listed more than once (in defaults, a base node or itself)" in problems


def test_wrong_version_wrong_role_and_missing_spec_are_caught():
    assert "gpu: lingjun-slurm:execute:0.9.0: version 0.9.0 but project.ini says 1.0.0" in spec_problems(
        mutated("lingjun-slurm:execute:1.0.0", "lingjun-slurm:execute:0.9.0"))
    assert "login: lingjun-slurm:scheduler:1.0.0 on a node whose cyclecloud/slurm role is ['login']" in spec_problems(
        mutated("lingjun-slurm:login:1.0.0", "lingjun-slurm:scheduler:1.0.0"))
    assert "gpu: lingjun-slurm:gpu:1.0.0: the project has no spec gpu" in spec_problems(
        mutated("lingjun-slurm:execute:1.0.0", "lingjun-slurm:gpu:1.0.0"))
    assert "gpu: lingjun-slurm:default must run before lingjun-slurm:execute:1.0.0" in spec_problems(
        mutated("        [[[cluster-init lingjun-slurm:default:1.0.0]]]\n", ""))
    text = TEMPLATE.read_text().replace(ci("lingjun-slurm:default:1.0.0"), "")
    early = parse_template(text.replace(ci("cyclecloud/slurm:default"),
                                        ci("lingjun-slurm:default:1.0.0") + ci("cyclecloud/slurm:default")), "mutated.txt")
    assert "htc: lingjun-slurm:default:1.0.0 runs before cyclecloud/slurm:default" in spec_problems(early)


def test_an_unresolved_reference_is_caught():
    tpl = mutated("lingjun_slurm.pyxis.mode = $configuration_lingjun_slurm_pyxis_mode",
                  "lingjun_slurm.pyxis.mode = $configuration_lingjun_slurm_pyxis_mood")
    assert [p for p in reference_problems(tpl) if "$configuration_lingjun_slurm_pyxis_mood" in p]
    assert [p for p in lingjun_problems(tpl) if "expected = $configuration_lingjun_slurm_pyxis_mode" in p]
    tpl = mutated("Conditions.Excluded := configuration_lingjun_slurm_pyxis_mode != \"provided\"",
                  "Conditions.Excluded := configuration_lingjun_slurm_pyxis_mod != \"provided\"")
    assert [p for p in reference_problems(tpl) if "refers to $configuration_lingjun_slurm_pyxis_mod," in p]
    tpl = mutated("${ifThenElse(BootDiskSize > 0, BootDiskSize, undefined)}",
                  "${ifThenElse(BootDiskSizeGB > 0, BootDiskSize, undefined)}")
    assert [p for p in reference_problems(tpl) if "$BootDiskSizeGB" in p]


def test_an_unknown_key_or_a_wrong_default_is_caught():
    tpl = mutated("lingjun_slurm.health.boot_check = $configuration_lingjun_slurm_health_boot_check",
                  "lingjun_slurm.health.bootcheck = $configuration_lingjun_slurm_health_boot_check")
    problems = lingjun_problems(tpl)
    assert [p for p in problems if "lingjun_slurm.health.bootcheck: not a key of config-keys.tsv" in p]
    assert [p for p in problems if "configuration_lingjun_slurm_health_boot_check sets no lingjun_slurm key" in p]
    tpl = mutated("Config.Entries := {[Value=\"job\"], [Value=\"global\"]}\n        DefaultValue = job",
                  "Config.Entries := {[Value=\"job\"], [Value=\"global\"]}\n        DefaultValue = global")
    assert [p for p in lingjun_problems(tpl) if "the installer's default is 'job', the parameter's 'global'" in p]
    tpl = mutated("        DefaultValue = 300\n", "        DefaultValue = 30\n")
    assert [p for p in lingjun_problems(tpl) if "expected an Integer parameter defaulting to 300" in p]
    tpl = mutated('{[Value="drain"], [Value="fail"], [Value="warn"], [Value="off"]}',
                  '{[Value="drain"], [Value="fail"], [Value="warn"]}')
    assert [p for p in lingjun_problems(tpl)
            if "Config.Entries must offer exactly ['drain', 'fail', 'warn', 'off']" in p]
    tpl = mutated('[Value="lingjun"], [Value="tcp"]}', '[Value="lingjun"]}')
    assert [p for p in lingjun_problems(tpl) if "lingjun_slurm.nccl.profile: Config.Entries must be" in p]


def test_a_lost_upstream_parameter_or_setting_is_caught(upstream):
    text = TEMPLATE.read_text()
    start = text.index("        [[[parameter SubnetId]]]")
    end = text.index("    [[parameters High Availability]]")
    tpl = parse_template(text[:start] + text[end:], "mutated.txt")
    assert "parameter SubnetId: missing" in structure_problems(tpl, upstream)
    tpl = mutated("slurm.version = $configuration_slurm_version", "slurm.version = 25.05.0")
    assert "[[node defaults]] [[[configuration]]]: differs in ['slurm.version']" in structure_problems(tpl, upstream)
    tpl = mutated("DefaultValue = Standard_D4ads_v5", "DefaultValue = Standard_D8ads_v5")
    assert "parameter SchedulerMachineType: differs in ['defaultvalue']" in structure_problems(tpl, upstream)
    tpl = mutated("        [[[cluster-init cyclecloud/monitoring:default]]]\n", "", 1)
    assert [p for p in structure_problems(tpl, upstream) if p.startswith("[[node defaults]]: cluster-init")]
    tpl = mutated("    [[parameters Networking]]\n    Order = 40", "    [[parameters Networking]]\n    Order = 45")
    assert "parameter group required settings / networking: Order 45, upstream 40" in structure_problems(tpl, upstream)
    tpl = mutated("DefaultValue = Standard_ND96isr_H100_v5", "DefaultValue = Standard_NC24rs_v3")
    assert "parameter GPUMachineType: the deviation defaultvalue = Standard_ND96isr_H100_v5 is not in effect" in \
        structure_problems(tpl, upstream)
