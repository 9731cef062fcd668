"""Serving: many dialogues at once on one server (PyTorch or onnxruntime, continuous batching).

* :mod:`runtime.serving.batched_engine` - :class:`BatchedEngine`, continuous batching over the
  PyTorch model with a paged KV cache (:mod:`runtime.serving.block_cache`);
* :mod:`runtime.serving.ort_engine` - :class:`OrtBatchedEngine`, the same batching through the
  exported INT4 graph (the CPU engine);
* :mod:`runtime.serving.batch_generate` - batched decoding of many prompts through a
  :class:`~runtime.client.onnx_model.FlashOnnx` (evaluation);
* :mod:`runtime.serving.dialogue_service` - :class:`DialogueService`, sessions, admission,
  deadlines and fallbacks over an engine (what ``flashnpc serve --dialogue`` runs).
"""
