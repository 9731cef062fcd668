import pytest

from runtime.factory.text_metrics import (
    GLITCH_KINDS,
    SignatureIndex,
    banned_hits,
    distinct_n,
    glitches,
    nonwords,
    novelty,
    slot_violations,
    slots_used,
    words,
)


def test_distinct_2_is_one_for_all_different_bigrams_and_low_for_repeats():
    assert distinct_n(["a b c", "d e f"], 2) == 1.0
    assert distinct_n(["halt who goes there"] * 4, 2) == 0.25
    assert distinct_n([], 2) == 0.0


def test_novelty_ignores_whitespace_differences():
    known = {"Halt! Who goes there?"}
    assert novelty(["Halt!  Who goes there?", "Halt, stranger."], known) == 0.5


def test_banned_words_match_whole_words_only():
    assert banned_hits("Grab your phone, friend.", ["phone"]) == ["phone"]
    assert banned_hits("A fine xylophone.", ["phone"]) == []
    assert banned_hits("Call the police car now", ["police car"]) == ["police car"]


def test_slot_violations_list_slots_not_allowed():
    text = "Welcome to {location}, {player}."
    assert slots_used(text) == {"location", "player"}
    assert slot_violations(text, {"player"}) == {"location"}
    assert slot_violations(text, {"player", "location"}) == set()


VOCAB = {"halt", "who", "goes", "there", "the", "gate", "murmur", "mmm", "i", "mean", "it", "um", "hello", "h"}


def test_words_are_lower_case_and_leave_slot_markers_out():
    assert words("Halt, {player}! I'll see {location}.") == ["halt", "i'll", "see"]
    assert nonwords("Halt, {player}! Who gooes there?", VOCAB) == ["gooes"]
    assert nonwords("Halt! Who goes there?", VOCAB) == []


@pytest.mark.parametrize(("text", "kinds"), [
    ("Halt! Who goes there?", []),
    ("Um... H-hello, I-I mean it.", []),  # the book's ellipsis and written stutters
    ("Mmm, a murmur at the gate.", []),  # repeated letters of words the book says
    ("Halt,, who goes there?", ["double_punct"]),
    ("Halt!. Who goes there?", ["double_punct"]),
    ("Halt., who goes there?", ["double_punct"]),
    ("Who goes there?!. Halt.", ["double_punct"]),
    ("Halt! , Who goes there?", ["double_punct", "space_before_punct"]),
    ("Halt.. Who goes there....", ["double_punct"]),
    ("Halt! Who goes the the gate?", ["double_word"]),
    ("Halt, {player} {player}!", ["double_word"]),
    ("Halt! Who goes woororor there?", ["stutter"]),
    ("Halt! Who gatgate there?", ["stutter"]),
    ("Halt! Who goooes there?", ["stutter"]),
    ("Halt ! Who goes there?", ["space_before_punct"]),
    ("halt! Who goes there?", ["lowercase_start"]),
    ("Halt! who goes there?", ["lowercase_start"]),
    ("Halt! I've a oaf for a son.", ["a_an"]),
    ("Halt! An hour, a one-eyed rogue, an oaf.", []),
    ("Halt! {location}'s that way, and {player}'ll follow.", ["slot_possessive"]),
    ("Halt! {location} is that way, {player}. It's near.", []),
    ("Halt,, the the woororor , gate. who is a oaf at {location}'s", list(GLITCH_KINDS)),
])
def test_glitches_name_each_kind_once(text, kinds):
    assert glitches(text, VOCAB) == kinds


def test_signature_index_matches_whole_word_phrases_across_punctuation_not_slots():
    index = SignatureIndex({
        "archetype:guard": ["citizen", "halt and"],
        "archetype:sailor": ["sea legs"],
        "context:time_of_day=night": ["quiet night", "dark"],
        "persona:gruff": ["hmph", "dark"],
    })
    assert index.hits("Halt, and stay, citizen.") == {"archetype:guard"}
    assert index.hits("Citizens, halt!") == set()  # whole words only
    assert index.hits("Sea {item} legs") == set()  # no phrase across a slot marker
    assert index.hits("My sea-legs! A quiet... night.") == {"archetype:sailor", "context:time_of_day=night"}
    assert index.hits("Hmph. Dark.") == {"persona:gruff", "context:time_of_day=night"}
    assert SignatureIndex({}).hits("anything") == set()
