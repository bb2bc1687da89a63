"""A small convolutional network for the 8×8 handwritten digits that
scikit-learn ships, its layers written as te programs and run as PyTorch ops.

    conv 3×3, 1→8, relu · maxpool 2×2 · conv 3×3, 8→16, relu · maxpool 2×2 · dense 64→10

``TeNet`` computes every layer with a te kernel (``te_autodiff.torch.op``);
``TorchNet`` is the same network in plain PyTorch, with the same parameters.
Tutorial 06 trains the two side by side; tests/test_distributed.py and
torchrun train ``TeNet`` with DistributedDataParallel through ``main``:

    torchrun --standalone --nproc_per_node=2 examples/digits_cnn.py

Each process computes its share of every batch with the te kernels;
torch.distributed averages the gradients.  Needs torch and scikit-learn
(the ``[torch]`` and ``[examples]`` extras).
"""
import argparse
import datetime
import gc
import itertools

import torch
import torch.nn.functional as F
from torch import nn

import te_autodiff as te
import te_autodiff.torch as tet

SIZE, CLASSES = 8, 10            # 8×8 images, digits 0-9
C1, C2 = 8, 16                   # channels after the first and the second convolution
HIDDEN = C2 * (SIZE // 4) ** 2   # features after the second pooling: 16 × 2 × 2
BATCH, EPOCHS, LR, SEED = 64, 30, 0.01, 0


def conv3x3_relu(N, C, Fo, size, dtype):
    """``relu(conv2d(X, W, b, padding=1))`` over NCHW images: ``([X, W, b], out)``.
    The relu is a select on ``Z > 0`` so its gradient at 0 is 0, as in torch."""
    X = te.placeholder((N, C, size, size), dtype, "X")
    W = te.placeholder((Fo, C, 3, 3), dtype, "W")
    b = te.placeholder((Fo,), dtype, "b")
    c, ky, kx = te.reduce_axis(C, "c"), te.reduce_axis(3, "ky"), te.reduce_axis(3, "kx")

    def padded(n, y, x):
        """``X[n, c, y, x]`` with zeros outside the image (padding 1)."""
        iy, ix = y + ky - 1, x + kx - 1
        return te.if_then_else(te.all(iy >= 0, iy < size, ix >= 0, ix < size), X[n, c, iy, ix], 0.0)

    Z = te.compute((N, Fo, size, size),
                   lambda n, f, y, x: te.sum(padded(n, y, x) * W[f, c, ky, kx], axis=[c, ky, kx]) + b[f], name="conv")
    out = te.compute(Z.shape, lambda n, f, y, x: te.if_then_else(Z[n, f, y, x] > 0.0, Z[n, f, y, x], 0.0),
                     name="relu")
    return [X, W, b], out


def maxpool2x2(N, C, size, dtype):
    """2×2 max pooling with stride 2: ``([X], out)``.  Its gradient goes to the
    first maximum of each window, as torch's does."""
    X = te.placeholder((N, C, size, size), dtype, "X")
    ky, kx = te.reduce_axis(2, "ky"), te.reduce_axis(2, "kx")
    return [X], te.compute((N, C, size // 2, size // 2),
                           lambda n, c, y, x: te.max(X[n, c, 2 * y + ky, 2 * x + kx], axis=[ky, kx]), name="pool")


def dense(N, D, M, dtype):
    """``X · Wᵀ + b`` (torch's ``linear``): ``([X, W, b], out)``."""
    X = te.placeholder((N, D), dtype, "X")
    W = te.placeholder((M, D), dtype, "W")
    b = te.placeholder((M,), dtype, "b")
    k = te.reduce_axis(D, "k")
    return [X, W, b], te.compute((N, M), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k) + b[j], name="dense")


class DigitsNet(nn.Module):
    """The parameters and their initialisation (uniform in ±1/√fan_in, torch's
    default, from ``seed``); subclasses say how the layers are computed."""

    def __init__(self, dtype=torch.float32, seed=SEED):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def uniform(*shape, fan_in):
            return nn.Parameter((2 * torch.rand(shape, generator=g, dtype=dtype) - 1) * fan_in ** -0.5)

        self.conv1_w, self.conv1_b = uniform(C1, 1, 3, 3, fan_in=9), uniform(C1, fan_in=9)
        self.conv2_w, self.conv2_b = uniform(C2, C1, 3, 3, fan_in=C1 * 9), uniform(C2, fan_in=C1 * 9)
        self.fc_w, self.fc_b = uniform(CLASSES, HIDDEN, fan_in=HIDDEN), uniform(CLASSES, fan_in=HIDDEN)


class TeNet(DigitsNet):
    """Every layer a te kernel.  te kernels have fixed shapes: the five ops are
    built for each batch size on its first use and kept."""

    def __init__(self, dtype=torch.float32, seed=SEED):
        super().__init__(dtype, seed)
        self.te_dtype = str(dtype).removeprefix("torch.")
        self._ops = {}

    def layers(self, N):
        """The five torch ops for a batch of ``N`` images."""
        if N not in self._ops:
            d = self.te_dtype
            self._ops[N] = [tet.op(*spec) for spec in (
                conv3x3_relu(N, 1, C1, SIZE, d), maxpool2x2(N, C1, SIZE, d),
                conv3x3_relu(N, C1, C2, SIZE // 2, d), maxpool2x2(N, C2, SIZE // 2, d),
                dense(N, HIDDEN, CLASSES, d))]
        return self._ops[N]

    def forward(self, x):
        conv1, pool1, conv2, pool2, fc = self.layers(len(x))
        h = pool1(conv1(x, self.conv1_w, self.conv1_b))
        h = pool2(conv2(h, self.conv2_w, self.conv2_b))
        return fc(h.reshape(len(x), HIDDEN), self.fc_w, self.fc_b)


class TorchNet(DigitsNet):
    """The same network with torch.nn.functional's layers."""

    def forward(self, x):
        h = F.max_pool2d(F.relu(F.conv2d(x, self.conv1_w, self.conv1_b, padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, self.conv2_w, self.conv2_b, padding=1)), 2)
        return F.linear(h.flatten(1), self.fc_w, self.fc_b)


def load_data(dtype=torch.float32, seed=SEED):
    """The 1,797 digits as ``(x_train, y_train, x_test, y_test)``: images of
    shape (N, 1, 8, 8) scaled to [0, 1], int64 labels, a fixed stratified
    75/25 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=dtype).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


def batches(n, batch=BATCH, epochs=EPOCHS, seed=SEED):
    """Index tensors of the batches: a seeded shuffle of ``range(n)`` per epoch,
    cut into full batches (the last partial one is dropped: the kernels'
    shapes are fixed)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(n, generator=g)
        for start in range(0, n - batch + 1, batch):
            yield order[start:start + batch]


def optimizer(params):
    """Adam: what every run of this network trains with."""
    return torch.optim.Adam(params, lr=LR)


def train_step(model, opt, x, y) -> float:
    """One step on the mean cross-entropy of ``model(x)``; returns the loss.
    The mean matters under DistributedDataParallel: it averages the processes'
    gradients, which is then the gradient of the mean over the whole batch."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def fit(model, x, y, batch=BATCH, epochs=EPOCHS, steps=None, rank=0, world=1) -> list:
    """Train ``model`` on its share of every batch: process ``rank`` of
    ``world`` takes the ``rank``-th of ``world`` equal slices.  Returns the
    losses of this process's slices."""
    if batch % world:
        raise ValueError(f"the batch of {batch} does not split evenly over {world} processes")
    share = batch // world
    opt = optimizer(model.parameters())
    losses = []
    for whole in itertools.islice(batches(len(x), batch, epochs), steps):
        mine = whole[rank * share:(rank + 1) * share]
        losses.append(train_step(model, opt, x[mine], y[mine]))
    return losses


@torch.no_grad()
def accuracy(model, x, y) -> float:
    """The fraction of ``x`` that ``model`` classifies as ``y``."""
    return (model(x).argmax(1) == y).double().mean().item()


def main(argv=None):
    """Train ``TeNet`` with DistributedDataParallel over gloo, one process per
    rank; torchrun (or the caller) sets RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT."""
    from torch import distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    p = argparse.ArgumentParser(description="Train the digits network, its layers te kernels, with "
                                "DistributedDataParallel over gloo; start it with torchrun.")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"passes over the training images ({EPOCHS})")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch", type=int, default=BATCH, help="the global batch, split evenly over the processes")
    p.add_argument("--float64", action="store_true", help="train in float64 (default float32)")
    p.add_argument("--save", help="rank 0 writes the trained state_dict to this file")
    args = p.parse_args(argv)
    dtype = torch.float64 if args.float64 else torch.float32
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        x_train, y_train, x_test, y_test = load_data(dtype)
        model = TeNet(dtype)
        ddp = DistributedDataParallel(model)
        losses = fit(ddp, x_train, y_train, args.batch, args.epochs, args.steps, rank, world)
        # DDP's reducer holds gloo work and threads in reference cycles: freed
        # at interpreter exit, after the group is gone, a thread left joinable
        # aborts the process ("terminate called without an active exception")
        del ddp
        gc.collect()
        if rank == 0:
            print(f"{world} processes, {len(losses)} steps of {args.batch} images: "
                  f"last loss {losses[-1]:.4f}, test accuracy {accuracy(model, x_test, y_test):.2%}")
            if args.save:
                torch.save(model.state_dict(), args.save)
        dist.barrier()          # no rank tears gloo down while another still uses it
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
