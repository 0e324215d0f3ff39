"""Bring your own run: other trainers' per-token logs made into divviz run folders (beside the engine: it writes the
engine's run-folder contract and scores tokens with the loss; nothing below imports it)."""
