"""The dialogue server: NPC lines over WebSockets for clients that cannot run the model.

* :mod:`server_sync.dialogue.dialogue_protocol` - its messages (on the shared wire format);
* :mod:`server_sync.dialogue.dialogue_server` - :class:`DialogueServer` over a
  :class:`runtime.serving.dialogue_service.DialogueService` (``flashnpc serve --dialogue``).
"""
