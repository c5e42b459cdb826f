"""Tidy checks: the import layers of CONTRIBUTING.md ("Rules the code keeps"), by scanning src/ferrymq
with ast, plus the one-copy rule for the test command (README.md and .ci/run run the same line).

    common  <-  remoting  <-  client  <-  cli, spark
    common  <-  store     <-  ha      <-  broker
    common  <-  remoting  <-  namesrv, broker

``ferrymq.errors`` (the exception tree) and the package root are usable from every layer.
``__main__.py`` files are entry points and may import the CLI.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ferrymq"

SHARED = {"errors", ""}  # ferrymq.errors, ferrymq (root)
#: layer -> the ferrymq layers it may import (besides itself and SHARED)
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "remoting": {"common"},
    "store": {"common"},
    "ha": {"common", "store"},
    "acl": {"common", "remoting"},
    "namesrv": {"common", "remoting", "acl"},
    "broker": {"common", "remoting", "store", "ha", "acl"},
    "controller": {"common", "remoting"},
    "client": {"common", "remoting"},
    "spark": {"common", "remoting", "client"},
    "console": {"common", "remoting", "client"},
    "proxy": {"common", "remoting", "acl", "client"},
    "cli": {"common", "remoting", "store", "ha", "acl", "namesrv", "broker", "controller", "client", "spark",
            "console", "proxy"},
}
#: stdlib/third-party modules that mean I/O or an event loop
NETWORK_OR_LOOP = {"asyncio", "socket", "selectors", "ssl", "uvloop", "socketserver", "http", "urllib"}
#: layer -> top-level modules it must not import at all
FORBIDDEN_TOP: dict[str, set[str]] = {
    "store": NETWORK_OR_LOOP,
}
#: sans-IO codec modules (path relative to src/ferrymq): no asyncio / sockets
CODEC_GLOBS = ["**/codec.py", "**/*_codec.py", "remoting/jsonx.py"]
#: remoting modules that do I/O (a codec must not import them)
REMOTING_IO = {"connection", "server", "pool"}


@dataclass(frozen=True)
class Imp:
    path: Path
    line: int
    module: str  # absolute dotted name


def _module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, src: Path = SRC) -> Iterator[Imp]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = _module_name(path, src)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Imp(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from ferrymq import store" imports ferrymq.store: name each imported attribute
            for alias in node.names:
                yield Imp(path, node.lineno, f"{target}.{alias.name}")


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ferrymq":
        return None
    if len(parts) == 1:
        return ""
    if parts[1] in ALLOWED or parts[1] == "errors":
        return parts[1]
    return ""  # an attribute of the package root, e.g. ferrymq.__version__


def _py_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)


def layer_violations(src: Path) -> list[str]:
    bad = []
    for path in _py_files(src):
        rel = path.relative_to(src)
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        if layer is None or layer not in ALLOWED or path.name == "__main__.py":
            continue
        allowed = ALLOWED[layer] | SHARED | {layer}
        for imp in _imports(path, src):
            target = _layer_of(imp.module)
            if target is not None and target not in allowed:
                bad.append(f"{rel}:{imp.line} ({layer}) imports {imp.module}")
    return bad


def forbidden_module_violations(src: Path) -> list[str]:
    bad = []
    for layer, forbidden in FORBIDDEN_TOP.items():
        for path in _py_files(src / layer) if (src / layer).is_dir() else []:
            for imp in _imports(path, src):
                if imp.module.split(".")[0] in forbidden:
                    bad.append(f"{path.relative_to(src)}:{imp.line} imports {imp.module}")
    return bad


def codec_modules(src: Path) -> list[Path]:
    return sorted({p for g in CODEC_GLOBS for p in src.glob(g)})


def codec_violations(src: Path) -> list[str]:
    bad = []
    for path in codec_modules(src):
        for imp in _imports(path, src):
            parts = imp.module.split(".")
            if parts[0] in NETWORK_OR_LOOP:
                bad.append(f"{path.relative_to(src)}:{imp.line} imports {imp.module}")
            elif parts[:2] == ["ferrymq", "remoting"] and len(parts) > 2 and parts[2] in REMOTING_IO:
                bad.append(f"{path.relative_to(src)}:{imp.line} imports I/O module {imp.module}")
    return bad


def common_violations(src: Path) -> list[str]:
    bad = []
    for path in _py_files(src / "common") if (src / "common").is_dir() else []:
        for imp in _imports(path, src):
            target = _layer_of(imp.module)
            if target is not None and target not in {"common"} | SHARED:
                bad.append(f"{path.relative_to(src)}:{imp.line} imports {imp.module}")
    return bad


def test_source_tree_found() -> None:
    assert (SRC / "__init__.py").exists()
    assert len(_py_files(SRC)) > 5
    assert codec_modules(SRC), "no codec modules found"


def test_layers_import_one_way() -> None:
    bad = layer_violations(SRC)
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_store_does_no_networking_or_asyncio() -> None:
    bad = forbidden_module_violations(SRC)
    assert not bad, "\n".join(bad)


def test_codecs_are_sans_io() -> None:
    bad = codec_violations(SRC)
    assert not bad, "\n".join(bad)


def test_common_imports_no_other_layer() -> None:
    bad = common_violations(SRC)
    assert not bad, "\n".join(bad)


def processor_context_violations(src: Path) -> list[str]:
    """Broker processors take their context (broker/context.py), never the controller: no module under
    broker/processors imports broker/app.py, not even under TYPE_CHECKING; context.py imports neither."""
    broker = src / "broker"
    paths = _py_files(broker / "processors") if (broker / "processors").is_dir() else []
    paths += [broker / "context.py"] if (broker / "context.py").exists() else []
    bad = []
    for path in paths:
        forbidden = ["ferrymq.broker.app"] + (["ferrymq.broker.processors"] if path.name == "context.py" else [])
        for imp in _imports(path, src):
            if any(imp.module == f or imp.module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(src)}:{imp.line} imports {imp.module}")
    return bad


def test_processors_take_a_narrow_context(tmp_path: Path) -> None:
    bad = processor_context_violations(SRC)
    assert not bad, "\n".join(bad)
    assert (SRC / "broker" / "context.py").exists()
    # the scanner itself, on a fake tree: a type-only import, a relative one, and context.py importing a processor
    fake = tmp_path / "ferrymq"
    files = {
        "broker/processors/send.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from ferrymq.broker.app import BrokerController\n",
        "broker/processors/pull.py": "from ..app import BrokerController\nfrom ferrymq.broker.context import P\n",
        "broker/context.py": "from ferrymq.broker.processors import send\nfrom ferrymq.broker.config import C\n",
    }
    for rel, text in files.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    assert processor_context_violations(fake) == [
        "broker/processors/pull.py:1 imports ferrymq.broker.app.BrokerController",
        "broker/processors/send.py:3 imports ferrymq.broker.app.BrokerController",
        "broker/context.py:1 imports ferrymq.broker.processors.send",
    ]


def test_checks_catch_violations(tmp_path: Path) -> None:
    """The scanners themselves, on a small fake tree with one violation of each rule."""
    src = tmp_path / "ferrymq"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "common/__init__.py": "",
        "common/value.py": "from ferrymq.remoting import codes\nfrom ferrymq.errors import X\n",
        "remoting/__init__.py": "",
        "remoting/codec.py": "import asyncio\nfrom .connection import Connection\nfrom ferrymq.common import value\n",
        "remoting/connection.py": "import asyncio\n",
        "store/__init__.py": "",
        "store/log.py": "import socket\nfrom ..ha import master\nfrom ferrymq.common.value import V\n",
        "ha/__init__.py": "",
        "ha/master.py": "from ferrymq.store import log\nfrom ferrymq import broker\n",
        "broker/__init__.py": "",
        "broker/__main__.py": "from ferrymq.cli.broker import command\n",
        "broker/app.py": "from ferrymq import store, ha\nfrom ferrymq.remoting.server import S\n",
    }
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    assert layer_violations(src) == [
        "common/value.py:1 (common) imports ferrymq.remoting.codes",
        "ha/master.py:2 (ha) imports ferrymq.broker",
        "store/log.py:2 (store) imports ferrymq.ha.master",
    ]
    assert forbidden_module_violations(src) == ["store/log.py:1 imports socket"]
    assert codec_violations(src) == [
        "remoting/codec.py:1 imports asyncio",
        "remoting/codec.py:2 imports I/O module ferrymq.remoting.connection.Connection",
    ]
    assert common_violations(src) == ["common/value.py:1 imports ferrymq.remoting.codes"]


# ---------------------------------------------------------------------------------------------
# README and .ci/run must run the same test command

def fenced_lines(text: str) -> list[str]:
    """Non-blank, non-comment lines inside ``` fences (the same rule as the awk in .ci/run)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        stripped = line.strip()
        if fence and stripped and not stripped.startswith("#"):
            out.append(stripped)
    return out


def readme_commands() -> list[str]:
    return fenced_lines((REPO / "README.md").read_text())


def readme_test_command() -> str:
    found = [c for c in readme_commands() if "pytest" in c]
    assert len(found) == 1, f"README must hold exactly one test command (a line running pytest), got {found}"
    return found[0]


def test_readme_has_exactly_two_setup_commands() -> None:
    text = (REPO / "README.md").read_text()
    section = text.split("## Set-up", 1)
    assert len(section) == 2, "README needs a '## Set-up' section"
    body = section[1].split("\n## ", 1)[0]
    cmds = fenced_lines(body)
    assert len(cmds) == 2, cmds
    assert "quickstart" in cmds[0]
    assert cmds[1] == readme_test_command()


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    cmd = readme_test_command()
    # .ci/run extracts the command from README at run time; check that extraction gives the same line
    out = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--print-test-command"], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == cmd, (out.stdout, cmd)
    assert "README.md" in ci
    shlex.split(cmd)  # parseable shell


@pytest.mark.parametrize("tool", ["ruff check .", "mypy"])
def test_ci_runs_linters(tool: str) -> None:
    assert tool in (REPO / ".ci" / "run").read_text()


def test_readme_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)\)", text)
    local = [ln for ln in links if "://" not in ln]
    missing = [ln for ln in local if not (REPO / ln).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by basename (rootdir-relative "prepend" import mode): two test files with
    the same name in different directories stop the whole run at collection."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "node_modules" in path.parts:
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(REPO)} and {path.relative_to(REPO)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test modules sharing a name: " + "; ".join(clashes)


def test_nothing_refers_to_folders_outside_the_repository() -> None:
    """A clone on its own must build and test: no tracked file may point at a sibling of the checkout
    (fixtures a test reads live under tests/fixtures/)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    pattern = re.compile(r"\.\./" + "shared" + r"\b|parent\s*/\s*[\"']" + "shared")
    offenders = []
    for name in tracked.splitlines():
        path = REPO / name
        if path.suffix not in {".py", ".md", ".toml", ".cfg", ".sh", ".txt", ".json", ""} or not path.is_file():
            continue
        if pattern.search(path.read_text(errors="replace")):
            offenders.append(name)
    assert not offenders, f"files referring outside the repository: {offenders}"


def test_recorded_client_frames_are_in_the_repository() -> None:
    from support.shared import CAPTURES

    assert CAPTURES.is_relative_to(REPO)
    for name in ("capture_cpp.jsonl", "capture_cpp_slave_only.jsonl", "capture_alions.jsonl"):
        assert (CAPTURES / name).stat().st_size > 0, name
