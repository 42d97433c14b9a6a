"""torch.compile and torch.export with the torch_convgrad ops.

(a) fullgraph compile matches eager (forward; forward+backward with inductor),
(b) dynamic=True compiles once for 3 batch/spatial sizes,
(c) the op's ValueError surfaces under torch.compile,
(d) torch.export: one call_function node per op, equal results, save/load round-trip in a
    fresh interpreter,
(e) export with a dynamic batch dim (and automatic dynamic spatial dims),
each on every device.

Inductor compiles are slow on a small CPU machine, so one test compiles a single function
calling all three ops with inductor (inference and training); the per-op/per-format sweeps
use the cheap "aot_eager" backend (same Dynamo + AOTAutograd tracing, no codegen) or a
counting backend.
"""
import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.utils import run_and_get_code
from torch.export import Dim, export

import torch_convgrad  # noqa: F401  (registers the ops)
from problems import OP_NAMES, FORMATS, op_packet, Problem
from conftest import ROOT



@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


class CountingBackend:
    """A Dynamo backend that counts graph compilations and runs the graph as is."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    @property
    def count(self):
        return len(self.graphs)


def op_function(problem):
    """fn(x, dy) calling the op at op level with the problem's attributes."""
    shape, kw = problem.shape(), problem.kwargs()
    packet = op_packet(problem.op)

    def fn(x, dy):
        return packet(x, dy, shape, **kw)

    return fn


def op_targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"
            and str(n.target).startswith("torch_convgrad.")]


def grads_of(fn, x, dy, weight):
    x, dy = x.detach().clone().requires_grad_(), dy.detach().clone().requires_grad_()
    out = fn(x, dy)
    gx, gdy = torch.autograd.grad((out * weight).sum(), (x, dy))
    return out.detach(), gx, gdy


# ---------------------------------------------------------------------------
# (a) fullgraph compile == eager
# ---------------------------------------------------------------------------

# One problem per (op, filter format), alternating layouts and pad kinds.
COMPILE_PROBLEMS = []
for _op in OP_NAMES:
    for _i, _fmt in enumerate(FORMATS[_op]):
        COMPILE_PROBLEMS.append(Problem(
            op=_op, fmt=_fmt, size=(7, 6), n=2, c=4, o=6, g=2, k=(3, 2), s=(2, 1), d=(1, 2),
            pads=[((1, 0), (0, 1)), "same_upper", "same_lower", "valid"][_i % 4],
            data_format=["NXC", "NCX"][_i % 2]))
    for _df in ("NXC", "NCX"):  # and both layouts with the default format in 1-D and 3-D
        COMPILE_PROBLEMS.append(Problem(op=_op, fmt="XIO", size=(9,), n=3, c=2, o=4, g=2, k=(3,), s=(2,),
                                        pads=((2,), (0,)), data_format=_df))
        COMPILE_PROBLEMS.append(Problem(op=_op, fmt="XIO", size=(4, 5, 3), n=1, c=3, o=2, k=(2, 2, 2),
                                        s=(1, 2, 1), d=(2, 1, 1), pads="same_lower", data_format=_df))


@pytest.mark.parametrize("problem", COMPILE_PROBLEMS, ids=Problem.id)
def test_compile_fullgraph_aot_eager(problem, device):
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=1, device=device)
    weight = torch.randn(problem.shape(), generator=torch.Generator().manual_seed(2)).to(device)
    dynamo_targets, aot_forward_targets = [], []

    def forward_compiler(gm, example_inputs):
        aot_forward_targets.extend(op_targets(gm))
        return make_boxed_func(gm.forward)

    aot = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward))

    def backend(gm, example_inputs):
        dynamo_targets.extend(op_targets(gm))
        return aot(gm, example_inputs)

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    # forward, no grad
    torch.testing.assert_close(compiled(x, dy), fn(x, dy), rtol=0, atol=0)
    # forward + backward
    want = grads_of(fn, x, dy, weight)
    got = grads_of(compiled, x, dy, weight)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    packet = op_packet(problem.op)
    # one op call in each Dynamo graph (inference, training), kept whole by AOTAutograd
    assert len(dynamo_targets) == 2 and all(t in (packet, packet.default) for t in dynamo_targets), dynamo_targets
    assert aot_forward_targets and all(t is packet.default for t in aot_forward_targets), aot_forward_targets


def test_compile_inductor_all_ops_forward_and_backward(device):
    """One inductor-compiled function calling all three ops (non-trivial formats and layouts),
    checked in inference and in training against eager."""
    problems = [
        Problem(op="filters", fmt="XIO", size=(7, 6), n=2, c=4, o=6, g=2, k=(3, 2), s=(2, 1), d=(1, 2),
                pads=((1, 0), (0, 1)), data_format="NXC"),
        Problem(op="weights", fmt="OIX", size=(8, 5), n=2, c=3, o=4, k=(3, 3), s=(2, 1),
                pads="same_lower", data_format="NCX"),
        Problem(op="transpose", fmt="IOX", size=(7, 5), n=2, c=4, o=6, g=2, k=(2, 3), s=(2, 1),
                pads="same_upper", data_format="NCX", output_padding=True),
    ]
    fns = [op_function(p) for p in problems]

    def model(*tensors):
        outs = [f(tensors[2 * i], tensors[2 * i + 1]) for i, f in enumerate(fns)]
        return outs[0].sin(), outs[1] * 2.0, outs[2] + 1.0

    inputs = [t for i, p in enumerate(problems)
              for t in p.tensors(dtype=torch.float32, seed=10 + i, device=device)]
    compiled = torch.compile(model, backend="inductor", fullgraph=True)

    outputs, code = run_and_get_code(compiled, *inputs)
    for got, want in zip(outputs, model(*inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # inductor calls the extension's kernels (as extern fallbacks), once each
    source = "\n".join(code)
    for name in OP_NAMES.values():
        assert source.count(f"torch.ops.torch_convgrad.{name}.default(") == 1, source

    def train(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        outs = fn(*leaves)
        loss = sum((o * o).sum() for o in outs)
        return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)

    got_outs, got_grads = train(compiled)
    want_outs, want_grads = train(model)
    for got, want in zip(got_outs + list(got_grads), want_outs + list(want_grads)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # inference + training


# ---------------------------------------------------------------------------
# (b) dynamic=True: one compilation for 3 batch and spatial sizes
# ---------------------------------------------------------------------------

# Channels (3, 4) and all sizes are chosen so that no two sizes of the first call coincide
# (Dynamo's duck sizing would tie them together) and none is 0 or 1 (specialised).
DYNAMIC_SIZES = [(2, (10, 13)), (3, (13, 16)), (6, (19, 22))]
DYNAMIC_PADS = {"explicit": ((1, 0), (0, 1)), "same_upper": "same_upper", "same_lower": "same_lower"}


@pytest.mark.parametrize("pads", list(DYNAMIC_PADS))
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_dynamic_compiles_once(op, pads, device):
    fmt = FORMATS[op][-1]
    data_format = "NCX" if pads == "same_lower" else "NXC"
    base = Problem(op=op, fmt=fmt, size=(10, 13), c=3, o=4, k=(3, 2), s=(2, 1), d=(1, 2),
                   pads=DYNAMIC_PADS[pads], data_format=data_format)
    fn = op_function(base)
    counter = CountingBackend()
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    shapes = set()
    for i, (n, size) in enumerate(DYNAMIC_SIZES):
        problem = replace(base, n=n, size=size)
        x, dy = problem.tensors(dtype=torch.float32, seed=i, device=device)
        shapes.add((tuple(x.shape), tuple(dy.shape)))
        torch.testing.assert_close(compiled(x, dy), fn(x, dy), rtol=0, atol=0)
    assert len(shapes) == 3
    assert counter.count == 1, [str(g.graph) for g in counter.graphs]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert op_targets(counter.graphs[0]) in ([op_packet(op)], [op_packet(op).default])
    # the graph is symbolic in the batch: its placeholders carry SymInt sizes
    example = [n.meta["example_value"] for n in counter.graphs[0].graph.nodes if n.op == "placeholder"
               and isinstance(n.meta.get("example_value"), torch.Tensor)]
    assert example and all(isinstance(t.shape[0], torch.SymInt) for t in example)


def test_dynamic_compiles_once_aot_eager_with_backward(device):
    """dynamic=True through AOTAutograd (forward + backward graphs) does not recompile either."""
    base = Problem(op="filters", fmt="OIX", size=(10, 13), c=3, o=4, k=(3, 2), s=(2, 1), d=(1, 2),
                   pads="same_upper", data_format="NCX")
    fn = op_function(base)
    compiled = torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)
    weight = torch.randn(base.shape(), device=device)
    for i, (n, size) in enumerate(DYNAMIC_SIZES):
        x, dy = replace(base, n=n, size=size).tensors(dtype=torch.float32, seed=i, device=device)
        for g, w in zip(grads_of(compiled, x, dy, weight), grads_of(fn, x, dy, weight)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


# ---------------------------------------------------------------------------
# (c) the op's error under torch.compile
# ---------------------------------------------------------------------------

def _bad_spatial_problem(op, data_format, device):
    problem = Problem(op=op, fmt=FORMATS[op][0], size=(8, 8), n=2, c=4, o=6, k=(3, 3), s=(2, 2),
                      pads="same_upper", data_format=data_format)
    x, dy = problem.tensors(dtype=torch.float32, device=device)
    axis = 1 if data_format == "NXC" else 2
    dy = torch.cat([dy, dy.narrow(axis, 0, 2)], axis)  # 2 more rows: inconsistent for every op
    return problem, x, dy


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_compile_raises_op_error(op, dynamic, device):
    problem, x, dy = _bad_spatial_problem(op, "NXC" if op != "weights" else "NCX", device)
    fn = op_function(problem)
    with pytest.raises(ValueError) as eager:
        fn(x, dy)
    message = str(eager.value)
    assert "spatial axis" in message or "size" in message

    counter = CountingBackend()
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=dynamic)
    # Dynamo reports exceptions raised while tracing with fake tensors as TorchRuntimeError
    # (a RuntimeError) carrying the op's ValueError text; plain ValueError is accepted too.
    with pytest.raises((ValueError, torch._dynamo.exc.TorchRuntimeError)) as compiled_error:
        compiled(x, dy)
    text = str(compiled_error.value)
    if not dynamic:
        assert message in text
    else:
        # With symbolic sizes the op's message spells the expected size as a formula over
        # the size symbols; the argument, the axis and the kind of error are the same.
        prefix = message.split(" has size")[0]  # e.g. "output_delta: spatial axis 0"
        assert "ValueError" in text or isinstance(compiled_error.value, ValueError)
        assert prefix + " has size" in text, text
    assert counter.count == 0  # never reached the backend


# ---------------------------------------------------------------------------
# (d) torch.export
# ---------------------------------------------------------------------------

class OpModule(torch.nn.Module):
    def __init__(self, problem):
        super().__init__()
        self.fn = op_function(problem)

    def forward(self, x, dy):
        return self.fn(x, dy)


EXPORT_PROBLEMS = {
    "filters": Problem(op="filters", fmt="XIO", size=(7, 6), n=2, c=4, o=6, g=2, k=(3, 2), s=(2, 1),
                       d=(1, 2), pads=((1, 0), (0, 1)), data_format="NXC"),
    "weights": Problem(op="weights", fmt="OIX", size=(8, 5), n=3, c=3, o=4, k=(3, 3), s=(2, 1),
                       pads="same_lower", data_format="NCX"),
    "transpose": Problem(op="transpose", fmt="XOI", size=(7, 5), n=2, c=4, o=6, g=2, k=(2, 3), s=(2, 1),
                         pads="same_upper", data_format="NXC", output_padding=True),
}


def _calls(ep, op):
    target = op_packet(op).default
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    return [n for n in nodes if n.target is target], nodes


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_export_single_node(op, strict, device):
    problem = EXPORT_PROBLEMS[op]
    x, dy = problem.tensors(dtype=torch.float32, seed=3, device=device)
    module = OpModule(problem)
    ep = export(module, (x, dy), strict=strict)
    for program in (ep, ep.run_decompositions()):  # the op survives the core-ATen decompositions
        calls, nodes = _calls(program, op)
        assert len(calls) == 1 and len(nodes) == 1, [str(n.target) for n in nodes]
        assert str(calls[0].target) == f"torch_convgrad.{OP_NAMES[op]}.default"
        torch.testing.assert_close(program.module()(x, dy), module(x, dy), rtol=0, atol=0)
    # a new input of the same shape
    x2, dy2 = problem.tensors(dtype=torch.float32, seed=4, device=device)
    torch.testing.assert_close(ep.module()(x2, dy2), module(x2, dy2), rtol=0, atol=0)


def test_export_save_load_roundtrip_in_fresh_process(tmp_path, device):
    expected = {}
    for op, problem in EXPORT_PROBLEMS.items():
        x, dy = problem.tensors(dtype=torch.float32, seed=5, device=device)
        ep = export(OpModule(problem), (x, dy))
        torch.export.save(ep, tmp_path / f"{op}.pt2")
        torch.save((x, dy), tmp_path / f"{op}_inputs.pt")
        expected[op] = OpModule(problem)(x, dy)

    script = textwrap.dedent(f"""
        import json, pathlib, sys
        import torch
        import torch_convgrad  # the ops must be registered before loading
        root = pathlib.Path({str(tmp_path)!r})
        report = {{}}
        for op in {list(EXPORT_PROBLEMS)!r}:
            ep = torch.export.load(root / f"{{op}}.pt2")
            x, dy = torch.load(root / f"{{op}}_inputs.pt")
            out = ep.module()(x, dy)
            torch.save(out, root / f"{{op}}_out.pt")
            report[op] = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        print(json.dumps(report))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for op in EXPORT_PROBLEMS:
        assert report[op] == [f"torch_convgrad.{OP_NAMES[op]}.default"], report
        got = torch.load(tmp_path / f"{op}_out.pt")
        assert got.shape == expected[op].shape and got.dtype == expected[op].dtype
        torch.testing.assert_close(got, expected[op], rtol=0, atol=0)


# ---------------------------------------------------------------------------
# (e) export with dynamic dims
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(OP_NAMES))
def test_export_dynamic_batch(op, device):
    problem = EXPORT_PROBLEMS[op]
    module = OpModule(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=6, device=device)
    batch = Dim("batch", min=2, max=64)
    ep = export(module, (x, dy), dynamic_shapes={"x": {0: batch}, "dy": {0: batch}})
    calls, _ = _calls(ep, op)
    assert len(calls) == 1
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(n.meta["val"].shape[0], torch.SymInt) for n in placeholders)
    assert any(r.lower == 2 and r.upper == 64 for r in ep.range_constraints.values()), ep.range_constraints
    for n in (2, 5, 9):
        x, dy = problem.tensors(dtype=torch.float32, seed=n, n=n, device=device)
        torch.testing.assert_close(ep.module()(x, dy), module(x, dy), rtol=0, atol=0)
    # the batch dim of the two data tensors is one symbol: different batches are rejected
    x, _ = problem.tensors(dtype=torch.float32, n=3, device=device)
    _, dy = problem.tensors(dtype=torch.float32, n=4, device=device)
    with pytest.raises(Exception):
        ep.module()(x, dy)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_export_automatic_dynamic_spatial(op, device):
    """Dim.AUTO on batch and spatial dims: the relation between the two spatial sizes is
    kept as a runtime check, and other consistent sizes run equal to eager."""
    problem = EXPORT_PROBLEMS[op]
    module = OpModule(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=7, device=device)
    spatial = range(1, 3) if problem.data_format == "NXC" else range(2, 4)
    auto = {i: Dim.AUTO for i in (0, *spatial)}
    ep = export(module, (x, dy), dynamic_shapes={"x": auto, "dy": auto})
    assert len(_calls(ep, op)[0]) == 1
    for n, size in ((3, (9, 8)), (4, (12, 7))):
        x2, dy2 = replace(problem, n=n, size=size).tensors(dtype=torch.float32, seed=n, device=device)
        torch.testing.assert_close(ep.module()(x2, dy2), module(x2, dy2), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# the Python API and vmap under torch.compile
# ---------------------------------------------------------------------------

API = {"filters": torch_convgrad.conv_backprop_filters, "weights": torch_convgrad.conv_backprop_weights,
       "transpose": torch_convgrad.conv_transpose_backprop_filters}
API_FORMAT_KW = {"filters": "filter_format", "weights": "weights_format", "transpose": "filter_format"}


def _api_function(op, shape_as_tensor=False):
    """The Python wrapper with int attributes broadcast per axis, on the problem below."""
    shape = API_PROBLEMS[op].shape()

    def fn(x, dy):
        s = torch.tensor(shape, dtype=torch.int32) if shape_as_tensor else shape
        return API[op](x, dy, s, strides=2, pads_begin=1, pads_end=0, dilations=1, groups=2,
                       data_format="NCX", **{API_FORMAT_KW[op]: "OIX"})

    return fn


API_PROBLEMS = {op: Problem(op=op, fmt="OIX", size=(8, 9), n=2, c=4, o=6, g=2, k=(3, 3), s=(2, 2),
                            pads=((1, 1), (0, 0)), data_format="NCX") for op in OP_NAMES}


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_compile_python_api_fullgraph(op, device):
    fn = _api_function(op)
    x, dy = API_PROBLEMS[op].tensors(dtype=torch.float32, seed=12, device=device)
    counter = CountingBackend()
    got = torch.compile(fn, backend=counter, fullgraph=True)(x, dy)
    torch.testing.assert_close(got, fn(x, dy), rtol=0, atol=0)
    torch.testing.assert_close(got, op_function(API_PROBLEMS[op])(x, dy), rtol=0, atol=0)
    assert counter.count == 1 and len(op_targets(counter.graphs[0])) == 1


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_compile_python_api_shape_tensor_with_graph_break(op, device):
    """A shape given as an integer tensor (the spec's s32 input) still gives the eager result
    under torch.compile without fullgraph."""
    fn = _api_function(op, shape_as_tensor=True)
    x, dy = API_PROBLEMS[op].tensors(dtype=torch.float32, seed=13, device=device)
    got = torch.compile(fn, backend="eager")(x, dy)
    torch.testing.assert_close(got, fn(x, dy), rtol=0, atol=0)


def test_compile_python_api_shape_tensor_fullgraph(device):
    """The shape's values become unbacked sizes; the checks on them turn into runtime asserts."""
    fn = _api_function("filters", shape_as_tensor=True)
    x, dy = API_PROBLEMS["filters"].tensors(dtype=torch.float32, seed=14, device=device)
    got = torch.compile(fn, backend="eager", fullgraph=True)(x, dy)
    torch.testing.assert_close(got, fn(x, dy), rtol=0, atol=0)


def test_compile_shape_tensor_with_bad_values_raises_at_run_time(device):
    """Values unknown at trace time are checked by runtime asserts: a wrong channel entry still raises."""
    problem = API_PROBLEMS["filters"]
    x, dy = problem.tensors(dtype=torch.float32, seed=16, device=device)

    def fn(x, dy, shape):
        return torch_convgrad.conv_backprop_filters(x, dy, shape, strides=2, pads_begin=1, pads_end=0, groups=2,
                                                    data_format="NCX", filter_format="OIX")

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    good = torch.tensor(problem.shape())
    torch.testing.assert_close(compiled(x, dy, good), fn(x, dy, good.tolist()), rtol=0, atol=0)
    bad = good.clone()
    bad[0] += 1  # O entry no longer matches output_delta's channels
    with pytest.raises(RuntimeError):
        compiled(x, dy, bad)


def test_export_python_api_shape_tensor(device):
    fn = _api_function("filters", shape_as_tensor=True)

    class Module(torch.nn.Module):
        def forward(self, x, dy):
            return fn(x, dy)

    x, dy = API_PROBLEMS["filters"].tensors(dtype=torch.float32, seed=15, device=device)
    ep = export(Module(), (x, dy))
    torch.testing.assert_close(ep.module()(x, dy), fn(x, dy), rtol=0, atol=0)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_compile_vmap_fullgraph(op, device):
    """vmap over the op inside a fullgraph-compiled function: the vmap rule is traced into a
    graph with a single op call."""
    problem = COMPILE_PROBLEMS[[p.op for p in COMPILE_PROBLEMS].index(op)]
    fn = op_function(problem)
    pairs = [problem.tensors(dtype=torch.float32, seed=20 + i, device=device) for i in range(4)]
    xs, dys = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    seen = []

    def forward_compiler(gm, example_inputs):
        seen.extend(op_targets(gm))
        return make_boxed_func(gm.forward)

    compiled = torch.compile(torch.func.vmap(fn), fullgraph=True, backend=aot_autograd(fw_compiler=forward_compiler))
    got = compiled(xs, dys)
    assert got.shape == (4, *problem.shape())
    torch.testing.assert_close(got, torch.stack([fn(x, dy) for x, dy in pairs]), rtol=1e-5, atol=1e-5)
    assert seen == [op_packet(op).default], seen
