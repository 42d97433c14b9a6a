"""Data-parallel training (DDP, 2 CPU processes, gloo) with one layer's weight gradient
computed by torch_convgrad inside a custom autograd.Function.

Two copies of a tiny conv net start from the same weights: in one, the first convolution's
weight gradient comes from ``torch_convgrad.conv_backprop_filters``; the other is plain
autograd. Each rank trains both on its own batches; DDP all-reduces the gradients. After every
step, every rank checks that the two copies have the same gradients and weights.

Run: ``python examples/ddp_weight_gradient.py`` (starts 2 processes), or start the ranks
yourself with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (e.g. with torchrun).
"""
import copy
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import torch_convgrad


class Conv2dWithOurWeightGradient(torch.autograd.Function):
    """``F.conv2d`` whose weight gradient is torch_convgrad's (NCHW data, OIHW filters)."""

    @staticmethod
    def forward(ctx, x, weight, stride, padding):
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding = stride, padding
        return F.conv2d(x, weight, stride=stride, padding=padding)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_x = torch.nn.grad.conv2d_input(x.shape, weight, grad_output, stride=ctx.stride, padding=ctx.padding)
        grad_weight = torch_convgrad.conv_backprop_filters(
            x, grad_output, list(weight.shape), strides=ctx.stride, pads_begin=ctx.padding,
            pads_end=ctx.padding, data_format="NCX", filter_format="OIX")
        return grad_x, grad_weight, None, None


class TinyNet(torch.nn.Module):
    def __init__(self, use_torch_convgrad):
        super().__init__()
        self.use_torch_convgrad = use_torch_convgrad
        self.conv1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        if self.use_torch_convgrad:
            x = Conv2dWithOurWeightGradient.apply(x, self.conv1.weight, 2, 1)
        else:
            x = self.conv1(x)
        x = F.relu(self.conv2(F.relu(x)))
        return self.head(x.mean(dim=(2, 3)))


def train(rank, world_size, steps=3):
    torch.manual_seed(0)  # the same initial weights on every rank
    plain = TinyNet(use_torch_convgrad=False)
    ours = copy.deepcopy(plain)
    ours.use_torch_convgrad = True
    models = [DistributedDataParallel(plain), DistributedDataParallel(ours)]
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1) for model in models]
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(steps):
        x = torch.randn(4, 3, 16, 16, generator=data)
        target = torch.randint(0, 10, (4,), generator=data)
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            F.cross_entropy(model(x), target).backward()
            optimizer.step()
        for (name, p_plain), p_ours in zip(plain.named_parameters(), ours.parameters()):
            torch.testing.assert_close(p_ours.grad, p_plain.grad, msg=f"rank {rank} step {step}: grad of {name}")
            torch.testing.assert_close(p_ours, p_plain, msg=f"rank {rank} step {step}: {name}")
    print(f"rank {rank}: {steps} DDP steps, torch_convgrad's weight gradient matches plain autograd on every rank",
          flush=True)


def run_rank(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train(rank, world_size)
    finally:
        dist.destroy_process_group()


def spawned(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_rank(rank, world_size)


if __name__ == "__main__":
    if "RANK" in os.environ:  # started by torchrun or a test
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free_port = s.getsockname()[1]
        mp.spawn(spawned, args=(2, free_port), nprocs=2)
