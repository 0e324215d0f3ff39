"""The policy: the built-in tiny character-level LM (made locally, no downloads) or any causal LM.

Built-in policy (docs/engine.md): a character tokenizer (`tokenizers` WordLevel over single characters,
wrapped as `PreTrainedTokenizerFast`) and a 2-layer Llama from a `transformers` config, warm-started by a
short supervised pass on the task so that GRPO starts from a policy that is sometimes right. It is made
deterministically from (task, seed) and saved as safetensors under the cache folder, so the second start
loads in well under a second.

Any `AutoModelForCausalLM` with its tokenizer loads from a local folder or a hub id, with
`trust_remote_code=False` unless the caller opts in, and safetensors weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import torch

from divviz.engine import smollm2
from divviz.engine.models import BUILTIN
from divviz.engine.tasks import ALPHABET, Task
from divviz.catalogue.params import DivvizInputError
from divviz.safetext import quoted, shorten, unknown

SPECIAL = ("<pad>", "<bos>", "<eos>")
WARM_START = {  # supervised steps that take each task's tiny model to roughly 10–50% sampled accuracy
    "add": 800, "sort": 250, "reverse": 230, "countdown": 200,
}
ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=48, tie_word_embeddings=True)


def cache_dir() -> Path:
    return Path(os.environ.get("DIVVIZ_CACHE", Path.home() / ".cache" / "divviz"))


def char_tokenizer():
    """One token per character of `ALPHABET`, plus <pad>, <bos>, <eos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   padding_side="left")


def _fingerprint(task: str, seed: int) -> str:
    spec = json.dumps({"task": task, "seed": seed, "arch": ARCH, "steps": WARM_START[task], "alphabet": ALPHABET,
                       "version": 1}, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


SHIPPED = Path(__file__).parent / "builtin"  # seed-0 weights, made by scripts/make_builtin.py


def builtin_policy(task: Task, seed: int = 0):
    """The warm-started built-in model for `task`: the shipped weights (seed 0), else the cache, else made
    now (about 10 s on a 2-core CPU) and cached."""
    from transformers import LlamaForCausalLM

    name = f"builtin-{task.name}-{_fingerprint(task.name, seed)}"
    for folder in (SHIPPED / name, cache_dir() / name):
        if (folder / "model.safetensors").exists():
            return LlamaForCausalLM.from_pretrained(folder, use_safetensors=True).eval(), char_tokenizer()
    model, tokenizer = _warm_start(task, seed)
    save_builtin(model, cache_dir() / name)
    return model, tokenizer


def save_builtin(model, folder: Path) -> None:
    """Save atomically: a half-written folder is never seen (another process may be making the same one)."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    try:
        tmp.rename(folder)
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _warm_start(task: Task, seed: int):
    """Supervised pass on prompt+answer+<eos>, loss on the answer only (AdamW, batch 64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **ARCH)
    model = LlamaForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    rng = random.Random(seed)
    for _ in range(WARM_START[task.name]):
        pairs = [task.make(rng) for _ in range(64)]
        ids, labels = [], []
        for prompt, answer in pairs:
            p = tokenizer.encode(prompt)  # <bos> prompt, exactly as GRPO will prompt it
            a = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
            ids.append([*p, *a])
            labels.append([-100] * len(p) + a)
        width = max(map(len, ids))
        input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(x)) + x for x in ids])
        label_ids = torch.tensor([[-100] * (width - len(x)) + x for x in labels])
        attention = (torch.arange(width)[None, :] >= torch.tensor([width - len(x) for x in ids])[:, None]).long()
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as in rollout.py, so left padding is invisible
        loss = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, labels=label_ids).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    return model, tokenizer


def load_policy(model: str, task: Task, seed: int = 0, trust_remote_code: bool = False):
    """(model, tokenizer) for a built-in model ("builtin", "smollm2-135m": `models.py`) or a local folder / hub id
    of a causal LM. Bad paths get a clear `DivvizInputError`, never a traceback. transformers' progress bar of the
    weights it loads ("Loading weights 272/272", in every run's log) is switched off."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    if model == BUILTIN:
        return builtin_policy(task, seed)
    if model == smollm2.NAME:
        return smollm2.load(cache_dir())
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if model.startswith((".", "/", "~")) and not Path(model).expanduser().exists():
        raise DivvizInputError(f"model folder {quoted(model)} does not exist")
    model = str(Path(model).expanduser()) if model.startswith("~") else model
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 — any loading failure becomes one message
        raise DivvizInputError(f"could not read a model config from {quoted(model)}: {_first_line(err)}") from None
    if not any(arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel") for arch in config.architectures or []):
        raise DivvizInputError(f"{quoted(model)} is not a causal language model (its architectures: "
                               f"{', '.join(config.architectures or ['none'])})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
        policy = AutoModelForCausalLM.from_pretrained(model, trust_remote_code=trust_remote_code, use_safetensors=True)
    except Exception as err:  # noqa: BLE001
        raise DivvizInputError(f"could not load {quoted(model)}: {_first_line(err)}") from None
    if tokenizer.eos_token_id is None:
        raise DivvizInputError(f"the tokenizer of {quoted(model)} has no end-of-sequence token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return policy, tokenizer


def train_last_blocks(model, blocks: int) -> None:
    """Leave only the last `blocks` transformer blocks and the final norm trainable (0: every parameter). The
    embeddings (tied to the output layer in SmolLM2 and the built-in model) and the earlier blocks are frozen, so the
    backward pass stops at the first trained block: a real model's CPU step costs a forward and a short backward."""
    if blocks == 0:
        return
    layers = model.get_decoder().layers
    model.requires_grad_(False)
    for block in layers[-blocks:]:
        block.requires_grad_(True)
    model.get_decoder().norm.requires_grad_(True)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return shorten(text[0], 300) if text else type(err).__name__


DTYPES = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda", "mps")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 matrix products natively (AVX512-BF16 or AMX), where bf16 autocast is
    about twice as fast as float32 (docs/learning.md); without them it is emulated and slower."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def pick_dtype(name: str, device: torch.device, model: str) -> torch.dtype | None:
    """The autocast precision of the forward passes, None for full float32. "auto": bfloat16 on a CUDA device that
    has it, and on a CPU that has it for a real model (the built-in model is too small to gain and keeps float32);
    "bfloat16" where the device cannot is refused. Weights, log-softmax and the loss stay float32."""
    if name == "float32":
        return None
    supported = (torch.cuda.is_bf16_supported() if device.type == "cuda" else
                 cpu_has_bf16() if device.type == "cpu" else False)
    if name == "bfloat16":
        if not supported:
            raise DivvizInputError(f"dtype 'bfloat16' was asked for but this {device.type.upper()} has no native "
                                   "bfloat16 (AVX512-BF16 or AMX on a CPU); use --dtype auto or float32")
        return torch.bfloat16
    return torch.bfloat16 if supported and (device.type == "cuda" or model != BUILTIN) else None


def pick_device(name: str = "auto") -> torch.device:
    """cuda, then mps, then cpu for "auto"; an explicit choice that is not available is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DivvizInputError("device 'cuda' was asked for but no CUDA device is available; use --device auto")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DivvizInputError("device 'mps' was asked for but this machine has no Apple GPU; use --device auto")
    if name not in DEVICES:
        raise DivvizInputError(unknown("device", name, DEVICES))
    return torch.device(name)
