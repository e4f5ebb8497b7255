// Copies and factories of the cuda backend: strided copies (contiguous, concat, slice_backward,
// copy_to between host and device or two devices), cast, fill and arange, and the geometry
// helpers of cuda_util.cuh. Copies move bytes only, so they are exact for every dtype.
#include <cstring>
#include <vector>

#include "cuda_util.cuh"
#include "kernel_util.h"
#include "kernels.h"
#include "shape_util.h"

namespace keel::cuda {

// A geometry from explicit shape and strides (also the destination side of concat and
// slice_backward).
Geom geomFrom(const Shape& shape, const Shape& strides) {
  KEEL_CHECK(shape.size() <= size_t(kMaxDims), "cuda kernels take at most ", kMaxDims,
             " dims, got shape ", shapeStr(shape));
  Geom g;
  g.rank = int(shape.size());
  int64_t expect = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.shape[d] = shape[size_t(d)];
    g.stride[d] = strides[size_t(d)];
    if (g.shape[d] != 1 && g.stride[d] != expect) g.contiguous = false;
    expect *= g.shape[d];
  }
  return g;
}

Geom geomAs(const Tensor& t, const Shape& shape) {
  KEEL_CHECK(shape.size() <= size_t(kMaxDims), "cuda kernels take at most ", kMaxDims,
             " dims, got shape ", shapeStr(shape));
  return geomFrom(shape, broadcastStrides(t, shape));
}

Geom geomOf(const Tensor& t) {
  return geomAs(t, t.shape());
}

Geom packDims(const KernelCtx& c, const std::vector<std::pair<int64_t, int64_t>>& dims) {
  Geom g;
  g.contiguous = false;
  g.rank = 0;
  for (auto [size, stride] : dims) {
    if (size == 1) continue;
    if (g.rank > 0 && g.stride[g.rank - 1] == stride * size) {
      g.shape[g.rank - 1] *= size;
      g.stride[g.rank - 1] = stride;
      continue;
    }
    KEEL_CHECK(g.rank < kMaxDims, "op '", c.op.name, "': cuda kernels take at most ", kMaxDims,
               " dims after merging");
    g.shape[g.rank] = size;
    g.stride[g.rank] = stride;
    ++g.rank;
  }
  return g;
}

namespace {

// dst[dg.offset(i)] = src[sg.offset(i)] for every element of the shape both describe.
template <typename E>
__global__ void copyKernel(E* dst, Geom dg, const E* src, Geom sg, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[dg.offset(i)] = src[sg.offset(i)];
}

template <typename D, typename S>
__device__ __forceinline__ D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    return readAs<double>(s) != 0.0;
  } else if constexpr (kIsFloatD<D>) {  // as the host: 16-bit through float, ints through double
    if constexpr (kIsFloatD<S> && !std::is_same_v<S, double>)
      return storeAs<D>(readAs<float>(s));
    else
      return storeAs<D>(readAs<double>(s));
  } else if constexpr (kIsFloatD<S>) {
    return storeAs<D>(readAs<double>(s));  // truncate, saturate, NaN -> 0
  } else {                                 // integer or bool -> integer, saturating
    int64_t v = int64_t(s);
    if constexpr (sizeof(D) < 8) {
      v = v < -2147483648LL ? -2147483648LL : v;
      v = v > 2147483647LL ? 2147483647LL : v;
    }
    return D(v);
  }
}

template <typename D, typename S>
__global__ void castKernel(D* out, const S* x, Geom xg, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = convert<D>(x[xg.offset(i)]);
}

template <typename T>
__global__ void fillKernel(T* out, T v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = v;
}

template <typename T>
__global__ void arangeKernel(T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = storeAs<T>(double(i));
}

// The host's value of a double as T, for fill (the same conversion as every store).
template <typename T>
T hostValue(double v) {
  if constexpr (std::is_same_v<T, DHalf>) {
    return DHalf{Half::fromFloat(float(v))};
  } else if constexpr (std::is_same_v<T, DBFloat16>) {
    return DBFloat16{BFloat16::fromFloat(float(v))};
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_floating_point_v<T>) {
    return T(v);
  } else {
    return saturatingInt<T>(v);
  }
}

}  // namespace

// Launches the copy by element width (bytes only move, so the dtype does not matter).
void copyStrided(const KernelCtx& c, cudaStream_t s, void* dst, const Geom& dg, const void* src,
                 const Geom& sg, int64_t n, size_t elem) {
  if (n == 0) return;
  const Launch1D l = launch1D(n);
  auto go = [&]<typename E>() {
    launch(copyKernel<E>, l.blocks, l.threads, 0, s, static_cast<E*>(dst), dg,
           static_cast<const E*>(src), sg, n);
  };
  visitWidth(elem, go);
  checkLaunch(c, "copyKernel");
}

void kContiguous(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  DeviceCtx& d = deviceCtx(c);
  copyStrided(c, d.stream, out.data(), geomOf(out), x.data(), geomOf(x), out.numel(),
              dtypeSize(x.dtype()));
}

// Note [cuda copy_to]: the dispatcher runs this kernel for every copy_to with a cuda side
// (dispatch.cpp). Host to device: the host side is made contiguous on the host (an op there),
// then its bytes go through pinned staging (runtime.cpp); device to host: the device side is made
// contiguous on the device, then copied back, which waits for the device (a host copy is a
// synchronisation point). Between two devices: cudaMemcpyPeerAsync after the source's stream.
void kCopyTo(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  if (x.nbytes() == 0) return;
  if (x.device().isHost()) {
    if (x.isContiguous()) {
      copyBytes(out.device().index, out.data(), true, x.data(), false, x.nbytes());
    } else {  // gathered on the host first (rare: host data is usually contiguous)
      const size_t elem = dtypeSize(x.dtype());
      std::vector<char> h(x.nbytes());
      for (int64_t i = 0; i < x.numel(); ++i)
        std::memcpy(h.data() + size_t(i) * elem,
                    static_cast<const char*>(x.data()) +
                        stridedOffset(i, x.shape(), x.strides()) * int64_t(elem),
                    elem);
      copyBytes(out.device().index, out.data(), true, h.data(), false, h.size());
    }
    return;
  }
  DeviceCtx& src = deviceCtx(x.device().index);
  Tensor dx = x;
  if (!x.isContiguous()) {
    dx = makeTensor(x.shape(), x.dtype(), x.device());
    copyStrided(c, src.stream, dx.data(), geomOf(dx), x.data(), geomOf(x), x.numel(),
                dtypeSize(x.dtype()));
  }
  if (out.device().isHost()) {
    copyBytes(x.device().index, out.data(), false, dx.data(), true, x.nbytes());
    return;
  }
  if (out.device() == x.device()) {
    check(cudaMemcpyAsync(out.data(), dx.data(), x.nbytes(), cudaMemcpyDeviceToDevice, src.stream),
          "cudaMemcpyAsync", src.index);
    return;
  }
  // Another device: its stream waits for the source's, then copies peer to peer. An event is
  // recorded on a stream of the device it was current for at its creation: the first on the
  // source's, the second on the destination's (deviceCtx makes its device current).
  deviceCtx(src.index);  // the source current again (deviceCtx keeps the thread's record of it)
  cudaEvent_t ready = nullptr;
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", src.index);
  check(cudaEventRecord(ready, src.stream), "cudaEventRecord", src.index);
  DeviceCtx& dst = deviceCtx(out.device().index);
  check(cudaStreamWaitEvent(dst.stream, ready, 0), "cudaStreamWaitEvent", dst.index);
  check(cudaMemcpyPeerAsync(out.data(), dst.index, dx.data(), src.index, x.nbytes(), dst.stream),
        "cudaMemcpyPeerAsync", dst.index);
  cudaEventDestroy(ready);
  // dx may be a temporary freed into src's stream order: src waits for the copy.
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", dst.index);
  check(cudaEventRecord(ready, dst.stream), "cudaEventRecord", dst.index);
  check(cudaStreamWaitEvent(src.stream, ready, 0), "cudaStreamWaitEvent", src.index);
  cudaEventDestroy(ready);
}

void kConcat(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  const size_t elem = dtypeSize(out.dtype());
  DeviceCtx& ctx = deviceCtx(c);
  int64_t base = 0;
  for (const Tensor& t : c.inputs) {
    KEEL_CHECK(t.dtype() == out.dtype() && t.dim() == out.dim(), "op '", c.op.name,
               "': inputs must share dtype and rank");
    char* dst = static_cast<char*>(out.data()) + size_t(base * out.strides()[size_t(d)]) * elem;
    copyStrided(c, ctx.stream, dst, geomFrom(t.shape(), out.strides()), t.data(), geomOf(t),
                t.numel(), elem);
    base += t.size(d);
  }
}

void kSliceBackward(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &out = c.outputs[0];
  const auto [d, s0, len, step] = slicePlace(c);
  (void)len;
  DeviceCtx& ctx = deviceCtx(c);
  const size_t elem = dtypeSize(out.dtype());
  check(cudaMemsetAsync(out.data(), 0, out.nbytes(), ctx.stream), "cudaMemsetAsync", ctx.index);
  Shape st = out.strides();
  char* dst = static_cast<char*>(out.data()) + size_t(s0 * st[size_t(d)]) * elem;
  st[size_t(d)] *= step;
  copyStrided(c, ctx.stream, dst, geomFrom(g.shape(), st), g.data(), geomOf(g), g.numel(), elem);
}

void kCast(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  DeviceCtx& d = deviceCtx(c);
  const int64_t n = out.numel();
  if (n == 0) return;
  if (x.dtype() == out.dtype()) {
    copyStrided(c, d.stream, out.data(), geomOf(out), x.data(), geomOf(x), n, dtypeSize(x.dtype()));
    return;
  }
  const Launch1D l = launch1D(n);
  const Geom xg = geomOf(x);
  visit(x.dtype(), [&]<typename S>() {
    visit(out.dtype(), [&]<typename D>() {
      launch(castKernel<D, S>, l.blocks, l.threads, 0, d.stream, ptr<D>(out), ptr<S>(x), xg, n);
    });
  });
  checkLaunch(c, "castKernel");
}

void kFill(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const double value = c.attrs.getDouble("value");
  DeviceCtx& d = deviceCtx(c);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Launch1D l = launch1D(n);
  visit(out.dtype(), [&]<typename T>() {
    launch(fillKernel<T>, l.blocks, l.threads, 0, d.stream, ptr<T>(out), hostValue<T>(value), n);
  });
  checkLaunch(c, "fillKernel");
}

void kArange(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  DeviceCtx& d = deviceCtx(c);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Launch1D l = launch1D(n);
  visit(out.dtype(), [&]<typename T>() {
    launch(arangeKernel<T>, l.blocks, l.threads, 0, d.stream, ptr<T>(out), n);
  });
  checkLaunch(c, "arangeKernel");
}

}  // namespace keel::cuda
