"""Markdown pieces the report's tables share."""
from __future__ import annotations


def table_head(head: str) -> list[str]:
    """A Markdown table's first two lines: the header row `head` ("| a | b |") and its separator row."""
    return [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
