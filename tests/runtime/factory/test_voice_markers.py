"""A persona trait's voice markers: the phrases its whole replies keep saying, counted as the
trait being voiced (the book composes no mood fragment beside a trait reply)."""
from runtime.factory.linebook import load_line_book
from runtime.factory.text_metrics import SignatureIndex
from runtime.factory.writer_eval import LineJudge


def test_each_traits_markers_are_its_own_recurring_words():
    markers = load_line_book().voice_markers()
    assert "um" in markers["persona:shy"]
    assert "hmph" in markers["persona:gruff"]
    assert "profit" in markers["persona:greedy"]
    owners: dict[str, str] = {}
    for tag, phrases in markers.items():
        for phrase in phrases:
            assert phrase not in owners, f"{phrase!r} marks {owners.get(phrase)} and {tag}"
            owners[phrase] = tag


def test_no_line_says_a_traits_marker_without_the_trait_in_its_prompt():
    book = load_line_book()
    index = SignatureIndex(book.voice_markers())
    for e in book.examples()[::7]:
        said = index.hits(e.text)
        assert said <= {f"persona:{t}" for t in e.persona}, (e, said)


def test_a_marker_must_recur_through_min_templates_of_the_traits_replies():
    book = load_line_book()
    assert all(not phrases for phrases in book.voice_markers(min_templates=10_000).values())
    assert sum(map(len, book.voice_markers(min_templates=2).values())) >= sum(map(len, book.voice_markers().values()))


def test_a_trait_reply_counts_as_voicing_its_trait_but_decoding_does_not_ban_its_markers():
    book = load_line_book()
    judge = LineJudge(book, bigrams=set())
    line = "Um, hello. Sorry, I'm not much of a talker."
    request = ("guard", ("shy",), "idle", "greet", ())
    assert judge.verdict(request, line).persona_voiced
    assert not judge.verdict(("guard", ("gruff",), "idle", "greet", ()), line).persona_voiced
    before = book.signatures()
    markers = book.voice_markers()
    assert book.signatures() == before  # the markers are no signatures: decoding never bans them
    assert set(markers["persona:weary"]) - set(before["persona:weary"])
