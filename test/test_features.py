"""The scheduler's switchable parts: one parser for bench, sweep and the node."""

import pytest

from timely_llm.core.features import DEFAULT, Features


def test_parse_names_all_none_default():
    assert Features.parse("timebill,amin").on == ("timebill", "amin")
    assert Features.parse("deferred-prefill").deferred_prefill
    assert Features.parse("all").on == Features.names()
    assert Features.parse("none").on == ()
    assert Features.parse("default") == DEFAULT


def test_label_inverts_parse():
    for text in ("none", "all", "amin,shed", "timebill"):
        assert Features.parse(Features.parse(text).label()) == Features.parse(text)


def test_unknown_part_is_named():
    with pytest.raises(ValueError, match="unknown scheduler feature.*warp"):
        Features.parse("timebill,warp")
