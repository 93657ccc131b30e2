"""Images from the competition folder as tensors, and batches whose size may change between steps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class ImageSet(Dataset):
    """Images from files: any mode → RGB (grayscale repeated on 3 channels), bilinear resize, ImageNet norm.

    With ``cache``, each decoded and resized image is kept as uint8 (3·size² bytes) by the process that loaded it — a
    loader's persistent worker keeps its own — so later epochs skip PNG/JPEG decoding and resizing, which held
    ResNet-50's wall-clock rate on an H100 to a quarter of its training-step rate."""

    def __init__(self, paths: list[Path], labels: np.ndarray | None, size: int, cache: bool = False):
        self.paths = list(paths)
        self.labels = None if labels is None else torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.size = size
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.paths)

    def _decode(self, i: int) -> np.ndarray:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return np.asarray(im.convert("RGB").resize((self.size, self.size), Image.BILINEAR), dtype=np.uint8)

    def __getitem__(self, i: int):
        if self.cache is None:
            pixels = self._decode(i)
        else:
            pixels = self.cache.get(i)
            if pixels is None:
                pixels = self.cache[i] = self._decode(i)
        a = pixels.astype(np.float32) / 255.0
        x = torch.from_numpy(((a - MEAN) / STD).transpose(2, 0, 1).copy())
        return (x, self.labels[i]) if self.labels is not None else x


class ResizableBatchSampler(Sampler[list[int]]):
    """Shuffled (or ordered) batches whose size is read at every batch: set ``batch_size`` between steps. Shuffled
    (training) batches never end on a batch of one row: it joins the batch before.

    With worker processes the batches already prefetched keep their old size; the next ones take the new size.
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int = 0):
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.epoch = 0

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(self.n))
        self.epoch += 1
        i = 0
        while i < self.n:
            size = max(1, int(self.batch_size))
            if self.shuffle and self.n - (i + size) == 1:  # training: a last batch of one row breaks BatchNorm
                size += 1  # ("Expected more than 1 value per channel"), so that row joins the batch before it
            yield order[i:i + size]
            i += size

    def __len__(self) -> int:
        size = max(1, int(self.batch_size))
        batches = math.ceil(self.n / size)
        lone = self.shuffle and self.n > 1 and self.n - size * (batches - 1) == 1  # joined to the one before
        return batches - (1 if lone else 0)


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None

    def build(self, dataset: Dataset, sampler: ResizableBatchSampler) -> DataLoader:
        workers = self.num_workers
        return DataLoader(dataset, batch_sampler=sampler, num_workers=workers, pin_memory=self.pin_memory,
                          persistent_workers=workers > 0, prefetch_factor=self.prefetch_factor if workers else None)
