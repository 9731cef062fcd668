"""The client engine: what a game ships (onnxruntime and numpy; never torch, onnx or YAML).

* :mod:`runtime.client.generator` - :class:`LineGenerator`, the engine a game calls
  (``from runtime import LineGenerator``);
* :mod:`runtime.client.onnx_model` - :class:`FlashOnnx`, the exported model in an onnxruntime
  session; :mod:`runtime.client.bundle` - reading (and verifying) a mobile bundle;
* :mod:`runtime.client.constraints` - banned words, slot rules, the word constraint and the veto;
  :mod:`runtime.client.sampling` - next-token sampling;
* :mod:`runtime.client.prefix_cache` - the prefix KV cache; :mod:`runtime.client.fallback` -
  authored fallback lines; :mod:`runtime.client.metrics` - the engine's Prometheus metrics.

It imports nothing of :mod:`runtime.serving` or :mod:`runtime.factory` (tests/test_layout.py
checks it): everything it reads comes from an exported model directory or bundle.
"""
