"""An onnxruntime-genai model folder for the Flash model: ``flashnpc export genai``.

:func:`write_genai_folder` turns an exported model directory (``flashnpc export`` output;
default the shipped ``runtime/assets/flash/``) into a folder that onnxruntime-genai's
``Model`` / ``Tokenizer`` open as they are (Python ``onnxruntime_genai``, C#
``Microsoft.ML.OnnxRuntimeGenAI``, its Java and Objective-C bindings):

    genai_config.json       decoder type, the graph's input/output names (``past_key_%d`` ...),
                            head counts, sizes, layers and context length from config.json,
                            bos/eos/pad ids, ``past_present_share_buffer: false`` (the graph
                            concatenates: present_* is past + new long), search defaults = the
                            Python engine's sampling (the bundle manifest's ``sampling``)
    tokenizer.json          a Hugging Face tokenizer equivalent to the project's byte-level BPE
                            (:func:`hf_tokenizer_json`): same ids for every line, same text back
    tokenizer_config.json   its class and special tokens; no bos/eos added on encode
    model.int4.onnx         the INT4 graph, unchanged (or an ORT-format file, ``model_file``)
    flashnpc_tokenizer.json the project's own tokenizer.json (docs/tokenizer.md), for the token
                            bytes per-step masks need (runtime.client.constraints reads it)
    catalog.json constraints.json fallbacks.json
                            the project's side files, copied when the model directory has them:
                            prompt vocabulary, per-step masks, authored lines (docs/mobile.md)

Everything is written into a temporary sibling of the destination and renamed into place at
the end, so a failure leaves nothing half-written; an existing destination is refused unless
``force``. :func:`write_genai_files` is the same content written into a directory the caller
owns (for a ``genai/`` subfolder of a bundle being staged).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobile_export.bundle import (
    SOURCE_MODEL,
    BundleExportError,
    _engine_sampling_defaults,
    _move_into_place,
    _write_json,
)
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.tokenizer import PRETOKENIZE_PATTERN, Tokenizer, bytes_to_units

if TYPE_CHECKING:
    import onnxruntime as ort

GENAI_CONFIG = "genai_config.json"
HF_TOKENIZER = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
PROJECT_TOKENIZER = "flashnpc_tokenizer.json"  # the project's tokenizer.json, renamed beside the HF one
SIDE_FILES = ("catalog.json", "constraints.json", "fallbacks.json")
BUNDLE_SUBDIR = "genai"  # the folder's name inside a mobile bundle
MODEL_TYPE = "decoder"   # onnxruntime-genai's generic decoder-only model
PAST_NAMES = ("past_key_%d", "past_value_%d")
PRESENT_NAMES = ("present_key_%d", "present_value_%d")
STEP_INPUTS = ("input_ids", "position_ids", "attention_mask")


class GenaiExportError(BundleExportError):
    """A genai folder that cannot be written: the message says which input or option is wrong."""


def write_genai_folder(model_dir: str | Path | None, out: str | Path, *, force: bool = False,
                       model_file: str | Path | None = None) -> Path:
    """Write the onnxruntime-genai folder of ``model_dir`` (None: the shipped model) to ``out``.

    The model is ``model_dir/model.int4.onnx`` unless ``model_file`` names another graph of the
    same model (an ORT-format ``.ort`` file, e.g. a bundle's ``model.ort``, is opened by genai
    with optimisations off). ``out`` must not exist unless ``force`` (it is then replaced only
    once the new folder is complete). Returns ``out``; raises :class:`GenaiExportError`.
    """
    dest = Path(out)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise GenaiExportError(f"{dest} already exists; pass --force (force=True) to replace it")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:
        raise GenaiExportError(f"{dest}: cannot write there ({exc.strerror or exc})") from exc
    try:
        stage = staging / "genai"
        write_genai_files(model_dir, stage, model_file=model_file)
        try:
            _move_into_place(stage, dest, staging)
        except OSError as exc:
            raise GenaiExportError(f"{dest}: cannot put the folder in place ({exc.strerror or exc})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def write_genai_files(model_dir: str | Path | None, dest: str | Path, *,
                      model_file: str | Path | None = None, side_files: bool = True) -> list[str]:
    """Write the folder's files into ``dest`` (created if missing; must hold none of them).

    ``side_files=False`` leaves out the project's tokenizer, catalog, constraints and fallbacks
    (a bundle holds them at its root already).

    Not atomic by itself: for a caller that stages its own output (the bundle writer).
    Returns the names written, sorted. Raises :class:`GenaiExportError`.
    """
    src = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    model = Path(model_file) if model_file is not None else src / SOURCE_MODEL
    for path in (model, src / "config.json", src / "tokenizer.json"):
        if not path.is_file():
            raise GenaiExportError(f"{path}: missing (a model directory from `flashnpc export` is needed)")
    try:
        config = json.loads((src / "config.json").read_text(encoding="utf-8"))
        tok = Tokenizer.load(src / "tokenizer.json")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GenaiExportError(f"{src}: unreadable config.json or tokenizer.json ({exc})") from exc
    ort_format = model.suffix == ".ort"
    session = _open_session(model, ort_format)
    genai = genai_config(config, tok, session, model_file=model.name, ort_format=ort_format)

    out = Path(dest)
    extras = [PROJECT_TOKENIZER, *(n for n in SIDE_FILES if (src / n).is_file())] if side_files else []
    names = [GENAI_CONFIG, HF_TOKENIZER, HF_TOKENIZER_CONFIG, model.name, *extras]
    if clash := sorted(n for n in names if (out / n).exists()):
        raise GenaiExportError(f"{out}: already holds {', '.join(clash)}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / GENAI_CONFIG, genai)
        (out / HF_TOKENIZER).write_text(json.dumps(hf_tokenizer_json(tok), ensure_ascii=False) + "\n",
                                        encoding="utf-8")
        _write_json(out / HF_TOKENIZER_CONFIG, hf_tokenizer_config(tok, int(config["block_size"])))
        shutil.copyfile(model, out / model.name)
        for name in extras:
            shutil.copyfile(src / ("tokenizer.json" if name == PROJECT_TOKENIZER else name), out / name)
    except OSError as exc:
        raise GenaiExportError(f"{out}: cannot write the folder ({exc.strerror or exc})") from exc
    return sorted(names)


def _open_session(model: Path, ort_format: bool) -> ort.InferenceSession:
    """The graph in onnxruntime with the runtime's client options, to read its real interface."""
    import onnxruntime as ort

    from runtime.client.onnx_model import ort_session_options, session_options

    options = ort_session_options(1) if ort_format else session_options(1)
    try:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GenaiExportError(f"{model}: onnxruntime cannot open it ({reason})") from exc


def genai_config(config: Mapping[str, Any], tokenizer: Tokenizer, session: ort.InferenceSession, *,
                 model_file: str = SOURCE_MODEL, ort_format: bool = False) -> dict[str, Any]:
    """The ``genai_config.json`` for the Flash graph open in ``session``.

    Sizes come from ``config`` (config.json) and are checked against the graph: every input
    must be one genai feeds (``input_ids``, ``position_ids``, ``attention_mask``,
    ``past_key_i`` / ``past_value_i``), the outputs must include ``logits`` and every
    ``present_key_i`` / ``present_value_i`` (others, such as ``router_probs``, are ignored by
    genai), and the key/value and logits shapes must agree with the head count, head size and
    vocabulary. Search defaults are the Python engine's sampling (``do_sample`` unless its
    temperature is 0); ``max_length`` counts prompt and line together, so it is the context
    length here and a game sets ``prompt length + max_tokens`` per request.
    """
    try:
        n_layer, n_head, n_embd = int(config["n_layer"]), int(config["n_head"]), int(config["n_embd"])
        context = int(config["block_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GenaiExportError(f"config.json: missing or bad {exc}") from exc
    head_dim = n_embd // n_head
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    past = [p % i for i in range(n_layer) for p in PAST_NAMES]
    present = [p % i for i in range(n_layer) for p in PRESENT_NAMES]
    if extra := sorted(set(inputs) - {*STEP_INPUTS, *past}):
        raise GenaiExportError(f"{model_file}: inputs {extra} are not ones onnxruntime-genai feeds")
    if missing := [n for n in (*STEP_INPUTS, *past) if n not in inputs] + [
            n for n in ("logits", *present) if n not in outputs]:
        raise GenaiExportError(f"{model_file}: lacks {missing} for a config of {n_layer} layers")
    for arg in [*(inputs[n] for n in past), *(outputs[n] for n in present)]:
        heads, size = arg.shape[1], arg.shape[3]
        if (isinstance(heads, int) and heads != n_head) or (isinstance(size, int) and size != head_dim):
            raise GenaiExportError(f"{model_file}: {arg.name} has shape {arg.shape}, config.json says "
                                   f"{n_head} heads of {head_dim}")
    width = outputs["logits"].shape[-1]
    if isinstance(width, int) and width != tokenizer.vocab_size:
        raise GenaiExportError(f"{model_file}: logits width {width} != the "
                               f"tokenizer's vocabulary {tokenizer.vocab_size}")
    options: dict[str, Any] = {
        "log_id": "flashnpc", "provider_options": [],
        "intra_op_num_threads": 1, "inter_op_num_threads": 1,
        "session.intra_op.allow_spinning": "0",
        # an ORT file was optimised for its target at conversion; re-optimising is for ONNX only
        "graph_optimization_level": "ORT_DISABLE_ALL" if ort_format else "ORT_ENABLE_ALL",
    }
    if ort_format:
        options["session.load_model_format"] = "ORT"
    sampling = _engine_sampling_defaults()
    temperature = float(sampling["temperature"])
    return {
        "model": {
            "bos_token_id": tokenizer.bos_id,
            "context_length": context,
            "decoder": {
                "session_options": options,
                "filename": model_file,
                "head_size": head_dim,
                "hidden_size": n_embd,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "position_ids": "position_ids", "past_key_names": PAST_NAMES[0],
                           "past_value_names": PAST_NAMES[1]},
                "outputs": {"logits": "logits", "present_key_names": PRESENT_NAMES[0],
                            "present_value_names": PRESENT_NAMES[1]},
                "num_attention_heads": n_head,
                "num_hidden_layers": n_layer,
                "num_key_value_heads": n_head,
            },
            "eos_token_id": tokenizer.eos_id,
            "pad_token_id": tokenizer.pad_id,
            "type": MODEL_TYPE,
            "vocab_size": tokenizer.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": temperature > 0,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": temperature if temperature > 0 else 1.0,
            "top_k": int(sampling["top_k"]),
            "top_p": float(sampling["top_p"]),
        },
    }


def _slot_names(tokenizer: Tokenizer) -> dict[int, str]:
    """Slot token id -> its marker as line text (``{player}``)."""
    return {tokenizer.id_of(f"<slot:{s}>"): "{" + s + "}" for s in tokenizer.catalog["slots"]}


def hf_tokenizer_json(tokenizer: Tokenizer) -> dict[str, Any]:
    """A Hugging Face ``tokenizer.json`` that encodes and decodes like ``tokenizer``.

    * model: BPE over GPT-2's byte units (:func:`runtime.tokenizer.bytes_to_units`): byte ``b``
      keeps id ``byte_offset + b``, merge ``i`` is id ``byte_offset + 256 + i`` with rank ``i``,
      so lowest-rank-first merging is the project's rule (docs/tokenizer.md section 4);
    * pre-tokenizer: the project's pattern (``Split``, isolated matches), then byte units;
    * control tokens are special added tokens with their names (``<bos>``, ``<arch:guard>``,
      ...): a prompt can be written as their concatenation, and decoding with special tokens
      skipped drops them as the project does; slot tokens are non-special added tokens spelled
      as their markers (``{player}``), so a marker in text encodes to its id and decodes back.

    Unlike the project's tokenizer it also reads a control name written in a text
    (``"<bos>"``) as that control token; line text never contains one.
    """
    units = bytes_to_units()

    def spelled(token_id: int) -> str:
        return "".join(units[b] for b in tokenizer.token_bytes(token_id))

    slots = _slot_names(tokenizer)
    added = [{"id": i, "content": slots.get(i, name), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": i not in slots}
             for i, name in enumerate(tokenizer.controls)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOKENIZE_PATTERN}, "behavior": "Isolated",
             "invert": False},
            byte_level,
        ]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {spelled(i): i for i in range(tokenizer.n_control, tokenizer.vocab_size)},
            "merges": [f"{spelled(a)} {spelled(b)}" for a, b in tokenizer.merges],
        },
    }


def hf_tokenizer_config(tokenizer: Tokenizer, context_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: a plain fast tokenizer that adds no bos/eos and does not
    clean up spaces on decode (the prompt carries ``<bos>`` itself)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "bos_token": tokenizer.controls[tokenizer.bos_id],
        "eos_token": tokenizer.controls[tokenizer.eos_id],
        "pad_token": tokenizer.controls[tokenizer.pad_id],
        "unk_token": None,
        "model_max_length": context_length,
    }


__all__ = ["BUNDLE_SUBDIR", "GENAI_CONFIG", "PROJECT_TOKENIZER", "GenaiExportError", "genai_config", "hf_tokenizer_config",
           "hf_tokenizer_json", "write_genai_files", "write_genai_folder"]
