// The op schemas, declared once; kernels live in one file per dispatch key
// (cpu/, cuda/, meta/, composite/, autocast/, autograd/); vmap rules and
// DTensor sharding strategies are registered in Python (torch_convgrad/).
#include <Python.h>
#include <torch/library.h>

extern "C" {
// An empty `_C` module: importing it loads this library, whose static
// initialisers register the ops. No Python API is used, so the extension is
// built against the stable ABI (Py_LIMITED_API).
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

// The compiler that built this library, for diagnosing a mismatch with
// torch's C++ runtime (`python -m torch_convgrad` reports it).
const char* torch_convgrad_compiler() { return __VERSION__; }
}

// Attribute lists take exactly one value per spatial axis; None means the
// default (strides and dilations 1, pads 0, output_padding unchecked).
#define CONV_ATTRIBUTES \
  "int[]? strides=None, int[]? pads_begin=None, int[]? pads_end=None, int[]? dilations=None, str auto_pad=\"none\""

TORCH_LIBRARY(torch_convgrad, m) {
  m.def("conv_backprop_filters(Tensor input_forward, Tensor output_delta, SymInt[] filter_shape, " CONV_ATTRIBUTES
        ", int groups=1, str data_format=\"NXC\", str filter_format=\"XIO\") -> Tensor");
  m.def("conv_backprop_weights(Tensor src, Tensor diff_dst, SymInt[] weights_shape, " CONV_ATTRIBUTES
        ", int groups=1, str data_format=\"NXC\", str weights_format=\"XIO\") -> Tensor");
  m.def("conv_transpose_backprop_filters(Tensor input_forward, Tensor output_delta, SymInt[] filter_shape, "
        CONV_ATTRIBUTES ", int[]? output_padding=None, int groups=1, str data_format=\"NXC\", "
        "str filter_format=\"XIO\") -> Tensor");
  // Backward formulas (gradients w.r.t. input_forward and output_delta).
  m.def("conv_backprop_filters_backward(Tensor grad, Tensor input_forward, Tensor output_delta, "
        "SymInt[] filter_shape, " CONV_ATTRIBUTES ", int groups=1, str data_format=\"NXC\", "
        "str filter_format=\"XIO\", bool[2] output_mask=[True, True]) -> (Tensor, Tensor)");
  m.def("conv_transpose_backprop_filters_backward(Tensor grad, Tensor input_forward, Tensor output_delta, "
        "SymInt[] filter_shape, " CONV_ATTRIBUTES ", int[]? output_padding=None, int groups=1, "
        "str data_format=\"NXC\", str filter_format=\"XIO\", bool[2] output_mask=[True, True]) -> (Tensor, Tensor)");
  // Internal: the layout copy of the aten_channels_last and aten_channels_first
  // algorithms. (B, R, S) matrices -> a new contiguous (B, S, R) tensor holding
  // matrices.transpose(1, 2); on CUDA one tiled transposition where S is unit-strided.
  m.def("_batched_transpose(Tensor matrices) -> Tensor");
}
