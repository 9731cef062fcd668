"""flashnpc finetune: the studio's file, new control tokens, frozen router and backbone, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from runtime.client.authored import AuthoredBook  # noqa: E402
from runtime.factory import finetune as ft  # noqa: E402
from runtime.factory.finetune import FinetuneConfig, FinetuneError, RoutingRefused  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402

CATALOG = json.loads((Path(ft.__file__).resolve().parent.parent / "assets/flash/catalog.json").read_text())

LINES = [
    {"archetype": "quartermaster", "state": "working", "line": "Every barrel counted twice, every coin once.",
     "intent": "trade", "context": {"tide": "low"}},
    {"archetype": "quartermaster", "state": "idle", "line": "The tide's out and so is my patience, {player}."},
    {"archetype": "smuggler", "state": "friendly", "line": "Keep your voice down and your purse open.",
     "persona": ["sly", "salty"]},
    {"archetype": "smuggler", "state": "alert", "line": "Lanterns on the water. Douse yours, quick.",
     "context": "tide=high"},
    {"archetype": "guard", "state": "patrol", "line": "The harbour chain is up tonight."},
    {"archetype": "quartermaster", "state": "working", "line": "Low water, and the hull plates are showing.",
     "context": {"tide": "low"}, "like": "merchant"},
    {"archetype": "smuggler", "state": "idle", "line": "High water tonight, and no moon.", "context": {"tide": "high"}},
    {"archetype": "smuggler", "state": "working", "line": "Low water, so the skiff waits.", "context": {"tide": "low"}},
    {"archetype": "guard", "state": "patrol", "line": "High water. The chain is up.", "context": {"tide": "high"}},
    {"archetype": "smuggler", "state": "drunk", "line": "Another round! Hic.", "intent": "wave"},
    {"archetype": "smuggler", "state": "idle", "line": "Caf\u00e9? Non. Rhum, s'il vous pla\u00eet.", "intent": "greet"},
] * 3


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_rows_are_named_by_file_line_and_field(tmp_path):
    csv_file = tmp_path / "lines.csv"
    csv_file.write_text(
        "archetype,state,line,persona,intent,context\n"
        "smuggler,friendly,Fair enough.,sly,,\n"           # fine
        "smuggler,patrols,Fair enough.,,,\n"               # 3: a slip for a base state
        ",idle,Nobody.,,,\n"                                # 4: missing archetype
        "smuggler,idle,Where's {captain}?,,,\n"            # 5: unknown slot
        "smuggler,idle,Fine.,,treaten,\n"                   # 6: a slip for a base intent
        "smuggler,idle,Fine.,,,tide\n"                      # 7: context not slot=value
        "smuggler,idle,Call me on the phone.,,,\n"          # 8: banned word
        "Smuggler,idle,Fine.,,,\n"                          # 9: not a name
        "smuggler,idle,Caf\u00e9 au lait.,,,\n"             # fine: Unicode text
        "smuggler,idle,Zero\u200bwidth.,,,\n"              # 11: a format character
    )
    with pytest.raises(FinetuneError) as info:
        ft.read_lines(csv_file, CATALOG, banned_words=["phone"])
    problems = info.value.problems
    where = [p.split(": ", 2)[0] for p in problems]
    assert where == [f"{csv_file}:{n}" for n in (*range(3, 10), 11)]
    for n, field in zip((*range(3, 10), 11), ["state", "archetype", "line", "intent", "context", "line",
                                              "archetype", "line"], strict=True):
        assert any(p.startswith(f"{csv_file}:{n}: {field}") for p in problems), (n, problems)
    assert "banned word 'phone'" in problems[5]
    assert "U+200B" in problems[-1]
    assert "did you mean 'patrol'" in problems[0] and "did you mean 'threaten'" in problems[3]

    bad_json = tmp_path / "lines.jsonl"
    bad_json.write_text('{"archetype": "smuggler", "state": "idle", "line": "Hm."}\n[1]\n{"state": "idle"\n'
                        '{"archetype": "a", "state": "idle", "line": "x", "mood": "sad"}\n')
    with pytest.raises(FinetuneError) as info:
        ft.read_lines(bad_json, CATALOG)
    assert [p.split(": ")[0] for p in info.value.problems] == [f"{bad_json}:{n}" for n in (2, 3, 4)]
    assert "mood: unknown field" in info.value.problems[2]

    header = tmp_path / "header.csv"
    header.write_text("archetype,line,voice\nx,y,z\n")
    with pytest.raises(FinetuneError, match=r"header.csv:1: unknown column 'voice'.*missing column 'state'"):
        ft.read_lines(header, CATALOG)


def test_like_must_name_a_base_archetype_for_a_new_one_and_agree_across_rows(tmp_path):
    bad = tmp_path / "like.csv"
    bad.write_text("archetype,state,line,like\n"
                   "smuggler,idle,Quiet night.,thief\n"       # fine
                   "smuggler,idle,Quiet night.,noble\n"       # 3: disagrees with line 2
                   "guard,idle,Quiet night.,thief\n"          # 4: guard is the base's own
                   "harbormaster,idle,Quiet night.,pirate\n"  # 5: not a base archetype
                   "harbormaster,idle,Quiet night.,\n")       # fine (nearest)
    with pytest.raises(FinetuneError) as info:
        ft.read_lines(bad, CATALOG)
    assert info.value.problems == [
        f"{bad}:3: like: 'smuggler' is like 'thief' at {bad}:2, here 'noble'",
        f"{bad}:4: like: 'guard' is the base model's own archetype; like names where a new one starts",
        f"{bad}:5: like: 'pirate' is not an archetype of the base model ({', '.join(CATALOG['archetypes'])})",
    ]


def test_new_tokens_start_from_the_declared_or_the_nearest_base_tag(tiny_model_dir, tmp_path, one_torch_thread):
    from runtime.factory.train import TrainSeq, encode_examples

    base = ft.load_base(tiny_model_dir)
    lines = ft.read_lines(write_jsonl(tmp_path / "l.jsonl", LINES), base.catalog)
    catalog, _ = ft.extend_catalog(base.catalog, lines)
    tok, id_map = ft.extend_tokenizer(base.tokenizer, catalog)
    new_ids = ft.resize_vocab(base.model, base.tokenizer, tok, id_map)
    seqs = encode_examples(tok, lines, base.model.config.block_size)[0]
    qm, merchant = tok.id_of("<arch:quartermaster>"), tok.id_of("<arch:merchant>")
    started = ft.start_rows(base.model, tok, seqs, new_ids, {qm: merchant})
    assert set(started) == {tok.controls[i] for i in new_ids}
    assert started["<arch:quartermaster>"]["from"] == "<arch:merchant>"
    assert started["<arch:quartermaster>"]["how"] == "declared"
    wte = base.model.transformer.wte.weight
    assert torch.equal(wte[qm], wte[merchant])
    # the smuggler: the base archetype (other than the taken merchant) whose token in its
    # prompts gives its lines the lowest cross-entropy
    sm = tok.id_of("<arch:smuggler>")
    mine = [s for s in seqs if sm in s.ids]

    def ce(src: int) -> float:
        return ft.line_ce(base.model, [TrainSeq(tuple(src if i == sm else i for i in s.ids), s.line_start)
                                       for s in mine], tok.pad_id)

    others = [tok.id_of(f"<arch:{a}>") for a in CATALOG["archetypes"] if a != "merchant"]
    best = min(others, key=ce)
    assert started["<arch:smuggler>"] == {**started["<arch:smuggler>"], "from": tok.controls[best], "how": "nearest"}
    assert torch.equal(wte[sm], wte[best])
    # the two values of the new slot start from two different base context values
    low, high = started["<ctx:tide=low>"]["from"], started["<ctx:tide=high>"]["from"]
    assert low != high and low.startswith("<ctx:") and high.startswith("<ctx:") and "tide" not in low + high


def test_studio_signatures_tie_a_phrase_to_the_one_new_tag_every_line_saying_it_has(tmp_path):
    rows = [
        {"archetype": "smuggler", "state": "idle", "line": "Low water. The flats are bare.", "context": {"tide": "low"}},
        {"archetype": "harbormaster", "state": "idle", "line": "Low water. The flats again, {player}.",
         "context": {"tide": "low"}},
        {"archetype": "smuggler", "state": "idle", "line": "High water, and the cove is deep.",
         "context": {"tide": "high"}},
        {"archetype": "harbormaster", "state": "idle", "line": "High water, so it's deep.", "context": {"tide": "high"}},
        {"archetype": "harbormaster", "state": "rest", "line": "The cove is quiet.", "persona": ["weary"]},
        {"archetype": "smuggler", "state": "rest", "line": "Brandy for me."},
    ]
    lines = ft.read_lines(write_jsonl(tmp_path / "l.jsonl", rows), CATALOG)
    sigs = ft.studio_signatures(lines, ft.phrases(["Keep your voice low.", "The tide is high.", "The flats are bare."]))
    # "low" and "flats" alone: the book says them; "water the" would cross a sentence's end
    assert sigs == {"context:tide=low": ["low water"], "context:tide=high": ["deep", "high water"],
                    "archetype:smuggler": ["brandy"]}  # "cove": two archetypes say it; "quiet": weary or harbormaster?


def test_studio_fallbacks_answer_the_move_the_studio_wrote_for_and_never_another_moves_line():
    from runtime.client.fallback import GENERIC, FallbackBook

    sl = ft.StudioLine
    lines = [sl("smuggler", "alert", "Go. Slowly.", intent="farewell"),
             sl("smuggler", "alert", "Off with you, then.", intent="farewell"),
             sl("smuggler", "alert", "Bah. Be off.", intent="farewell", persona=("gruff",)),
             sl("smuggler", "alert", "Customs boat. Nobody breathes."),
             sl("smuggler", "alert", "No trade till the boat's gone.", intent="trade"),
             sl("smuggler", "alert", "Sell {item}? Not now.", intent="trade"),
             sl("smuggler", "combat", "Evening. Walk on.", intent="greet"),
             sl("smuggler", "alert", "Low water.", intent="greet", context=(("tide", "low"),))]
    cells = ft.studio_fallback_cells(lines)
    assert cells[("smuggler", "alert", "farewell")] == ["Go. Slowly.", "Off with you, then."]  # no trait
    assert cells[("smuggler", "alert", "trade")] == ["No trade till the boat's gone."]  # no slot
    assert cells[("smuggler", "alert")] == []  # clears the pair; no studio line is intent-free
    base = FallbackBook({("smuggler", "alert", "greet"): ["Old line."], ("smuggler", "alert", "any"): ["Old."],
                         ("guard", "alert"): ["Halt!"]})
    book = base.replaced(cells)
    assert book.candidates("smuggler", "alert", "farewell") == ("Go. Slowly.", "Off with you, then.")
    # greet: no context-free greet in alert; combat's greet answers (its near state), not the approach line
    assert book.candidates("smuggler", "alert", "greet") == ("Evening. Walk on.",)
    assert book.candidates("smuggler", "alert", "ask_rumors") == GENERIC  # nothing for the move: generic
    assert "Old line." not in book.candidates("smuggler", "alert", "greet")  # the studio's pair replaced
    assert book.candidates("guard", "alert", "trade") == ("Halt!",)


def test_a_studios_own_words_are_not_banned_for_it():
    sl = ft.StudioLine
    lines = [sl("dockmaster", "working", "Radio the bay. The battery's flat."),
             sl("dockmaster", "idle", "Okay, okay.")]
    assert ft.studio_banned_words(["radio", "battery", "ok", "okay", "phone", "train station"], lines) == \
        ["ok", "phone", "train station"]


def test_new_names_become_control_tokens_and_text_ids_shift_consistently(tmp_path):
    lines = ft.read_lines(write_jsonl(tmp_path / "l.jsonl", LINES), CATALOG)
    catalog, added = ft.extend_catalog(CATALOG, lines)
    assert added == {"archetypes": ["quartermaster", "smuggler"], "persona_traits": ["salty"],
                     "states": ["drunk"], "intents": ["wave"], "context": ["tide=low", "tide=high"]}
    old = Tokenizer.load(Path(ft.__file__).resolve().parent.parent / "assets/flash")
    new, id_map = ft.extend_tokenizer(old, catalog)
    assert new.vocab_size == old.vocab_size + 7
    text = "Every barrel counted twice, {player}, and the tide's out."
    assert [id_map[i] for i in old.encode(text)] == new.encode(text)
    assert new.decode(new.encode(text)) == text
    assert id_map[old.id_of("<arch:sailor>")] == new.id_of("<arch:sailor>")
    prompt, _ = new.encode_prompt("smuggler", ["salty"], "alert", "greet", {"tide": "high"})
    assert new.id_of("<ctx:tide=high>") in prompt and new.id_of("<persona:salty>") in prompt


@pytest.fixture(scope="module")
def tuned(tiny_model_dir, tmp_path_factory, one_torch_thread):
    """A real adapter fine-tune of the tiny model (a few optimiser steps), exported."""
    root = tmp_path_factory.mktemp("finetune")
    lines = write_jsonl(root / "lines.jsonl", LINES)
    report = ft.finetune(tiny_model_dir, lines, root / "out",
                         FinetuneConfig(steps=6, batch_size=8, replay=0.0, seed=0, lr=1e-2), progress=False)
    return report, root / "out"


def test_router_and_backbone_are_bit_identical_after_finetuning(tuned, tiny_model_dir):
    from runtime.serving.batched_engine import load_flash

    report, out = tuned
    assert report["mode"] == "adapters" and report["steps"] == 6
    assert report["frozen_unchanged"] is True and report["frozen_tensors"] > 0
    base, base_tok, _ = load_flash(tiny_model_dir)
    sd = torch.load(out / "model.pt", weights_only=True)["model"]
    base_sd = base.state_dict()
    frozen = [k for k in base_sd if "router" in k or "ln_" in k or "wpe" in k]
    assert any("router" in k for k in frozen)
    for key in frozen:
        assert torch.equal(sd[key], base_sd[key]), key
    # existing token rows of the input table are the base's, moved to their new ids
    new_tok = Tokenizer.load(out)
    _, id_map = ft.extend_tokenizer(base_tok, new_tok.catalog)
    assert torch.equal(sd["transformer.wte.weight"][torch.tensor(id_map)], base_sd["transformer.wte.weight"])
    # ... while the adapters did move the merged attention, experts, head and new rows
    for key in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.ffn.w1", "lm_head.weight"):
        moved = sd[key] if key != "lm_head.weight" else sd[key][torch.tensor(id_map)]
        assert not torch.equal(moved, base_sd[key]), key
    new_rows = torch.tensor(report["new_token_ids"])
    assert not torch.equal(sd["transformer.wte.weight"][new_rows], torch.zeros_like(sd["transformer.wte.weight"][new_rows]))


def test_full_finetune_moves_the_router(tiny_model_dir, tmp_path, one_torch_thread):
    from runtime.serving.batched_engine import load_flash

    lines = write_jsonl(tmp_path / "l.jsonl", LINES)
    report = ft.finetune(tiny_model_dir, lines, tmp_path / "full",
                         FinetuneConfig(mode="full", steps=3, batch_size=8, replay=0.0, lr=1e-2, export=False,
                                        signatures=False),
                         progress=False)
    assert report["frozen_unchanged"] is None and report["trainable_params"] == report["total_params"]
    sd = torch.load(tmp_path / "full" / "model.pt", weights_only=True)["model"]
    base = load_flash(tiny_model_dir)[0].state_dict()
    assert not torch.equal(sd["transformer.h.0.ffn.router.weight"], base["transformer.h.0.ffn.router.weight"])


def test_the_finetune_is_a_model_directory_the_engine_and_eval_load(tuned):
    from runtime import LineGenerator

    report, out = tuned
    assert report["exported"] and (out / "model.int4.onnx").is_file()
    assert report["router_confidence"]["base"] > 0 and 0 <= report["router_confidence"]["same_expert"] <= 1
    from runtime.client.constraints import expanded_document

    cons = expanded_document(json.loads((out / "constraints.json").read_text()))
    assert {"barrel", "lanterns", "douse"} <= set(cons["vocabulary"])
    assert cons["slot_rules"]["archetype"]["quartermaster"] == ["player"]
    assert "low water" in cons["signatures"]["context:tide=low"]
    assert "high water" in cons["signatures"]["context:tide=high"]
    assert report["signatures_added"]["context:tide=low"] == cons["signatures"]["context:tide=low"]
    from runtime.client.fallback import ANY_INTENT, FallbackBook

    fallbacks = FallbackBook.from_json(out / "fallbacks.json")
    assert json.loads((out / "fallbacks.json").read_text())["version"] == 3
    assert ("smuggler", "friendly", ANY_INTENT) not in fallbacks.lines  # a studio line answers one move
    assert fallbacks.lines[("guard", "patrol", "approach")] == ("The harbour chain is up tonight.",)
    assert ("guard", "patrol", ANY_INTENT) not in fallbacks.lines  # the village guard's pair is the studio's now
    gen = LineGenerator.load(out)
    try:
        assert "quartermaster" in gen.catalog()["archetypes"]
        line = gen.generate("quartermaster", "working", intent="trade", context={"tide": "low"}, seed=3)
        assert isinstance(line.text, str) and line.text
    finally:
        gen.close()
    # the engine's constraints refuse a tide=low phrase for tide=high and without tide, as the
    # base book's signatures refuse "full daylight" at night
    from runtime.client.constraints import WordState, read_constraints

    words = read_constraints(out).word_constraint(Tokenizer.load(out))
    line = "Low water, and the hull plates are showing."
    for tide, ok in (("low", True), ("high", False), (None, False)):
        bits = words.banned_bits("quartermaster", context={"tide": tide} if tide else {})
        assert (words.advance(WordState(), line, final=True, banned=bits) is not None) is ok, tide
    assert ft.read_studio_lines(out)[5].like == "merchant"
    assert len(AuthoredBook.from_json(out / "authored.json")) == len({r["line"] for r in LINES})
    assert report["started_from"]["<arch:quartermaster>"]["from"] == "<arch:merchant>"
    section = ft.eval_section(out)
    assert section["lines"] == len(LINES) and section["mode"] == "adapters"
    # measured on the INT4 graph, it matches the fine-tune's own figure (same weights, fp16 table)
    assert section["router_confidence"] == pytest.approx(report["router_confidence"]["finetuned"], abs=0.02)
    assert "router confidence" in ft.format_eval_section(section)
    assert ft.eval_section(None) is None


def test_a_covered_cell_plays_back_the_studios_line_and_the_model_writes_the_gaps(tuned):
    from runtime import LineGenerator

    _, out = tuned
    gen = LineGenerator.load(out)
    try:
        ask = {"intent": "trade", "npc_id": "qm", "player_id": "p1"}
        first = gen.generate("quartermaster", "working", context={"tide": "low"}, seed=1, **ask)
        assert first.finish_reason == "authored" and not first.fallback and first.tokens == ()
        assert first.text == "Every barrel counted twice, every coin once."
        # the cell's only line was just said to this player: the model writes the next one
        again = gen.generate("quartermaster", "working", context={"tide": "low"}, seed=2, **ask)
        assert again.finish_reason != "authored"
        # the line asks for tide=low: a request without the tide is not covered by it
        assert gen.generate("quartermaster", "working", seed=3, intent="trade").finish_reason != "authored"
        batch = gen.generate_batch([{"npc": "quartermaster", "state": "working", "intent": "trade",
                                     "context": {"tide": "low"}, "seed": 4, "player_id": "p2"}])
        assert batch[0].finish_reason == "authored"
        stats = gen.stats()
        assert stats["authored_lines"] == 2 and stats["lines"] == 4
    finally:
        gen.close()
    alone = LineGenerator.load(out, authored=None)
    try:
        line = alone.generate("quartermaster", "working", context={"tide": "low"}, seed=1, intent="trade")
        assert line.finish_reason != "authored"
    finally:
        alone.close()


def test_a_gap_is_answered_by_the_same_move_in_a_near_state_chosen_by_the_model(tuned):
    from runtime import LineGenerator

    _, out = tuned
    gen = LineGenerator.load(out)
    try:
        # smuggler/rest/greet: no line; idle (rest's nearest) has a greet
        near = gen.generate("smuggler", "rest", intent="greet", seed=0, player_id="a")
        assert near.finish_reason == "authored_near" and near.text.startswith("Caf")
        # said to this player already, and no other near greet: the model writes
        assert gen.generate("smuggler", "rest", intent="greet", seed=1, player_id="a").finish_reason \
            not in ("authored", "authored_near")
        # combat's near states (alert, flee) have no greet: the model writes
        assert not gen.generate("smuggler", "combat", intent="greet", seed=0).finish_reason.startswith("authored")
    finally:
        gen.close()


def test_a_games_own_state_and_intent_and_unicode_lines_go_through_the_whole_chain(tuned):
    from runtime import LineGenerator
    from runtime.client.constraints import read_constraints

    report, out = tuned
    assert report["added"]["states"] == ["drunk"] and report["added"]["intents"] == ["wave"]
    catalog = json.loads((out / "catalog.json").read_text())
    assert "drunk" in catalog["states"] and "wave" in catalog["intents"]
    assert read_constraints(out).slot_rules.allowed("smuggler", "drunk", "wave") == frozenset()
    gen = LineGenerator.load(out)
    try:
        line = gen.generate("smuggler", "drunk", intent="wave", seed=1, player_id="a")
        assert line.text == "Another round! Hic." and line.finish_reason == "authored"
        made = gen.generate("smuggler", "drunk", intent="wave", seed=2, player_id="a")  # the model's turn
        assert made.finish_reason != "authored" and made.text
        cafe = gen.generate("smuggler", "idle", intent="greet", seed=1)
        assert cafe.text == "Caf\u00e9? Non. Rhum, s'il vous pla\u00eet." and cafe.finish_reason == "authored"
        tok = Tokenizer.load(out)
        assert tok.decode(tok.encode(cafe.text)) == cafe.text
        with pytest.raises(ValueError, match="dancing"):
            gen.generate("smuggler", "dancing", intent="wave")
    finally:
        gen.close()


def test_export_is_refused_when_routing_fails_unless_forced(tiny_model_dir, tmp_path, monkeypatch, one_torch_thread):
    from plugin.cli import main

    lines = write_jsonl(tmp_path / "l.jsonl", LINES[:5])
    monkeypatch.setattr(ft, "REFUSE_RATIO", 2.0)  # any model is "below" it
    with pytest.raises(RoutingRefused, match="routing has failed"):
        ft.finetune(tiny_model_dir, lines, tmp_path / "a", FinetuneConfig(steps=1, batch_size=4, replay=0.0),
                    progress=False)
    assert (tmp_path / "a" / "model.pt").is_file() and not (tmp_path / "a" / "model.int4.onnx").exists()
    args = ["finetune", "--base", str(tiny_model_dir), "--lines", str(lines), "--steps", "1", "--replay", "0",
            "--no-progress", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "b")]) == 1
    assert main([*args, "--out", str(tmp_path / "c"), "--force"]) == 0
    assert (tmp_path / "c" / "model.int4.onnx").is_file()
    assert json.loads((tmp_path / "c" / "finetune.json").read_text())["exported"] is True


async def test_the_dialogue_service_plays_back_as_the_client_engine_does(tuned):
    from runtime.serving.dialogue_service import DialogueService

    _, out = tuned
    async with DialogueService.load(out, engine="ort", warm_up=False) as svc:
        sid = svc.open_session("quartermaster", state="working", context={"tide": "low"}, npc_id="qm")
        line = await svc.request_line(sid, "trade", seed=1)
        assert (line.text, line.finish_reason, line.fallback) == (
            "Every barrel counted twice, every coin once.", "authored", False)
        again = await svc.request_line(sid, "trade", seed=2)  # said already: the model writes
        assert not again.finish_reason.startswith("authored")
        near = await svc.request_line(svc.open_session("smuggler", state="rest"), "greet", seed=0)
        assert near.finish_reason == "authored_near" and near.text.startswith("Caf")
        pieces = [x async for x in svc.stream_line(svc.open_session("smuggler", state="idle"), "greet", seed=0)]
        assert pieces[0] == pieces[-1].text and pieces[-1].finish_reason == "authored"
