"""Tests of minirl.plots: the source a notebook prints, and one colour per arm."""

from minirl import importance, plots


def test_source_drops_the_docstring_and_keeps_the_code():
    text = plots.source(importance.token_tis_weights)
    assert text.startswith("def token_tis_weights(") and '"""' not in text
    assert "_truncate(log_ratio, cap, cap_low)" in text  # the body is all there


def test_source_of_a_function_without_a_docstring():
    def plain(x):
        return x + 1

    assert plots.source(plain).strip() == "def plain(x):\n    return x + 1"


def test_an_arm_has_one_colour_whatever_the_order():
    assert plots.arm_color("GRPO") == plots.PALETTE["GRPO"]
    other = plots.arm_color("some new arm")
    assert other == plots.arm_color("some new arm") and other.startswith("C")
