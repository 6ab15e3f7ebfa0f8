"""The simulator's tokenizer: exact for what it has learned, bounded whatever it is fed."""

from __future__ import annotations

from timely_llm.engines.sim_tokenizer import MAX_PIECE_CHARS, MAX_VOCAB, UNKNOWN, SimTokenizer
from timely_llm.traces import load_catalog

CATALOG = load_catalog()


def test_plans_learned_first_decode_exactly_after_a_flood_of_unique_words() -> None:
    tokenizer = SimTokenizer()
    plans = {t.id: tokenizer.encode(t.plan) for t in CATALOG.traces.values()}
    for i in range(MAX_VOCAB + 5_000):
        tokenizer.encode("find " + "".join(chr(ord("a") + int(d)) for d in f"{i:06d}"))  # a unique word each
    assert tokenizer.vocabulary_size == MAX_VOCAB
    for trace_id, ids in plans.items():
        assert tokenizer.decode(ids) == CATALOG[trace_id].plan
        assert tokenizer.encode(CATALOG[trace_id].plan) == ids


def test_a_huge_word_is_not_learned_and_decodes_as_unknown() -> None:
    tokenizer = SimTokenizer()
    before = tokenizer.vocabulary_size
    word = "x" * 1_000_000
    ids = tokenizer.encode(f"find {word}")
    assert tokenizer.vocabulary_size == before + 1  # " find" only: the long piece is hashed, not stored
    assert len(" " + word) > MAX_PIECE_CHARS and tokenizer.decode(ids) == "find" + UNKNOWN
    assert SimTokenizer().encode(f"find {word}")[1] == ids[1]  # hashed ids are the same in every process
