// A plan's one Triton launch, pinned: what a repeated plain eager call of an op runs in place of
// the Python between its entry check and the driver (lowering/triton/_native.py builds this file
// and says when it is used; _launch.py's "Pinned launches" says what the caller has checked).
//
// A Pinned holds one compiled binary's launch: its CUfunction, grid, block, shared memory and launch
// attributes, and its kernel parameters packed once (8 bytes a parameter, each value at the start
// of its slot, as the driver reads it) with the slots that take the call's tensor addresses. Per call:
//
//   fire(t0, ..., tn)              -> True (launched) / False (nothing launched: use the runner)
//   fire.new(t0, ..., tn-1, lse)   -> (out, lse.detach()) with tn (out) allocated here, or None
//
// Both decline (launch nothing) unless ready() holds (the fast-launch switch and Triton's hooks,
// read in Python), the current CUDA device is the pinned one, and every address the binary was
// specialised on is 16-byte aligned. The launch goes to the current stream of that device, as
// Triton's own launcher does (cuLaunchKernelEx, same attributes).

#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "cuda.h"  // Triton's copy (triton/backends/nvidia/include): types only, the driver is dlopen'ed

namespace {

constexpr int kMaxTensors = 16;   // the pinned tensors, in kernel order (out last)
constexpr int kMaxParams = 256;   // kernel parameters, scratch pointers included

typedef CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*GetErrorString)(CUresult, const char**);
typedef CUresult (*CtxGetCurrent)(CUcontext*);
typedef CUresult (*CtxSetCurrent)(CUcontext);
typedef CUresult (*DeviceGet)(CUdevice*, int);
typedef CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);

struct Driver {
  LaunchKernelEx launch = nullptr;
  GetErrorString error_string = nullptr;
  CtxGetCurrent ctx_get = nullptr;
  CtxSetCurrent ctx_set = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_retain = nullptr;
};
Driver driver;

bool load_driver() {
  if (driver.launch) return true;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!lib) return false;
  Driver d;
  d.launch = (LaunchKernelEx)dlsym(lib, "cuLaunchKernelEx");
  d.error_string = (GetErrorString)dlsym(lib, "cuGetErrorString");
  d.ctx_get = (CtxGetCurrent)dlsym(lib, "cuCtxGetCurrent");
  d.ctx_set = (CtxSetCurrent)dlsym(lib, "cuCtxSetCurrent");
  d.device_get = (DeviceGet)dlsym(lib, "cuDeviceGet");
  d.primary_retain = (PrimaryCtxRetain)dlsym(lib, "cuDevicePrimaryCtxRetain");
  if (!d.launch || !d.error_string || !d.ctx_get || !d.ctx_set || !d.device_get || !d.primary_retain) return false;
  driver = d;
  return true;
}

struct Pinned {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* ready;  // () -> bool, read per call
  PyObject* keep;   // what owns the binary (its module stays loaded while this launch exists)
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  int pdl;
  int cooperative;
  int device;
  int tensors;                                // how many the launch takes (out last)
  std::vector<uint64_t>* params;              // packed values, pointer slots 0
  std::vector<std::pair<int, int>>* slots;    // (parameter, tensor) pairs: the tensor's address goes there
  std::vector<int>* aligned;                  // tensors whose address must be a multiple of 16
  std::vector<int64_t>* out_sizes;            // fire.new's output
  c10::ScalarType out_dtype;
};

PyObject* raise_cuda(CUresult code) {
  const char* text = nullptr;
  driver.error_string(code, &text);
  PyErr_Format(PyExc_RuntimeError, "torch_paged_attn pinned launch: CUDA error %d: %s", (int)code,
               text ? text : "unknown");
  return nullptr;
}

// 1: launched; 0: declined; -1: a Python error is set. ``out`` null: the last of args is out.
int fire_impl(Pinned* self, PyObject* const* args, at::Tensor* out) {
  PyObject* ok = PyObject_CallNoArgs(self->ready);
  if (!ok) return -1;
  int ready = PyObject_IsTrue(ok);
  Py_DECREF(ok);
  if (ready <= 0) return ready;
  uint64_t address[kMaxTensors];
  int last = self->tensors - 1;
  int given = out ? last : self->tensors;
  for (int i = 0; i < given; ++i) {
    if (!THPVariable_Check(args[i])) return 0;
    address[i] = reinterpret_cast<uint64_t>(THPVariable_Unpack(args[i]).data_ptr());
  }
  auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::Device device = impl->getDevice();
  if (device.index() != self->device) return 0;
  for (int i : *self->aligned)
    if (i < given && (address[i] & 15)) return 0;
  if (out) {
    *out = at::empty(*self->out_sizes, at::TensorOptions().dtype(self->out_dtype).device(device));
    address[last] = reinterpret_cast<uint64_t>(out->data_ptr());
    if (address[last] & 15) return 0;  // (allocations are 512-byte aligned)
  }
  size_t n = self->params->size();
  uint64_t values[kMaxParams];
  void* pointers[kMaxParams];
  std::memcpy(values, self->params->data(), n * sizeof(uint64_t));
  for (auto& [param, tensor] : *self->slots) values[param] = address[tensor];
  for (size_t i = 0; i < n; ++i) pointers[i] = &values[i];
  CUstream stream = reinterpret_cast<CUstream>(impl->getStream(device).native_handle());

  CUlaunchAttribute attributes[2];
  unsigned count = 0;
  if (self->pdl) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[count].value.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (self->cooperative) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attributes[count].value.cooperative = 1;
    ++count;
  }
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = self->grid[0];
  config.gridDimY = self->grid[1];
  config.gridDimZ = self->grid[2];
  config.blockDimX = self->threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = self->shared;
  config.hStream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  if ((uint64_t)config.gridDimX * config.gridDimY * config.gridDimZ == 0) return 1;  // as Triton: nothing to run
  CUresult code;
  Py_BEGIN_ALLOW_THREADS;
  CUcontext context = nullptr;
  code = driver.ctx_get(&context);
  if (code == CUDA_SUCCESS && !context) {  // a thread that has not used CUDA yet
    CUdevice handle;
    code = driver.device_get(&handle, self->device);
    if (code == CUDA_SUCCESS) code = driver.primary_retain(&context, handle);
    if (code == CUDA_SUCCESS) code = driver.ctx_set(context);
  }
  if (code == CUDA_SUCCESS) code = driver.launch(&config, self->function, pointers, nullptr);
  Py_END_ALLOW_THREADS;
  if (code != CUDA_SUCCESS) {
    raise_cuda(code);
    return -1;
  }
  return 1;
}

PyObject* pinned_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  int tensors = reinterpret_cast<Pinned*>(callable)->tensors;
  if (nargs != tensors || kwnames) {
    PyErr_Format(PyExc_TypeError, "this pinned launch takes %d tensors", tensors);
    return nullptr;
  }
  HANDLE_TH_ERRORS  // torch's errors as torch raises them (an allocation's OutOfMemoryError, say)
  int result = fire_impl(reinterpret_cast<Pinned*>(callable), args, nullptr);
  if (result < 0) return nullptr;
  return PyBool_FromLong(result);
  END_HANDLE_TH_ERRORS
}

PyObject* pinned_new(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int tensors = reinterpret_cast<Pinned*>(self)->tensors;
  if (nargs != tensors) {
    PyErr_Format(PyExc_TypeError, "new takes %d tensors and the lse", tensors - 1);
    return nullptr;
  }
  if (!THPVariable_Check(args[tensors - 1])) {
    PyErr_SetString(PyExc_TypeError, "new: the lse is a tensor");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  at::Tensor out;
  int result = fire_impl(reinterpret_cast<Pinned*>(self), args, &out);
  if (result < 0) return nullptr;
  if (result == 0) Py_RETURN_NONE;
  at::Tensor lse = THPVariable_Unpack(args[tensors - 1]).detach();
  PyObject* first = THPVariable_Wrap(std::move(out));
  if (!first) return nullptr;
  PyObject* second = THPVariable_Wrap(std::move(lse));
  if (!second) {
    Py_DECREF(first);
    return nullptr;
  }
  PyObject* pair = PyTuple_Pack(2, first, second);
  Py_DECREF(first);
  Py_DECREF(second);
  return pair;
  END_HANDLE_TH_ERRORS
}

void pinned_dealloc(PyObject* object) {
  Pinned* self = reinterpret_cast<Pinned*>(object);
  Py_XDECREF(self->ready);
  Py_XDECREF(self->keep);
  delete self->params;
  delete self->slots;
  delete self->aligned;
  delete self->out_sizes;
  Py_TYPE(object)->tp_free(object);
}

bool int_list(PyObject* sequence, std::vector<int64_t>* into) {
  PyObject* items = PySequence_Fast(sequence, "a sequence of ints");
  if (!items) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(items);
      return false;
    }
    into->push_back(v);
  }
  Py_DECREF(items);
  return true;
}

// Pinned(ready, function, grid, threads, shared, pdl, cooperative, device, tensors, params: bytes
//        (8 a parameter), slots: (parameter, tensor, ...) flattened, aligned: tensor indices,
//        out_sizes, out_like: a tensor of fire.new's output dtype, keep: the binary's owner)
PyObject* pinned_create(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *ready, *grid, *params, *slots, *aligned, *out_sizes, *out_like, *keep;
  unsigned long long function;
  unsigned threads, shared;
  int pdl, cooperative, device, tensors;
  if (!PyArg_ParseTuple(args, "OKOIIppiiSOOOOO", &ready, &function, &grid, &threads, &shared, &pdl, &cooperative,
                        &device, &tensors, &params, &slots, &aligned, &out_sizes, &out_like, &keep))
    return nullptr;
  if (tensors < 1 || tensors > kMaxTensors) {
    PyErr_Format(PyExc_ValueError, "tensors: 1 to %d", kMaxTensors);
    return nullptr;
  }
  if (!THPVariable_Check(out_like)) {
    PyErr_SetString(PyExc_TypeError, "out_like is a tensor");
    return nullptr;
  }
  Py_ssize_t bytes = PyBytes_GET_SIZE(params);
  if (bytes % 8 || bytes / 8 > kMaxParams) {
    PyErr_Format(PyExc_ValueError, "params: 8 bytes a parameter, at most %d", kMaxParams);
    return nullptr;
  }
  std::vector<int64_t> g, s, a, o;
  if (!int_list(grid, &g) || !int_list(slots, &s) || !int_list(aligned, &a) || !int_list(out_sizes, &o)) return nullptr;
  if (g.size() != 3 || s.size() % 2) {
    PyErr_SetString(PyExc_ValueError, "grid: 3 ints; slots: (parameter, tensor) pairs");
    return nullptr;
  }
  for (size_t i = 0; i < s.size(); i += 2)
    if (s[i] < 0 || s[i] >= bytes / 8 || s[i + 1] < 0 || s[i + 1] >= tensors) {
      PyErr_SetString(PyExc_ValueError, "slots: a parameter or tensor index out of range");
      return nullptr;
    }
  for (int64_t i : a)
    if (i < 0 || i >= tensors) {
      PyErr_SetString(PyExc_ValueError, "aligned: a tensor index out of range");
      return nullptr;
    }
  if (!load_driver()) {
    PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 or its launch functions not found");
    return nullptr;
  }
  Pinned* self = reinterpret_cast<Pinned*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = pinned_call;
  Py_INCREF(ready);
  self->ready = ready;
  Py_INCREF(keep);
  self->keep = keep;
  self->function = reinterpret_cast<CUfunction>(function);
  for (int i = 0; i < 3; ++i) self->grid[i] = (unsigned)g[i];
  self->threads = threads;
  self->shared = shared;
  self->pdl = pdl;
  self->cooperative = cooperative;
  self->device = device;
  self->tensors = tensors;
  self->params = new std::vector<uint64_t>(bytes / 8);
  std::memcpy(self->params->data(), PyBytes_AS_STRING(params), bytes);
  self->slots = new std::vector<std::pair<int, int>>();
  for (size_t i = 0; i < s.size(); i += 2) self->slots->emplace_back((int)s[i], (int)s[i + 1]);
  self->aligned = new std::vector<int>(a.begin(), a.end());
  self->out_sizes = new std::vector<int64_t>(o);
  self->out_dtype = THPVariable_Unpack(out_like).scalar_type();
  return reinterpret_cast<PyObject*>(self);
}

PyMethodDef pinned_methods[] = {
    {"new", (PyCFunction)(void (*)(void))pinned_new, METH_FASTCALL,
     "new(t0, ..., t5, lse) -> (out, lse.detach()) or None: out allocated, then launched"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject PinnedType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tpa_pinned", "pinned Triton launches", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__tpa_pinned(void) {
  PinnedType.tp_name = "_tpa_pinned.Pinned";
  PinnedType.tp_basicsize = sizeof(Pinned);
  PinnedType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  PinnedType.tp_vectorcall_offset = offsetof(Pinned, vectorcall);
  PinnedType.tp_call = PyVectorcall_Call;
  PinnedType.tp_new = pinned_create;
  PinnedType.tp_dealloc = pinned_dealloc;
  PinnedType.tp_methods = pinned_methods;
  PinnedType.tp_doc = "A plan's one Triton launch, pinned (see the module's source)";
  if (PyType_Ready(&PinnedType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (!m) return nullptr;
  Py_INCREF(&PinnedType);
  if (PyModule_AddObject(m, "Pinned", reinterpret_cast<PyObject*>(&PinnedType)) < 0) {
    Py_DECREF(&PinnedType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
