"""The onnxruntime-genai folder (mobile_export.genai) run by the real onnxruntime-genai package.

The shipped model's folder must give the engine's greedy tokens on every (archetype, state,
intent) reference prompt of the catalog and its tokenizer must round-trip the line book; the
writer refuses bad input cleanly and never leaves a half-written folder.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from mobile_export.genai import (
    GENAI_CONFIG,
    GenaiExportError,
    write_genai_files,
    write_genai_folder,
)
from runtime.client.constraints import Constraints, WordConstraint, WordState, read_constraints
from runtime.client.onnx_model import FlashOnnx, decode_rows
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.tokenizer import Tokenizer

og = pytest.importorskip("onnxruntime_genai", reason="the dev extra: pip install 'flashnpc[dev]'")

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "model.int4.onnx").is_file(),
                                reason="the shipped model is not in this checkout")

MAX_TOKENS = 48  # LineGenerator.generate's default


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_genai_folder(None, tmp_path_factory.mktemp("genai") / "flash-genai")


@pytest.fixture(scope="module")
def genai_model(folder: Path) -> og.Model:
    return og.Model(str(folder))


@pytest.fixture(scope="module")
def engine() -> FlashOnnx:
    return FlashOnnx.load()


def genai_greedy(model: og.Model, prompt: list[int], max_tokens: int, eos_id: int) -> list[int]:
    """One row (no padding), greedy, the new ids without the final eos."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + max_tokens)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    new = [int(t) for t in gen.get_sequence(0)[len(prompt):]]
    return new[:-1] if new and new[-1] == eos_id else new


def test_greedy_tokens_equal_the_engine_on_every_reference_prompt(genai_model, engine):
    tok = engine.tokenizer
    cat = tok.catalog
    cases = list(itertools.product(cat["archetypes"], cat["states"], cat["intents"]))
    assert len(cases) == 560
    mismatches = []
    for arch, state, intent in cases:
        prompt, _ = tok.encode_prompt(arch, (), state, intent, {})
        want = engine.generate_ids(prompt, max_tokens=MAX_TOKENS, temperature=0)
        got = genai_greedy(genai_model, prompt, MAX_TOKENS, tok.eos_id)
        if got != want:
            mismatches.append(f"{arch}/{state}/{intent}: {tok.decode(want)!r} != {tok.decode(got)!r}")
    assert not mismatches, f"{len(mismatches)}/{len(cases)} differ: " + "; ".join(mismatches[:5])


def test_a_right_padded_batch_gives_every_rows_tokens(genai_model, engine):
    """genai reads padding at the end of a row only: pad on the right (docs/mobile.md)."""
    tok = engine.tokenizer
    cat = tok.catalog
    slots = list(cat["context"])
    prompts = [tok.encode_prompt(arch, cat["persona_traits"][: i % 3], cat["states"][i % 8],
                                 cat["intents"][i % 7], {s: cat["context"][s][0] for s in slots[: i % 5]})[0]
               for i, arch in enumerate(cat["archetypes"])]
    width = max(len(p) for p in prompts)
    assert width > min(len(p) for p in prompts)
    params = og.GeneratorParams(genai_model)
    params.set_search_options(do_sample=False, max_length=width + MAX_TOKENS, batch_size=len(prompts))
    gen = og.Generator(genai_model, params)
    gen.append_tokens(np.asarray([p + [tok.pad_id] * (width - len(p)) for p in prompts], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    for row, prompt in enumerate(prompts):
        new = [int(t) for t in gen.get_sequence(row)[width:]]
        new = new[: new.index(tok.eos_id)] if tok.eos_id in new else new
        while new and new[-1] == tok.pad_id:  # a row done before the others is padded
            new.pop()
        assert new == engine.generate_ids(prompt, max_tokens=MAX_TOKENS, temperature=0), row


@pytest.fixture(scope="module")
def shipped_constraints(folder: Path) -> tuple[Constraints, WordConstraint]:
    """The folder's own constraints.json and project tokenizer, as docs/mobile.md reads them."""
    cons = read_constraints(folder)
    return cons, cons.word_constraint(Tokenizer.load(folder / "flashnpc_tokenizer.json"))


class ShippedMasks:
    """The shipped constraints.json for one request, as the engine applies them per step: the
    word constraint (banned words, vocabulary trie, other tags' signatures) and the slots the
    line may not hold (not allowed for the request, or no value from the game)."""

    def __init__(self, shipped: tuple[Constraints, WordConstraint], tok: Tokenizer, arch: str,
                 state: str, intent: str, slot_values: set[str]) -> None:
        cons, self.words = shipped
        self.banned = self.words.banned_bits(arch, (), {})
        allowed = cons.slot_rules.allowed(arch, state, intent) & slot_values
        self.slot_block = [tok.id_of(f"<slot:{s}>") for s in tok.catalog["slots"] if s not in allowed]
        self.state = WordState()
        self.n = 0

    def mask(self, row: np.ndarray) -> bool:
        """Block in place what the next token may not be; False when nothing is left."""
        self.words.mask_logits(row, self.state, last=self.n + 1 >= MAX_TOKENS, banned=self.banned)
        row[self.slot_block] = -np.inf
        return bool(np.isfinite(row).any())

    def advance(self, token: int) -> None:
        self.state = self.words.step(self.state, token)
        self.n += 1


def engine_masked_greedy(engine: FlashOnnx, prompt: list[int], masks: ShippedMasks) -> list[int]:
    """The engine's decode loop (decode_rows) with the masks applied before each arg-max."""
    eos, out = engine.tokenizer.eos_id, []

    def pick(_b: int, logits: np.ndarray) -> tuple[int | None, bool]:
        row = logits.astype(np.float32, copy=True)
        if not masks.mask(row):
            return None, False
        nxt = int(np.argmax(row))
        if nxt == eos:
            return None, False
        masks.advance(nxt)
        out.append(nxt)
        return nxt, len(out) < MAX_TOKENS

    logits, past, _ = engine.step(np.asarray([prompt], dtype=np.int64), None)
    for _ in decode_rows(engine, logits, past, 1, pick):
        pass
    return out


def genai_masked_greedy(model: og.Model, prompt: list[int], masks: ShippedMasks, eos: int,
                        route: str) -> list[int]:
    """The docs' two per-step patterns: ``set_logits`` then genai's own (greedy) pick, or, as
    the C#/Java/Objective-C wrappers allow, read ``logits``, pick, and ``append_tokens``."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + MAX_TOKENS)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], dtype=np.int32))
    out: list[int] = []
    while len(out) < MAX_TOKENS:
        if route == "set_logits":
            logits = gen.get_logits().copy()  # [1, 1, vocab]: the last position
            if not masks.mask(logits[0, -1]):
                break
            gen.set_logits(logits)
            gen.generate_next_token()
            nxt = int(gen.get_next_tokens()[0])
        else:
            row = gen.get_output("logits")[0, -1].copy()  # [1, T, vocab] of the last run
            if not masks.mask(row):
                break
            nxt = int(np.argmax(row))
        if nxt == eos:
            break
        masks.advance(nxt)
        out.append(nxt)
        if route != "set_logits" and len(out) < MAX_TOKENS:
            gen.append_tokens(np.asarray([[nxt]], dtype=np.int32))
    return out


@pytest.mark.parametrize("route", ["set_logits", "append_tokens"])
def test_shipped_constraints_applied_per_step_give_the_engines_masked_tokens(genai_model, engine, route,
                                                                           shipped_constraints):
    tok = engine.tokenizer
    cases = list(itertools.product(tok.catalog["archetypes"], tok.catalog["states"]))
    bad, blocked = [], 0
    for arch, state in cases:
        prompt, _ = tok.encode_prompt(arch, (), state, "greet", {})
        masks = [ShippedMasks(shipped_constraints, tok, arch, state, "greet", {"player"}) for _ in "ab"]
        want = engine_masked_greedy(engine, prompt, masks[0])
        got = genai_masked_greedy(genai_model, prompt, masks[1], tok.eos_id, route)
        blocked += want != genai_greedy(genai_model, prompt, MAX_TOKENS, tok.eos_id)
        if got != want:
            bad.append(f"{arch}/{state}: {tok.decode(want)!r} != {tok.decode(got)!r}")
    assert not bad, f"{len(bad)}/{len(cases)} differ: " + "; ".join(bad[:5])
    assert blocked > 0  # the masks changed some lines, so the comparison saw them act


def test_a_prompt_written_as_control_names_encodes_to_the_prompt_ids(genai_model, engine):
    tok, gtok = engine.tokenizer, og.Tokenizer(genai_model)
    ids, _ = tok.encode_prompt("sailor", ["gruff", "brave"], "alert", "greet",
                               {"time_of_day": "night", "weather": "fog"})
    assert [int(i) for i in gtok.encode("".join(tok.controls[i] for i in ids))] == ids
    assert gtok.decode(np.asarray([*ids, *tok.encode("Ahoy, {player}!"), tok.eos_id],
                                  dtype=np.int32)) == "Ahoy, {player}!"
    assert gtok.eos_token_ids == [tok.eos_id] and gtok.pad_token_id == tok.pad_id


def test_tokenizer_round_trips_every_line_of_the_line_book(genai_model, engine):
    from runtime.factory.linebook import load_line_book

    tok: Tokenizer = engine.tokenizer
    gtok = og.Tokenizer(genai_model)
    book = load_line_book()
    texts = sorted({e.text for e in book.examples()}
                   | {line for lines in book.fallback_lines().values() for line in lines})
    assert len(texts) > 10_000 and any("{player}" in t for t in texts)
    bad = []
    for text in texts:
        want = tok.encode(text)
        got = [int(i) for i in gtok.encode(text)]
        back = gtok.decode(np.asarray(want, dtype=np.int32))
        if got != want or back != text:
            bad.append(f"{text!r}: ids {got == want}, text {back!r}")
    assert not bad, f"{len(bad)}/{len(texts)} lines: " + "; ".join(bad[:5])


@pytest.mark.parametrize("text", [
    "Who goes there?  I'm here!", "café 42, naïve — ünïcode 🐉", "  tabs\t\tand\n\nnewlines  ",
    "{players} {name} {{player}} {item}{location}", "'sea 'll'd", "",
])
def test_tokenizer_matches_on_text_the_book_lacks(genai_model, engine, text):
    gtok = og.Tokenizer(genai_model)
    ids = engine.tokenizer.encode(text)
    assert [int(i) for i in gtok.encode(text)] == ids
    assert gtok.decode(np.asarray(ids, dtype=np.int32)) == text


def test_an_ort_format_graph_gives_the_same_tokens(engine, tmp_path):
    from mobile_export.bundle import _convert
    from mobile_export.toolchain import DEFAULT_ONNXRUNTIME

    _convert(DEFAULT_MODEL_DIR / "model.int4.onnx", tmp_path / "work", tmp_path, "arm", DEFAULT_ONNXRUNTIME)
    out = write_genai_folder(None, tmp_path / "genai", model_file=tmp_path / "model.ort")
    dec = json.loads((out / GENAI_CONFIG).read_text())["model"]["decoder"]
    assert dec["filename"] == "model.ort"
    assert dec["session_options"]["session.load_model_format"] == "ORT"
    model, tok = og.Model(str(out)), engine.tokenizer
    for arch, state in itertools.product(tok.catalog["archetypes"], tok.catalog["states"]):
        prompt, _ = tok.encode_prompt(arch, (), state, "approach", {})
        assert genai_greedy(model, prompt, MAX_TOKENS, tok.eos_id) == engine.generate_ids(
            prompt, max_tokens=MAX_TOKENS, temperature=0), f"{arch}/{state}"


def test_folder_files_and_config_follow_the_graph_and_the_engine(folder, engine):
    from mobile_export.bundle import _engine_sampling_defaults

    assert sorted(p.name for p in folder.iterdir()) == [
        "catalog.json", "constraints.json", "fallbacks.json", "flashnpc_tokenizer.json", GENAI_CONFIG,
        "model.int4.onnx", "tokenizer.json", "tokenizer_config.json"]
    assert Tokenizer.load(folder / "flashnpc_tokenizer.json").to_json() == engine.tokenizer.to_json()
    assert (folder / "model.int4.onnx").read_bytes() == (DEFAULT_MODEL_DIR / "model.int4.onnx").read_bytes()
    cfg = json.loads((folder / GENAI_CONFIG).read_text())
    model, search = cfg["model"], cfg["search"]
    dec = model["decoder"]
    assert model["type"] == "decoder" and dec["filename"] == "model.int4.onnx"
    graph_inputs = {i.name for i in engine.session.get_inputs()}
    graph_outputs = {o.name for o in engine.session.get_outputs()}
    for i in range(engine.n_layer):
        assert dec["inputs"]["past_key_names"] % i in graph_inputs
        assert dec["inputs"]["past_value_names"] % i in graph_inputs
        assert dec["outputs"]["present_key_names"] % i in graph_outputs
        assert dec["outputs"]["present_value_names"] % i in graph_outputs
    assert (dec["num_hidden_layers"], dec["num_attention_heads"], dec["head_size"]) == (
        engine.n_layer, engine.n_head, engine.head_dim)
    assert model["context_length"] == engine.block_size == search["max_length"]
    tok = engine.tokenizer
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (
        tok.bos_id, tok.eos_id, tok.pad_id)
    assert search["past_present_share_buffer"] is False
    sampling = _engine_sampling_defaults()
    assert search["do_sample"] is True
    assert (search["temperature"], search["top_p"], search["top_k"]) == (
        sampling["temperature"], sampling["top_p"], sampling["top_k"])


def test_existing_destination_is_refused_unless_forced(folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(GenaiExportError, match="already exists; pass --force"):
        write_genai_folder(None, out)
    assert (out / "keep.txt").is_file()
    assert write_genai_folder(None, out, force=True) == out
    assert not (out / "keep.txt").exists() and (out / GENAI_CONFIG).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left behind


def test_bad_model_directory_is_one_line_error_and_leaves_nothing(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (src / name).write_bytes((DEFAULT_MODEL_DIR / name).read_bytes())
    with pytest.raises(GenaiExportError, match=r"model\.int4\.onnx: missing"):
        write_genai_folder(src, tmp_path / "out")
    (src / "model.int4.onnx").write_bytes(b"not a graph")
    with pytest.raises(GenaiExportError, match="onnxruntime cannot open it") as err:
        write_genai_folder(src, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_write_genai_files_refuses_to_overwrite_in_a_callers_folder(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(GenaiExportError, match=r"already holds tokenizer\.json"):
        write_genai_files(None, tmp_path)


def test_a_genai_bundle_holds_one_model_that_both_routes_run(engine, tmp_path):
    """`export mobile --genai`: genai/model.ort is the bundle's model and the genai folder's."""
    from mobile_export.bundle import export_bundle
    from runtime.client.generator import LineGenerator

    done = export_bundle(DEFAULT_MODEL_DIR, tmp_path / "b", zip_output=True, genai=True)
    assert done.manifest["model"]["file"] == "genai/model.ort"
    paths = [e["path"] for e in done.manifest["files"]]
    assert "model.ort" not in paths and {"genai/genai_config.json", "genai/tokenizer.json"} <= set(paths)
    assert done.zip_bytes is not None and done.zip_bytes <= 8_000_000
    gen = LineGenerator.load(done.path, warmup=False)  # the runtime's route, through the verifying loader
    model = og.Model(str(gen.model.bundle.root / "genai"))  # and genai's, on the same extracted file
    tok = engine.tokenizer
    for arch, state in (("guard", "alert"), ("innkeeper", "rest"), ("thief", "flee")):
        prompt, _ = tok.encode_prompt(arch, (), state, "greet", {})
        want = engine.generate_ids(prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert gen.model.generate_ids(prompt, max_tokens=MAX_TOKENS, temperature=0) == want
        assert genai_greedy(model, prompt, MAX_TOKENS, tok.eos_id) == want
    gen.close()
