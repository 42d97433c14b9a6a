"""Concurrency and memory: threads calling the ops get the single-threaded results bit for bit, and
resident memory stays flat over many calls (with autograd, and with errors)."""
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import threading

import pytest
import torch

import torch_convgrad
from conftest import data_shape, rand

ALGORITHMS = torch_convgrad.algorithm_names()


def _problems():
    """(x, dy, shape, attributes) for a dense, a strided and a depthwise problem, NXC and NCX."""
    problems = []
    for data_format in ("NXC", "NCX"):
        def data(channels, size, seed):
            return rand(data_shape(2, channels, size, data_format), seed=seed)

        problems.append((data(16, (20, 18), 1), data(24, (20, 18), 2), [24, 16, 3, 3],
                         dict(pads_begin=1, pads_end=1, data_format=data_format, filter_format="OIX")))
        problems.append((data(16, (21, 19), 3), data(8, (11, 10), 4), [8, 16, 3, 3],
                         dict(strides=2, pads_begin=[1, 0], pads_end=[1, 2], data_format=data_format,
                              filter_format="OIX")))
        problems.append((data(32, (24, 24), 5), data(32, (24, 24), 6), [32, 1, 3, 3],
                         dict(pads_begin=1, pads_end=1, groups=32, data_format=data_format, filter_format="OIX")))
    return problems


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_eight_threads_get_the_single_threaded_results_bit_for_bit(algorithm):
    problems = _problems()
    with torch_convgrad.use_algorithm(algorithm):
        expected = [torch_convgrad.conv_backprop_filters(x, dy, shape, **attrs) for x, dy, shape, attrs in problems]
        results, errors = {}, []

        def work(thread):
            try:
                for repeat in range(5):
                    for index, (x, dy, shape, attrs) in enumerate(problems):
                        results[thread, repeat, index] = torch_convgrad.conv_backprop_filters(x, dy, shape, **attrs)
            except Exception as error:  # reported below, with the thread's failure
                errors.append(error)

        threads = [threading.Thread(target=work, args=(thread,)) for thread in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert len(results) == 8 * 5 * len(problems)
    for (_, _, index), result in results.items():
        assert torch.equal(result, expected[index])


def _resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux) to read resident memory")
@pytest.mark.parametrize("mode", ["autograd", "errors"])
def test_resident_memory_stays_flat_over_ten_thousand_calls(mode):
    x = rand([1, 6, 6, 4], torch.float64, seed=7).requires_grad_()
    dy = rand([1, 6, 6, 4], torch.float64, seed=8).requires_grad_()

    def call():
        if mode == "autograd":
            out = torch_convgrad.conv_backprop_filters(x, dy, [3, 3, 4, 4], pads_begin=1, pads_end=1)
            gx, gdy = torch.autograd.grad(out.sum(), (x, dy))
            return
        with pytest.raises(ValueError, match="strides"):
            torch_convgrad.conv_backprop_filters(x, dy, [3, 3, 4, 4], strides=0)

    for _ in range(1000):  # allocator pools and caches settle
        call()
    before = _resident_bytes()
    for _ in range(10_000):
        call()
    growth = _resident_bytes() - before
    # A leak of one small tensor or message per call would add at least ~1 MB here.
    assert growth < 1 << 20, f"resident memory grew by {growth / 2**20:.1f} MiB over 10,000 calls"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
                    reason="needs an x86-64 build and binutils' objdump")
def test_instructions_beyond_the_baseline_stay_in_the_per_capability_kernels():
    """The AVX2 and AVX-512 kernels are compiled under target pragmas into the same library as
    the baseline code. An inline function they compile from a header read after the pragma is a
    weak symbol, and the linker keeps one copy for the whole library: if that copy held AVX
    instructions, a CPU without them would crash in baseline code. So every function with
    VEX/EVEX instructions (v-mnemonics, mask registers) must be a per-capability namespace's own.
    """
    library = importlib.util.find_spec("torch_convgrad._C").origin
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", library], capture_output=True,
                             text=True, check=True).stdout
    vector_functions, function = set(), None
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        fields = line.split("\t")
        if function and len(fields) > 1 and re.match(r"v[a-z]|k[a-z]+\s|.*%k[0-7]\b", fields[-1].strip()):
            vector_functions.add(function)
    assert any("::AVX2::" in name for name in vector_functions), "no AVX2 kernel found: the scan is broken"
    offenders = sorted(name for name in vector_functions if not re.search(r"::(AVX2|AVX512)::", name))
    assert not offenders, offenders[:20]
