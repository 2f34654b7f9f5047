"""The docs stay true to the code and the README stays short and linked: the generated references
(recipe keys, CLI, the log's SQL contract) equal what tools/gen_docs.py makes from the code now,
every relative link of the README points at a file that exists, and the README keeps the two
commands CI and users run verbatim. (The site's own links are checked by `mkdocs build --strict`
in tools/test.sh.)"""

from __future__ import annotations

import re
from pathlib import Path

from tools import gen_docs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_generated_references_are_current() -> None:
    stale = [str(p.relative_to(ROOT)) for p in gen_docs.stale()]
    assert not stale, f"stale: {stale}; run: python tools/gen_docs.py"


def test_the_recipe_reference_names_every_key_with_its_default() -> None:
    text = gen_docs.recipe_reference()
    # a key from each of the Structs the recipe embeds, with its default and its comment
    assert "| `max_staleness` | `int` | `1` | async: iterations scheduled" in text
    assert "### `[trainer.lora]` { #recipe-trainer-lora }" in text
    assert "| `rank` | `int` | `8` |" in text
    assert "| `beta0` | `float` | `0.5` | teacher probability per turn" in text
    assert '`"slots"` \\| `"paged"`' in text  # a Literal shown as its values


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
