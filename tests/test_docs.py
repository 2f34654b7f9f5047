"""The docs stay true to the code and the README stays short and linked: the generated references
(recipe keys, CLI, the log's SQL contract) equal what tools/gen_docs.py makes from the code now,
every relative link of the README points at a file that exists, and the README keeps the two
commands CI and users run verbatim. (The site's own links are checked by `mkdocs build --strict`
in tools/test.sh.)"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec

from stacx.launch.recipe import Recipe
from tools import gen_docs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_generated_references_are_current() -> None:
    stale = [str(p.relative_to(ROOT)) for p in gen_docs.stale()]
    assert not stale, f"stale: {stale}; run: python tools/gen_docs.py"


def test_the_recipe_reference_names_every_key_with_its_default() -> None:
    text = gen_docs.recipe_reference()
    structs: list[type] = [Recipe]
    missing: list[str] = []
    while structs:  # every Struct the recipe embeds, tables of tables and union members too
        cls = structs.pop()
        for f in gen_docs.struct_fields(cls):
            default = gen_docs._cell(f"`{f.default}`") if f.default else "(required)"
            if f"| `{f.name}` | {gen_docs._type(f)} | {default} |" not in text:
                missing.append(f"{cls.__name__}.{f.name}")
            structs.extend(_structs_in(f.hint))
    assert not missing, f"keys missing from the reference: {missing}"
    # what a reader relies on: a comment explains its key, a table has a stable anchor, a
    # Literal shows its values
    assert "| `rank` | `int` | `8` |" in text
    assert "names of linear modules (their last name component" in text  # a comment above
    assert "### `[trainer.lora]` { #recipe-trainer-lora }" in text
    assert "(stacx.train.lora)" in text  # LoraConfig's docstring
    assert '| `dtype` | `"float32"` \\| `"bfloat16"`' in text


def _structs_in(hint: object) -> list[type]:
    """The Struct classes a type holds (itself, an Optional of one, a union of several)."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return [hint]
    return [t for arg in typing.get_args(hint) for t in _structs_in(arg)]


def test_readme_links_point_at_existing_files() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert any(t.startswith("docs/") for t in local), "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250; move text to docs/)"
    commands = [line.split("#")[0].strip() for line in lines]
    assert "bash tools/quickstart.sh" in commands
    assert "bash tools/test.sh" in commands  # CI runs the README's test command verbatim
