"""Rows of `st.metric` cards, each column as wide as its card's value needs, so a value shows whole.

Streamlit cuts a metric's value that is wider than its column with an ellipsis ("2 × H1...", "2,064 t..."), and
equal columns give a 17-character GPU name the room of "yes". `pack_rows` sizes each card in *value characters*
(the value font is about 17 px a character, measured in Chromium; a label character is about 0.42 of one, plus
room for the help icon and the gap between columns) and fills a row up to ROW_BUDGET of them, leaving the rest
of the row empty; the page then gives each card `need / ROW_BUDGET` of the main column. ROW_BUDGET keeps a
character at least 17 px wide in the wide layout's main column from a 1,280-pixel-wide window up.
"""

from dataclasses import dataclass

import streamlit as st

ROW_BUDGET = 48  # value characters per row
LABEL_SHARE = 0.42  # a label character's width in value characters
HELP_ICON = 1.5  # the (?) after a label with help, in value characters
GAP = 1.0  # the gap between two columns, in value characters


@dataclass(frozen=True)
class Card:
    """One metric: its label, its value as shown, and its help (None: no help icon)."""

    label: str
    value: str
    help: str | None = None

    @property
    def need(self) -> float:
        """The width this card needs, in value characters (its value or its label, the wider, and a gap)."""
        label = LABEL_SHARE * len(self.label) + (HELP_ICON if self.help else 0.0)
        return max(len(self.value), label) + GAP


def pack_rows(cards: list[Card], budget: float = ROW_BUDGET) -> list[list[Card]]:
    """The cards in order, in rows whose needs add up to at most `budget` (a card wider than the budget gets a
    row of its own)."""
    rows: list[list[Card]] = []
    used = budget
    for card in cards:
        if used + card.need > budget:
            rows.append([])
            used = 0.0
        rows[-1].append(card)
        used += card.need
    return rows


def metric_cards(cards: list[Card], budget: float = ROW_BUDGET) -> None:
    """`st.metric` for each card, in `pack_rows` rows: column widths in proportion to the cards' needs, the
    row's unused budget left as an empty column."""
    for row in pack_rows(cards, budget):
        widths = [card.need for card in row]
        spare = budget - sum(widths)
        columns = st.columns([*widths, spare] if spare > 0 else widths)
        for column, card in zip(columns, row, strict=False):
            column.metric(card.label, card.value, help=card.help)
