"""The model factory: what makes a model (offline; torch, onnx, PyYAML, tqdm).

* :mod:`runtime.factory.linebook` - the line book (YAML): catalog, lines, fallbacks, lint;
* :mod:`runtime.factory.model`, :mod:`runtime.factory.quant`, :mod:`runtime.factory.train` - the
  Flash model (PyTorch), INT4 quantisation, training (``flashnpc train``);
* :mod:`runtime.factory.export` - checkpoint -> ONNX / INT4 model directory (``flashnpc export``);
* :mod:`runtime.factory.evaluate`, :mod:`runtime.factory.writer_eval`,
  :mod:`runtime.factory.blind`, :mod:`runtime.factory.state_classifier`,
  :mod:`runtime.factory.text_metrics` - evaluation (``flashnpc eval``), the writer's figures,
  the blind-rating kit and their classifiers.

A game client never imports it.
"""
