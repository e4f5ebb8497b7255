// Tensor: a strided view (shape, strides in elements, offset) over a shared Buffer, plus autograd
// state. Copying a Tensor copies a handle; views share the Buffer and its version counter.
// Invariant: shape and strides have the same rank; offset + extent stays inside the buffer.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "keel/buffer.h"
#include "keel/dtype.h"

namespace keel {

using Shape = std::vector<int64_t>;

class Node;
class Tensor;
using TensorHook = std::function<Tensor(const Tensor&)>;

struct TensorImpl {
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::Float32;
  std::shared_ptr<Buffer> buffer;
  // Never reused in a process; unique per TensorImpl except that autograd's saved aliases share
  // the id of the tensor they save (same buffer and geometry: See Note [Saved tensors]).
  uint64_t id = 0;
  // autograd
  bool requiresGrad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> gradFn;  // null for leaves
  int outputNr = 0;              // which output of gradFn this is
  std::vector<TensorHook> leafHooks;
  std::string name;  // parameter name, when it is one
};

std::string shapeStr(const Shape& s);
int64_t shapeNumel(const Shape& s);
Shape contiguousStrides(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. All values are written through ops (so observers see them) except empty().
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32, Device device = {});
  static Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = {});
  static Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = {});
  static Tensor full(const Shape& shape, double value, DType dtype = DType::Float32,
                     Device device = {});
  // Copies host values (converted to dtype) into a new tensor.
  template <typename T>
  static Tensor fromVector(const std::vector<T>& values, const Shape& shape,
                           DType dtype = DTypeOf<T>::value, Device device = {});
  static Tensor scalar(double value, DType dtype = DType::Float32, Device device = {});
  // A view with explicit geometry over an existing buffer.
  static Tensor makeView(const Tensor& base, Shape shape, Shape strides, int64_t offset);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& implPtr() const { return impl_; }

  const Shape& shape() const { return d().shape; }
  const Shape& strides() const { return d().strides; }
  int64_t offset() const { return d().offset; }
  DType dtype() const { return d().dtype; }
  Device device() const { return d().buffer->device(); }
  int64_t dim() const { return int64_t(d().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shapeNumel(d().shape); }
  size_t nbytes() const { return size_t(numel()) * dtypeSize(dtype()); }
  bool isContiguous() const;
  uint64_t id() const { return d().id; }
  uint64_t version() const { return d().buffer->version(); }
  void bumpVersion() const { d().buffer->bumpVersion(); }
  const std::shared_ptr<Buffer>& buffer() const { return d().buffer; }

  // Address of element [0,...,0] (buffer start + offset).
  void* data() const {
    return static_cast<char*>(d().buffer->data()) + d().offset * int64_t(dtypeSize(dtype()));
  }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data());
  }

  // Autograd.
  bool requiresGrad() const { return impl_ && impl_->requiresGrad; }
  Tensor& setRequiresGrad(bool r = true);
  Tensor grad() const;
  void setGrad(const Tensor& g) const;
  const std::shared_ptr<Node>& gradFn() const { return d().gradFn; }
  bool isLeaf() const { return d().gradFn == nullptr; }
  // A tensor sharing storage with this one, outside the graph.
  Tensor detach() const;
  // Runs the backward pass from this tensor (a scalar unless grad is given).
  void backward(const Tensor& grad = {}, bool retainGraph = false) const;
  // Hook called with this tensor's gradient during backward; may return a replacement (or an
  // undefined Tensor to keep the gradient as it is).
  void registerHook(TensorHook hook) const;

  const std::string& name() const { return d().name; }
  void setName(std::string n) const { d().name = std::move(n); }

  // Host read-back (any dtype converted to T); contiguous row-major order.
  template <typename T>
  std::vector<T> toVector() const;
  double item() const;

  Tensor to(Device d) const;
  Tensor contiguous() const;
  std::string toString(int64_t maxElements = 16) const;

 private:
  // The tensor's state; a keel::Error for an undefined tensor (default-constructed, moved from,
  // or a grad() before backward), whose accessors dereferenced null (a segfault).
  TensorImpl& d() const {
    if (!impl_) [[unlikely]]
      undefinedTensor();
    return *impl_;
  }
  [[noreturn]] static void undefinedTensor();

  std::shared_ptr<TensorImpl> impl_;
};

// t's values in host memory, read without running an op (observers see none, and an observer may
// call it while it handles an op): a host tensor is returned as it is (any layout); a device
// tensor comes back as a contiguous cpu tensor, after the work queued on its device (a wait).
// What toVector(), item() and the capture read device tensors through.
Tensor hostCopy(const Tensor& t);

// Creates a tensor with fresh contiguous storage (values uninitialised).
Tensor makeTensor(const Shape& shape, DType dtype, Device device);
// Copies raw host values of type dtype into t (t contiguous, host).
void copyFromHost(const Tensor& t, const void* src, DType srcType, int64_t n);

}  // namespace keel
