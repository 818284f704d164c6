"""Milestone uploads shared by the milestone, batch and checkpoint tests: hostile ones, and the reference moved
by noise."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import torch

from autograder.course import course_of

lm = course_of().lesson.trainer


def zip_bomb(path: Path, *, mib: int) -> None:
    """A milestone.pt whose one tensor record is deflate-compressed: about mib/230 MiB on disk, mib when read."""
    small, numel = 70_000, mib * 2**20 // 4
    buf = io.BytesIO()
    torch.save({"config": {"preset": "quick", "vocab": list(lm.VOCAB)},
                "state_dicts": {"rope": {"token_emb.weight": torch.zeros(small)}}}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("/data/0"):
                with dst.open(item.filename, "w", force_zip64=True) as f:
                    for _ in range(mib):
                        f.write(bytes(2**20))
                continue
            if item.filename.endswith("data.pkl"):  # the pickle declares the large size, as the record holds
                data = data.replace(b"J" + struct.pack("<i", small), b"J" + struct.pack("<i", numel))
            dst.writestr(item.filename, data, compress_type=zipfile.ZIP_STORED)


def other_weights(pt: Path | bytes, seed: int) -> bytes:
    """The checkpoint at pt (a path or its bytes) with its weights moved by 1e-4 relative noise: distinct bytes,
    the same verdict."""
    ckpt = torch.load(pt if isinstance(pt, Path) else io.BytesIO(pt), weights_only=True)
    gen = torch.Generator().manual_seed(seed)
    ckpt["state_dicts"] = {pos: {k: v * (1 + 1e-4 * torch.randn(v.shape, generator=gen)) for k, v in sd.items()}
                           for pos, sd in ckpt["state_dicts"].items()}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    return buf.getvalue()
