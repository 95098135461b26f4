"""A markdown table row, shared by the benchmark scripts that print their results as tables."""


def format_row(cells: list[str]) -> str:
    """`["a", "b"]` -> `"| a | b |"`."""
    return "| " + " | ".join(cells) + " |"
