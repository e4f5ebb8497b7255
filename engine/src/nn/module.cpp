// Module tree bookkeeping: registration, full paths, parameter listing, grad and training flags.
// Invariant: after any registerModule, every module and parameter tensor in the tree carries its
// full dotted path (parameters via Tensor::name()).
#include <utility>

#include "keel/error.h"
#include "keel/nn.h"

namespace keel::nn {
namespace {

// "Module 'blocks.1'", or "the root module" (whose path is empty: "Module ''" named nothing).
std::string moduleName(const std::string& path) {
  return path.empty() ? std::string("the root module") : "Module '" + path + "'";
}

std::string joinPath(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void checkLocalName(const std::string& name, const char* what) {
  KEEL_CHECK(!name.empty(), "Module: empty ", what, " name");
  KEEL_CHECK(name.find('.') == std::string::npos, "Module: ", what, " name '", name,
             "' must not contain '.'");
}

}  // namespace

// Note [Initialisation scopes]: a module's parameters are made (ops::normal, zeros, ones: step-0
// ops) in its constructor, before it is registered and knows its path. So a parent builds each
// child inside ScopeGuard(childName) (buildModule, ModuleList::build) and a module makes each
// parameter inside ScopeGuard(paramName) (registerParameter with a factory); the scopes nest, and
// a root module (GPT) opens an empty absolute scope first, so an initialisation op's scope is its
// parameter's full name, e.g. "blocks.0.attn.qkv.weight". Only scopes change: op order, values and
// so the recording's op sequence and every loss are the same as without.
Tensor Module::registerParameter(const std::string& name, const std::function<Tensor()>& make) {
  checkLocalName(name, "parameter");
  Tensor t;
  {
    ScopeGuard scope(name);
    t = make();
  }
  return registerParameter(name, std::move(t));
}

Tensor Module::registerParameter(const std::string& name, Tensor t) {
  checkLocalName(name, "parameter");
  KEEL_CHECK(t.defined(), moduleName(path_), ": parameter '", name, "' is undefined");
  for (auto& [n, _] : params_)
    KEEL_CHECK(n != name, moduleName(path_), ": parameter '", name, "' registered twice");
  for (auto& [n, _] : children_)
    KEEL_CHECK(n != name, moduleName(path_), ": parameter '", name, "' clashes with a child");
  if (!t.requiresGrad()) t.setRequiresGrad(true);
  t.setName(joinPath(path_, name));
  params_.emplace_back(name, t);
  return t;
}

void Module::addChild(const std::string& name, std::shared_ptr<Module> m) {
  checkLocalName(name, "module");
  KEEL_CHECK(m != nullptr, moduleName(path_), ": child '", name, "' is null");
  KEEL_CHECK(m.get() != this, moduleName(path_), ": cannot register a module inside itself");
  for (auto& [n, _] : children_)
    KEEL_CHECK(n != name, moduleName(path_), ": child '", name, "' registered twice");
  for (auto& [n, _] : params_)
    KEEL_CHECK(n != name, moduleName(path_), ": child '", name, "' clashes with a parameter");
  m->setPath(joinPath(path_, name));
  children_.emplace_back(name, std::move(m));
}

void Module::setPath(std::string path) {
  path_ = std::move(path);
  for (auto& [n, t] : params_) t.setName(joinPath(path_, n));
  for (auto& [n, c] : children_) c->setPath(joinPath(path_, n));
}

void Module::collect(std::vector<std::pair<std::string, Tensor>>& out) const {
  for (auto& [n, t] : params_) out.emplace_back(joinPath(path_, n), t);
  for (auto& [n, c] : children_) c->collect(out);
}

std::vector<std::pair<std::string, Tensor>> Module::namedParameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect(out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : namedParameters()) out.push_back(t);
  return out;
}

int64_t Module::numParameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

void Module::zeroGrad() {
  for (auto& t : parameters()) t.setGrad(Tensor());
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

}  // namespace keel::nn
