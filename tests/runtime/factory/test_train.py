import itertools
import json
from collections import Counter

import pytest
import torch

from plugin.cli import main as flashnpc
from runtime.factory.linebook import load_line_book
from runtime.factory.model import FlashConfig
from runtime.factory.train import (
    TrainConfig,
    batch_indices,
    collate,
    encode_example,
    learning_rate,
    load_checkpoint,
    train,
)
from runtime.tokenizer import Tokenizer, train_tokenizer

TINY = FlashConfig(vocab_size=384, block_size=96, n_layer=2, n_head=2, n_embd=32, n_expert=8,
                   expert_hidden=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def book_data():
    book = load_line_book()
    split = book.split()
    train_ex, val_ex = split.train[:1500], split.val[:64]
    tokenizer = train_tokenizer([ex.text for ex in train_ex], book.catalog(), vocab_size=384)
    return train_ex, val_ex, tokenizer, book.catalog()


def run_tiny(out, book_data, tcfg: TrainConfig, **kw):
    train_ex, val_ex, tokenizer, catalog = book_data
    return train(out, train_examples=train_ex, val_examples=val_ex, tokenizer=tokenizer,
                 catalog=catalog, model_config=TINY, train_config=tcfg, progress=False, **kw)


def test_tiny_model_loss_falls_on_real_line_book_examples(tmp_path, book_data):
    tcfg = TrainConfig(steps=40, batch_size=16, lr=4e-3, min_lr=4e-4, warmup_steps=5,
                       eval_interval=40, eval_examples=64, checkpoint_interval=100, log_interval=1,
                       qat_fraction=0.25)
    log = run_tiny(tmp_path, book_data, tcfg)
    ce = [r["ce"] for r in log["records"]]
    assert len(ce) == 40
    assert sum(ce[-5:]) / 5 < sum(ce[:5]) / 5 - 1.0
    assert [r["qat"] for r in log["records"]] == [False] * 30 + [True] * 10
    assert log["final"]["val_ce_int4"] < ce[0]
    for name in ("model.pt", "config.json", "tokenizer.json", "catalog.json", "train_log.json"):
        assert (tmp_path / name).is_file(), name
    model, ckpt = load_checkpoint(tmp_path)
    assert ckpt["step"] == 40 and ckpt["qat_start_step"] == 30
    assert json.loads((tmp_path / "config.json").read_text()) == ckpt["config"]
    assert model.config.vocab_size == book_data[2].vocab_size


class Crash(Exception):
    pass


def test_resume_continues_at_the_saved_step_with_the_same_data_order(tmp_path, book_data):
    tcfg = TrainConfig(steps=8, batch_size=8, warmup_steps=2, eval_interval=100, eval_examples=16,
                       checkpoint_interval=4, log_interval=1, qat_fraction=0.5)
    straight = run_tiny(tmp_path / "a", book_data, tcfg)

    def crash_after_step_5(step, record):
        if step == 5:
            raise Crash

    with pytest.raises(Crash):
        run_tiny(tmp_path / "b", book_data, tcfg, on_step=crash_after_step_5)
    assert torch.load(tmp_path / "b" / "model.pt", weights_only=False)["step"] == 4
    resumed_steps: list[int] = []
    resumed = run_tiny(tmp_path / "b", book_data, tcfg, resume=True,
                       on_step=lambda step, record: resumed_steps.append(step))

    assert resumed_steps == [4, 5, 6, 7]
    assert resumed["resumed_at"] == [4]
    assert [r["step"] for r in resumed["records"]] == list(range(8))
    for a, b in zip(straight["records"], resumed["records"], strict=True):
        assert a["ce"] == pytest.approx(b["ce"], rel=1e-5), a["step"]
    a_model, _ = load_checkpoint(tmp_path / "a")
    b_model, _ = load_checkpoint(tmp_path / "b")
    for (name, pa), pb in zip(a_model.state_dict().items(), b_model.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=name)


def test_interrupt_saves_a_checkpoint_at_the_last_completed_step(tmp_path, book_data):
    tcfg = TrainConfig(steps=6, batch_size=4, warmup_steps=1, eval_interval=100, eval_examples=8,
                       checkpoint_interval=100)

    def interrupt_after_step_2(step, record):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_tiny(tmp_path, book_data, tcfg, on_step=interrupt_after_step_2)
    assert torch.load(tmp_path / "model.pt", weights_only=False)["step"] == 3


def test_every_example_is_seen_once_per_epoch_in_a_seeded_order():
    n, bs = 100, 10
    epoch = [i for step in range(10) for i in batch_indices(n, bs, step, seed=3)]
    assert sorted(epoch) == list(range(n))
    assert batch_indices(n, bs, 4, seed=3) == batch_indices(n, bs, 4, seed=3)
    assert batch_indices(n, bs, 4, seed=3) != batch_indices(n, bs, 4, seed=4)
    assert epoch != [i for step in range(10, 20) for i in batch_indices(n, bs, step, seed=3)]


def test_length_grouped_batches_cover_the_pool_and_hold_similar_lengths():
    n, bs, group = 96, 8, 4
    lengths = [(i * 37) % 50 + 5 for i in range(n)]
    batches = [batch_indices(n, bs, step, 0, lengths, group=group) for step in range(12)]
    assert Counter(i for b in batches for i in b) == Counter(range(n))
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert max(spread) < 25  # random batches of 8 from 5..54 nearly always span more


def test_collate_shifts_targets_and_masks_only_the_line_and_eos(book_data):
    _, _, tokenizer, _ = book_data
    ex = book_data[0][0]
    seq = encode_example(tokenizer, ex)
    prompt, _ = tokenizer.encode_prompt(ex.archetype, ex.persona, ex.state, ex.intent, ex.context)
    line = tokenizer.encode(ex.text)
    assert list(seq.ids) == [*prompt, *line, tokenizer.eos_id] and seq.line_start == len(prompt)
    short = encode_example(tokenizer, book_data[0][1])
    x, y, mask = collate([seq, short], tokenizer.pad_id)
    assert x.shape == (2, max(len(seq.ids), len(short.ids)) - 1)
    assert x[0, : len(seq.ids) - 1].tolist() == list(seq.ids[:-1])
    assert y[0, : len(seq.ids) - 1].tolist() == list(seq.ids[1:])
    assert y[0][mask[0]].tolist() == [*line, tokenizer.eos_id]
    assert int(mask[1].sum()) == len(short.ids) - short.line_start
    pads = x[1, len(short.ids) - 1:]
    assert (pads == tokenizer.pad_id).all() and not mask[1, len(short.ids) - 1:].any()


def test_learning_rate_warms_up_then_decays_to_min_lr():
    cfg = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup_steps=10)
    lrs = [learning_rate(s, cfg) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[100] == pytest.approx(1e-4)


def test_cli_trains_tiny_model_and_resume_reuses_the_tokenizer(tmp_path, capsys, monkeypatch):
    import runtime.cli

    out = tmp_path / "run"
    settings = '{"eval_examples": 16, "checkpoint_interval": 2, "batch_size": 4}'
    shown: list[tuple[str, bool]] = []
    ticking = runtime.cli.ticking

    def recorded(desc: str, *, enabled: bool = True, **kw):
        shown.append((desc, enabled))
        return ticking(desc, enabled=enabled, **kw)

    monkeypatch.setattr(runtime.cli, "ticking", recorded)
    assert flashnpc(["train", "--out", str(out), "--tiny", "--steps", "3", "--threads", "1",
                     "--config", settings]) == 0
    printed = capsys.readouterr()
    assert "tokenizer: trained" in printed.out
    # progress from the first second: a bar while torch loads and the book is read, then the tokenizer's
    assert shown == [("train: loading torch and the line book", True), ("train: tokenizer", True)]
    tokenizer_text = (out / "tokenizer.json").read_text()
    assert json.loads((out / "config.json").read_text())["n_embd"] == 64
    assert flashnpc(["train", "--out", str(out), "--tiny", "--steps", "4", "--quiet", "--threads", "1", "--resume",
                     "--config", settings]) == 0
    printed = capsys.readouterr().out
    assert "tokenizer: loaded" in printed and "done: step 4" in printed
    assert (out / "tokenizer.json").read_text() == tokenizer_text
    assert Tokenizer.load(out / "tokenizer.json").vocab_size == 512
    assert json.loads((out / "train_log.json").read_text())["resumed_at"] == [3]


def test_cli_rejects_unknown_setting_naming_it(tmp_path, capsys):
    assert flashnpc(["train", "--out", str(tmp_path), "--config", '{"n_experts": 8}']) == 2
    assert "unknown setting 'n_experts'" in capsys.readouterr().err


def test_warm_start_begins_from_the_exported_models_own_weights(tmp_path, book_data):
    from runtime.factory.train import initial_model
    from runtime.paths import DEFAULT_MODEL_DIR

    model, tokenizer = initial_model(DEFAULT_MODEL_DIR)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied again, so it saves as one table
    start = {k: v.clone() for k, v in model.state_dict().items()}
    train_ex, val_ex, _, catalog = book_data
    tcfg = TrainConfig(steps=1, batch_size=2, lr=0.0, min_lr=0.0, warmup_steps=0, weight_decay=0.0,
                       eval_interval=1, eval_examples=8, checkpoint_interval=10, qat_fraction=0.0)
    log = train(tmp_path, train_examples=train_ex[:8], val_examples=val_ex[:8], tokenizer=tokenizer,
                catalog=catalog, train_config=tcfg, init_from=model, progress=False)
    assert log["init_from"] == str(DEFAULT_MODEL_DIR)
    saved, ckpt = load_checkpoint(tmp_path)
    assert ckpt["config"] == json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()) | {"qat": False}
    for name, value in saved.state_dict().items():
        assert torch.equal(value, start[name]), name
    # the shipped model starts far below a random init's loss on the book (ln 2048 = 7.6)
    assert log["final"]["val_ce_int4"] < 3.0


def test_cli_warm_start_refuses_a_book_with_tags_the_model_never_saw(tmp_path, capsys):
    from runtime.paths import DEFAULT_MODEL_DIR
    from tests.runtime.factory.test_linebook_format import MINI

    # a small book (every other name in it is one the shipped model knows) with a trait it does
    # not: the CLI expands the book before it checks the tags, and the default book takes tens of
    # seconds to expand
    assert MINI.count("persona_traits:\n") == 1
    book = tmp_path / "book.yaml"
    book.write_text(MINI.replace("persona_traits:\n", "persona_traits:\n  stern:\n"
                                 "    calm: [\"Mind yourself.\"]\n    urgent: [\"Mind yourself!\"]\n"))
    code = flashnpc(["train", "--out", str(tmp_path / "run"), "--init-from", str(DEFAULT_MODEL_DIR),
                     "--line-book", str(book), "--steps", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "its tokenizer has no <persona:stern> (" in err and "flashnpc finetune" in err  # stern alone

