"""The table of docs/failures.md ("Verb by verb"), written from templm.cli.contracts, the list the suite's fault
matrix (tests/test_fault_matrix.py) checks every cell of, so that the page and the tests cannot drift apart.

    python tools/failures_table.py           # rewrite the page's table
    python tools/failures_table.py --check   # change nothing: exit 1 where the page's table is not the list's
"""

import argparse
import os
import sys
from typing import List

from readme_tables import replace_between, settle  # this folder's; a script's folder is on its path
from templm.cli.contracts import markdown_table

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "failures.md")
BEGIN = "<!-- failures_table: begin (written by tools/failures_table.py from templm/cli/contracts.py) -->"
END = "<!-- failures_table: end -->"


def with_table(page: str) -> str:
    """The page's text with the contracts' table between its marker lines (a ValueError where they are not there
    once each, in order)."""
    return replace_between(page, BEGIN, END, markdown_table().rstrip("\n"))


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default=PAGE, help="the Markdown page with the marker lines (docs/failures.md)")
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 where the page differs")
    args = parser.parse_args(argv)
    with open(args.page, encoding="utf-8") as f:
        page = f.read()
    return settle(args.page, page, with_table(page), args.check,
                  "the table is not templm/cli/contracts.py's; run tools/failures_table.py",
                  "table from templm/cli/contracts.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
