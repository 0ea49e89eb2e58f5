"""The OpenAI Batch API: uploaded files (`files.py`), batches and their state (`store.py`), the
input file's lines and their prefix-grouped order (`lines.py`), answering one line through the
online routes' preparation and generation (`answer.py`), and the background runner (`runner.py`)
that works through pending batches beside online traffic, at background priority."""
