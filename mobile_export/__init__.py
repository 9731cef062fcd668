"""FlashNPC mobile_export: model bundles for mobile builds and the packaged client.

* :mod:`mobile_export.bundle` - ``flashnpc export mobile``: model directory -> bundle
  (ORT-format model, operator config, tokenizer, fallbacks, manifest.json);
* :mod:`mobile_export.verify` / :mod:`mobile_export.cli` - ``flashnpc bundle verify``;
* :mod:`mobile_export.client` / :mod:`mobile_export.client_main` - ``flashnpc export client``,
  the PyInstaller build of the offline demo client;
* :mod:`mobile_export.bundle_bench`, :mod:`mobile_export.coldstart` - the figures in BENCHMARKS.md.

Reading a bundle is the runtime's job (:mod:`runtime.client.bundle`), so a game client never needs
this package. The format is specified in ``docs/mobile.md``.
"""
