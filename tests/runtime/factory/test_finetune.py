"""flashnpc finetune: the studio's file, new control tokens, frozen router and backbone, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

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
] * 3


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_rows_are_named_by_file_line_and_field(tmp_path):
    csv_file = tmp_path / "lines.csv"
    csv_file.write_text(
        "archetype,state,line,persona,intent,context\n"
        "smuggler,friendly,Fair enough.,sly,,\n"           # fine
        "smuggler,dancing,Fair enough.,,,\n"               # 3: unknown state
        ",idle,Nobody.,,,\n"                                # 4: missing archetype
        "smuggler,idle,Where's {captain}?,,,\n"            # 5: unknown slot
        "smuggler,idle,Fine.,,bargain,\n"                   # 6: unknown intent
        "smuggler,idle,Fine.,,,tide\n"                      # 7: context not slot=value
        "smuggler,idle,Call me on the phone.,,,\n"          # 8: banned word
        "Smuggler,idle,Fine.,,,\n"                          # 9: not a name
        "smuggler,idle,Caf\u00e9 au lait.,,,\n"             # 10: non-ASCII
    )
    with pytest.raises(FinetuneError) as info:
        ft.read_lines(csv_file, CATALOG, banned_words=["phone"])
    problems = info.value.problems
    where = [p.split(": ", 2)[0] for p in problems]
    assert where == [f"{csv_file}:{n}" for n in range(3, 11)]
    for n, field in zip(range(3, 11), ["state", "archetype", "line", "intent", "context", "line", "archetype", "line"],
                        strict=True):
        assert f"{csv_file}:{n}: {field}" in problems[n - 3], problems[n - 3]
    assert "banned word 'phone'" in problems[5]

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


def test_new_names_become_control_tokens_and_text_ids_shift_consistently(tmp_path):
    lines = ft.read_lines(write_jsonl(tmp_path / "l.jsonl", LINES), CATALOG)
    catalog, added = ft.extend_catalog(CATALOG, lines)
    assert added == {"archetypes": ["quartermaster", "smuggler"], "persona_traits": ["salty"],
                     "context": ["tide=low", "tide=high"]}
    old = Tokenizer.load(Path(ft.__file__).resolve().parent.parent / "assets/flash")
    new, id_map = ft.extend_tokenizer(old, catalog)
    assert new.vocab_size == old.vocab_size + 5
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
                         FinetuneConfig(mode="full", steps=3, batch_size=8, replay=0.0, lr=1e-2, export=False),
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
    cons = json.loads((out / "constraints.json").read_text())
    assert {"barrel", "lanterns", "douse"} <= set(cons["vocabulary"])
    assert cons["slot_rules"]["archetype"]["quartermaster"] == ["player"]
    fallbacks = json.loads((out / "fallbacks.json").read_text())
    assert fallbacks["smuggler"]["friendly"] == ["Keep your voice down and your purse open."]
    gen = LineGenerator.load(out)
    try:
        assert "quartermaster" in gen.catalog()["archetypes"]
        line = gen.generate("quartermaster", "working", intent="trade", context={"tide": "low"}, seed=3)
        assert isinstance(line.text, str) and line.text
    finally:
        gen.close()
    section = ft.eval_section(out)
    assert section["lines"] == len(LINES) and section["mode"] == "adapters"
    # measured on the INT4 graph, it matches the fine-tune's own figure (same weights, fp16 table)
    assert section["router_confidence"] == pytest.approx(report["router_confidence"]["finetuned"], abs=0.02)
    assert "router confidence" in ft.format_eval_section(section)
    assert ft.eval_section(None) is None


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
