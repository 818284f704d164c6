"""Hostile milestone uploads shared by the milestone and batch tests."""

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
