"""Model families: one shared decoder (runtime/model/decoder.py) and one small module per family.

A family (family.py's `Family`) says which config.json `model_type`s and which GGUF architecture it
reads and what differs from the plain Llama decoder: config fields, checkpoint tensor names, GGUF
names. registry.py lists the families; adding one is a module and its tests (docs/ARCHITECTURE.md).
"""
