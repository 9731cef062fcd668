from runtime.text_metrics import banned_hits, distinct_n, novelty, slot_violations, slots_used


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
