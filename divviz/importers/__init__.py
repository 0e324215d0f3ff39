"""Bring your own run: other trainers' logs made into divviz run folders (beside the engine: it writes the engine's
run-folder contract and scores tokens with the loss; nothing below imports it). `formats.read` tells a file's format
from its content (UNIPO's JSON, JSONL or folder, TRL's trainer_state.json, verl's file logger, divviz's JSONL);
`names` maps each source's metric names to divviz's; `source.source_of` says where an imported run came from."""
