"""Session fixtures for the engine tests: the real default model (SmolLM2-135M-Instruct),
loaded once in process, and one real `stacx serve` subprocess on a free port."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.hf import resolve_model
from stacx.inference.sglang_server import free_port, wait_healthy
from stacx.inference.torch_engine import TorchEngine

THREADS = 1  # this 2-core machine is shared with other test processes (see TorchEngine.threads)


@pytest.fixture(scope="session")
def model_dir() -> str:
    return resolve_model("default")


@pytest.fixture(scope="session")
def torch_engine(model_dir: str) -> Iterator[TorchEngine]:
    engine = TorchEngine(model_dir, device="cpu", max_len=2048, threads=THREADS)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def serve_url(model_dir: str) -> Iterator[str]:
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="stacx-serve-")) / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "stacx",
        "serve",
        "--model",
        model_dir,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-len",
        "2048",
        "--threads",
        str(THREADS),
        "--model-alias",
        "default",
        "--model-alias",
        "student",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=180, log=log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def chat_prompt(torch_engine: TorchEngine) -> ChatPrompt:
    return ChatPrompt(torch_engine.tokenizer)


class ChatPrompt:
    """Token ids of a one-message chat in the model's template."""

    def __init__(self, tokenizer: object) -> None:
        self.tok = tokenizer

    def __call__(self, text: str) -> list[int]:
        rendered = self.tok.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return list(self.tok.encode(rendered, add_special_tokens=False))  # type: ignore[attr-defined]
