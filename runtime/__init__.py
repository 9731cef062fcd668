"""FlashNPC runtime: line book, tokenizer, the Flash model, training, export and engines."""
