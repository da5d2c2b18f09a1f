"""The Markdown every page's truth is written in, checked block by block (shared by the page tests)."""

import re

LIST_LINE = re.compile(r"^(- |\d+[.)] )\S")


def check_markdown(md: str) -> None:
    """Blocks are headings, tables, list blocks or lines of text; tables are rectangular."""
    assert md and md == md.strip() and "\n\n\n" not in md
    for block in md.split("\n\n"):
        lines = block.split("\n")
        assert all(line and line == line.strip() and "  " not in line for line in lines), block
        if block.startswith("#"):
            assert re.match(r"^#{1,2} \S", block) and len(lines) == 1, block
        elif block.startswith("| "):
            cols = lines[0].count(" | ") + 1
            assert len(lines) >= 3 and lines[1] == "|" + " --- |" * cols, block
            assert all(r.startswith("| ") and r.endswith(" |") and r.count(" | ") + 1 == cols for r in lines), block
        elif LIST_LINE.match(lines[0]) and len(lines) > 1 and all(LIST_LINE.match(x) for x in lines):
            pass
        else:
            assert "|" not in block, block
