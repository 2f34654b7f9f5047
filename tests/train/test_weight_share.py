"""Cross-process weight handoff on one node (stacx.weights.share), on CPU: a trainer
process packs a real checkpoint's weights into shared memory and writes the manifest; this
process (the engine's) maps them and loads them into a real TorchEngine, without reading the
checkpoint file (it is overwritten with garbage first). What cannot be reached from here
(another node, another version, a dropped buffer) is None, so WeightSync falls back to the file.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import torch

from stacx.inference.torch_engine import TorchEngine
from stacx.train import checkpoint
from stacx.weights.share import SHM_DIR, SharedWeights, manifest_path
from tests.train.test_checkpoint import tiny_model

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")


def _trainer(run_dir: str, versions: int, conn: Connection) -> None:
    """A trainer process: save each version, offer it, report (path, sha, its weights)."""
    share = SharedWeights(keep=1)
    model = tiny_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for v in range(1, versions + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * v)
        path, sha = checkpoint.save(run_dir, v, model, opt, {})
        state = {k: p.detach().clone() for k, p in model.named_parameters()}
        share.offer(str(path), sha, state)
        conn.send((str(path), sha, {k: t.tolist() for k, t in state.items()}))
    conn.recv()  # keep the buffers alive until the engine's side is done
    share.close()
    conn.send("closed")


def _start(tmp_path: Path, versions: int) -> tuple[mp.process.BaseProcess, Connection, list]:
    ours, theirs = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_trainer, args=(str(tmp_path), versions, theirs))
    proc.start()
    offers = [ours.recv() for _ in range(versions)]
    return proc, ours, offers


def test_engine_loads_another_process_weights_without_the_file(tmp_path: Path) -> None:
    proc, conn, offers = _start(tmp_path, 1)
    try:
        path, sha, expected = offers[0]
        Path(path).write_bytes(b"not weights")  # the file is never read on this path
        state = SharedWeights().take(path, sha)
        assert state is not None
        assert json.loads(manifest_path(path).read_text())["kind"] == "shm"
        engine = TorchEngine(tiny_model(2), device="cpu", cuda_graphs=False)
        try:
            asyncio.run(engine.load_state(state, 1))
            own = engine.model.state_dict()
            for name, values in expected.items():
                torch.testing.assert_close(own[name], torch.tensor(values), rtol=0, atol=0)
            assert engine.weight_version == 1
        finally:
            asyncio.run(engine.close())
    finally:
        conn.send("done")
        assert conn.recv() == "closed"
        proc.join(30)
    assert proc.exitcode == 0
    assert not list(SHM_DIR.glob(f"stacx-weights-{proc.pid}-*"))  # close() removed its segment


def test_what_cannot_be_reached_is_none(tmp_path: Path) -> None:
    proc, conn, offers = _start(tmp_path, 2)
    try:
        (p1, sha1, _), (p2, sha2, _) = offers
        share = SharedWeights()
        assert share.take(p1, sha1) is None  # keep=1: v1's buffer was dropped when v2 came
        assert share.take(p2, "0" * 64) is None  # not the published digest
        assert share.take(p2, sha2) is not None
        manifest = manifest_path(p2)
        other = {**json.loads(manifest.read_text()), "boot_id": "another-boot"}
        manifest.write_text(json.dumps(other))
        assert share.take(p2, sha2) is None  # another node (or a reboot): the file, not a map
    finally:
        conn.send("done")
        conn.recv()
        proc.join(30)
