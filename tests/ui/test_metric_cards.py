"""Metric cards sized by their values: the widths and row breaks worked by hand, and the cards an app draws (a real
browser checks that no value is cut: tests/app/test_browser_slo_planner.py)."""

import pytest
from streamlit.testing.v1 import AppTest

from ui.metric_cards import GAP, HELP_ICON, LABEL_SHARE, ROW_BUDGET, Card, pack_rows


def test_a_card_needs_its_value_or_its_label_whichever_is_wider():
    assert Card("Deployment", "2 × H100 SXM 80GB").need == 17 + GAP  # the value: 17 characters
    assert Card("KV-limited", "no", "help").need == pytest.approx(
        10 * LABEL_SHARE + HELP_ICON + GAP
    )  # the label


def test_rows_fill_up_to_the_budget_in_order():
    # needs 18, 10, 12 (48 with the gaps: one full row), then 5.2 (a new row)
    cards = [Card("Deployment", "2 × H100 SXM 80GB"), Card("TP", "1 × 1 × 2 x"), Card("Out", "2,021 tok/s")]
    cards.append(Card("Converged", "yes"))
    assert [c.need for c in cards] == pytest.approx([18, 12, 12, 0.42 * 9 + 1])
    assert pack_rows(cards, budget=42) == [cards[:3], cards[3:]]
    assert pack_rows(cards, budget=41.9) == [cards[:2], cards[2:]]
    wide = Card("x", "y" * 60)  # wider than a row: a row of its own, nothing lost
    assert pack_rows([cards[3], wide, cards[3]]) == [[cards[3]], [wide], [cards[3]]]
    assert ROW_BUDGET >= 18 + 12 + 12  # the predict page's widest first three cards share a row


def _draw():
    from ui.metric_cards import Card, metric_cards

    accepted = Card("Mean accepted length", "2.47 tokens/step", "1 + a1 + a1 a2")
    metric_cards([Card("Deployment", "2 × H100 SXM 80GB"), Card("KV-limited", "no", "held back"), accepted])


def test_an_app_shows_every_card_with_its_value_and_help():
    at = AppTest.from_function(_draw).run()
    assert not at.exception
    shown = [(m.label, m.value, m.help) for m in at.metric]
    assert shown[:2] == [("Deployment", "2 × H100 SXM 80GB", ""), ("KV-limited", "no", "held back")]
    assert shown[2] == ("Mean accepted length", "2.47 tokens/step", "1 + a1 + a1 a2")
