// Module: recursive names, state dicts, placement and deep copies, written once for every layer
// (Note [Tensors live in the base] in module.h).
#include "evenflow/layers/module.h"

#include <charconv>
#include <cmath>
#include <map>
#include <ostream>
#include <typeinfo>

namespace evenflow::nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// A new leaf over `value`'s storage, requiring grad if asked (a moved or copied parameter).
Tensor fresh_leaf(const Tensor& value, bool requires_grad) {
  Tensor t = value.detach();
  if (requires_grad) t.requires_grad_(true);
  return t;
}

// The tensor called `key` in a (possibly const) list, or null.
template <typename List>
auto find_in(List& list, const std::string& key) -> decltype(&list.front().second) {
  for (auto& [n, t] : list)
    if (n == key) return &t;
  return nullptr;
}

void check_name(const char* what, const std::string& name) {
  EF_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module: ", what, " name \"", name,
           "\" must be non-empty and contain no '.'");
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

}  // namespace

std::string Size2::str() const {
  return single ? std::to_string(h) : tuple_str();
}

std::string Size2::tuple_str() const {
  return util::py_tuple({h, w});
}

// --- Traversal ----------------------------------------------------------------------------------------

template <typename M, typename F>
void Module::visit(M& m, const std::string& prefix, F&& f) {
  f(prefix, m);
  for (const auto& [key, child] : m.children_) visit(static_cast<M&>(*child), join(prefix, key), f);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  visit(*this, "", [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : m.params_) out.emplace_back(join(prefix, name), t);
  });
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  visit(*this, "", [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : m.buffers_) out.emplace_back(join(prefix, name), t);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  visit(*this, "", [&](const std::string& prefix, Module& m) { out.emplace_back(prefix, &m); });
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

// The module owning the dotted `name` (M: Module or const Module) and, in *last, the name's last
// component.
template <typename M>
M& Module::owner_of(M& root, const std::string& name, std::string* last) {
  M* m = &root;
  size_t start = 0;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
    const std::string part = name.substr(start, dot - start);
    M* next = nullptr;
    for (const auto& [child_name, child] : m->children_)
      if (child_name == part) next = child.get();
    EF_CHECK(next != nullptr, root.name(), ": no child module \"", part, "\" on the way to \"", name, "\"");
    m = next;
    start = dot + 1;
  }
  *last = name.substr(start);
  return *m;
}

template <typename M>
auto Module::find_tensor(M& root, const std::string& name) -> decltype(&root.params_.front().second) {
  std::string last;
  M& m = owner_of(root, name, &last);
  if (auto* t = find_in(m.params_, last)) return t;
  return find_in(m.buffers_, last);
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  std::string last;
  const Module& owner = owner_of(*this, name, &last);
  for (const auto& [n, c] : owner.children_)
    if (n == last) return c;
  EF_ERROR(this->name(), ": no child module \"", name, "\"");
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  EF_CHECK(module != nullptr, this->name(), ".replace_child(\"", name, "\"): the module is null");
  std::string last;
  Module& owner = owner_of(*this, name, &last);
  for (auto& [n, c] : owner.children_) {
    if (n == last) {
      c = std::move(module);
      return;
    }
  }
  EF_ERROR(this->name(), ".replace_child: no child module \"", name, "\"");
}

Tensor Module::tensor(const std::string& name) const {
  const Tensor* t = find_tensor(*this, name);
  EF_CHECK(t != nullptr, this->name(), ": no parameter or buffer \"", name, "\"");
  return *t;
}

void Module::assign(const std::string& name, const Tensor& value) {
  Tensor* t = find_tensor(*this, name);
  EF_CHECK(t != nullptr, this->name(), ".assign: no parameter or buffer \"", name, "\"");
  EF_CHECK(value.defined(), this->name(), ".assign(\"", name, "\"): the tensor is undefined");
  EF_CHECK(value.shape() == t->shape() && value.dtype() == t->dtype(), this->name(), ".assign(\"", name,
           "\"): got shape ", shape_str(value.shape()), " ", dtype_name(value.dtype()), ", the module has ",
           shape_str(t->shape()), " ", dtype_name(t->dtype()));
  *t = value;
}

// --- State dict -------------------------------------------------------------------------------------------

NamedTensors Module::state_dict() const {
  NamedTensors out;
  visit(*this, "", [&](const std::string& prefix, const Module& m) {
    for (const NamedTensors* list : {&m.params_, &m.buffers_})
      for (const auto& [name, t] : *list) out.emplace_back(join(prefix, name), t.detach());
  });
  return out;
}

void Module::load_state_dict(const NamedTensors& sd, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, t] : sd) {
    EF_CHECK(given.emplace(key, &t).second, "load_state_dict: key \"", key, "\" appears twice in the state dict");
    EF_CHECK(t.defined(), "load_state_dict: \"", key, "\" is an undefined tensor");
  }
  // Check everything first, so that a failed load changes nothing.
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  std::vector<std::string> missing;
  for (const auto& [key, dst] : state_dict()) {
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(key);
      continue;
    }
    const Tensor& src = *it->second;
    EF_CHECK(src.shape() == dst.shape(), "load_state_dict: \"", key, "\" has shape ", shape_str(src.shape()),
             " in the state dict but ", shape_str(dst.shape()), " in the module");
    EF_CHECK(src.dtype() == dst.dtype(), "load_state_dict: \"", key, "\" is ", dtype_name(src.dtype()),
             " in the state dict but ", dtype_name(dst.dtype()), " in the module");
    copies.emplace_back(dst, &src);
    given.erase(it);
  }
  if (strict) {
    EF_CHECK(missing.empty(), "load_state_dict: missing key(s) in the state dict: ", quoted_list(missing));
    std::vector<std::string> unexpected;
    for (const auto& [key, t] : sd)
      if (given.count(key)) unexpected.push_back(key);
    EF_CHECK(unexpected.empty(), "load_state_dict: unexpected key(s) in the state dict: ", quoted_list(unexpected));
  }
  NoGradGuard no_grad;
  for (const auto& [dst, src] : copies) dst.copy_(src->to(dst.device()));
}

// --- Mode, placement, copies ----------------------------------------------------------------------------

Module& Module::train(bool on) {
  visit(*this, "", [on](const std::string&, Module& m) { m.training_ = on; });
  return *this;
}

Module& Module::to(const Device& device) {
  check_device(device);
  visit(*this, "", [&](const std::string&, Module& m) {
    for (auto& [name, t] : m.params_) {
      if (t.device() == device) continue;
      const Tensor grad = t.grad();
      t = fresh_leaf(t.detach().to(device), t.requires_grad());
      if (grad.defined()) t.set_grad(grad.detach().to(device));
    }
    for (auto& [name, t] : m.buffers_) t = t.detach().to(device);
  });
  return *this;
}

Module& Module::to(DType dtype) {
  EF_CHECK(is_floating(dtype), name(), ".to: dtype must be float32 or float64, got ", dtype_name(dtype));
  visit(*this, "", [&](const std::string&, Module& m) {
    for (auto& [name, t] : m.params_) {
      if (t.dtype() == dtype) continue;
      const Tensor grad = t.grad();
      t = fresh_leaf(t.detach().to(dtype), t.requires_grad());
      if (grad.defined()) t.set_grad(grad.detach().to(dtype));
    }
    for (auto& [name, t] : m.buffers_)
      if (is_floating(t.dtype())) t = t.detach().to(dtype);
  });
  return *this;
}

Module& Module::set_compute_dtype(DType compute) {
  EF_CHECK(compute == kFloat32 || compute == kBFloat16, name(), ".set_compute_dtype: float32 or bfloat16, got ",
           dtype_name(compute));
  visit(*this, "", [&](const std::string&, Module& m) { m.compute_dtype_ = compute; });
  return *this;
}

std::shared_ptr<Module> Module::clone() const {
  std::shared_ptr<Module> copy = clone_impl();
  const Module* made = copy.get();
  EF_CHECK(made != nullptr && typeid(*made) == typeid(*this), name(), "::clone_impl must copy-construct ", name(),
           " (derive it from Cloneable<", name(), ">)");
  for (auto& [name, t] : copy->params_) t = fresh_leaf(t.detach().clone(), t.requires_grad());
  for (auto& [name, t] : copy->buffers_) t = t.detach().clone();
  for (auto& [name, c] : copy->children_) c = c->clone();
  return copy;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor p : parameters()) {  // a handle: set_grad is not const
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      p.grad().detach().zero_();
    }
  }
}

// --- Registration and access ------------------------------------------------------------------------------

void Module::register_parameter(const std::string& name, Tensor value) {
  check_name("parameter", name);
  EF_CHECK(value.defined() && value.is_leaf(), this->name(), ": parameter \"", name,
           "\" must be a defined tensor that no op produced (a leaf; detach() makes one)");
  EF_CHECK(find_tensor(*this, name) == nullptr, this->name(), ": \"", name, "\" registered twice");
  if (!value.requires_grad()) value.requires_grad_(true);
  params_.emplace_back(name, std::move(value));
}

void Module::register_buffer(const std::string& name, Tensor value) {
  check_name("buffer", name);
  EF_CHECK(value.defined(), this->name(), ": buffer \"", name, "\" must be defined");
  EF_CHECK(find_tensor(*this, name) == nullptr, this->name(), ": \"", name, "\" registered twice");
  buffers_.emplace_back(name, std::move(value));
}

void Module::register_module(const std::string& name, std::shared_ptr<Module> module) {
  check_name("child module", name);
  EF_CHECK(module != nullptr, this->name(), ": child module \"", name, "\" is null");
  for (const auto& [n, c] : children_) EF_CHECK(n != name, this->name(), ": child module \"", name, "\" exists");
  children_.emplace_back(name, std::move(module));
}

const Tensor& Module::param(const std::string& name) const {
  const Tensor* t = find_in(params_, name);
  EF_ASSERT(t != nullptr, this->name(), " has no parameter \"", name, "\"");
  return *t;
}

const Tensor& Module::buffer(const std::string& name) const {
  const Tensor* t = find_in(buffers_, name);
  EF_ASSERT(t != nullptr, this->name(), " has no buffer \"", name, "\"");
  return *t;
}

Tensor Module::optional_param(const std::string& name) const {
  const Tensor* t = find_in(params_, name);
  return t != nullptr ? *t : Tensor();
}

void Module::check_input_matches_params(const Tensor& x) const {
  EF_CHECK(x.defined(), name(), ": the input is undefined");
  if (params_.empty()) return;
  const Tensor& p = params_.front().second;
  EF_CHECK(x.dtype() == p.dtype() && x.device() == p.device(), name(), ": input is ", dtype_name(x.dtype()), " on ",
           x.device().str(), " but the parameters are ", dtype_name(p.dtype()), " on ", p.device().str(),
           " (convert the input or call .to on the module)");
}

// --- Printing ----------------------------------------------------------------------------------------------

void Module::repr_into(std::string& out, int indent) const {
  out += name() + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    const std::string pad(static_cast<size_t>(indent + 2), ' ');
    for (const auto& [n, c] : children_) {
      out += pad + "(" + n + "): ";
      c->repr_into(out, indent + 2);
      out += "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ');
  }
  out += ")";
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

std::ostream& operator<<(std::ostream& os, const Module& m) {
  return os << m.repr();
}

// --- Shared argument checks ------------------------------------------------------------------------------

namespace util {

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip, as Python's repr, then its layout: fixed notation for
  // exponents in [-4, 16), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e_at = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e_at + 1));
  std::string mantissa = sci.substr(0, e_at);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits = mantissa.substr(0, 1) + (mantissa.size() > 2 ? mantissa.substr(2) : "");
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    const std::string e = std::to_string(std::abs(exp10));
    out = mantissa + "e" + (exp10 < 0 ? "-" : "+") + (e.size() < 2 ? "0" : "") + e;
  } else if (exp10 < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_digits = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_digits) {
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return (negative ? "-" : "") + out;
}

std::string py_tuple(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

void check_positive(const char* layer, const char* what, int64_t value) {
  EF_CHECK(value > 0, layer, ": ", what, " must be positive, got ", value);
}

void check_positive(const char* layer, const char* what, const Size2& value) {
  EF_CHECK(value.h > 0 && value.w > 0, layer, ": ", what, " must be positive, got ", value.str());
}

void check_non_negative(const char* layer, const char* what, const Size2& value) {
  EF_CHECK(value.h >= 0 && value.w >= 0, layer, ": ", what, " must be non-negative, got ", value.str());
}

void check_input_dims(const char* layer, const Tensor& x, int64_t min_dim, int64_t max_dim) {
  EF_CHECK(x.defined(), layer, ": the input is undefined");
  if (min_dim == max_dim) {
    EF_CHECK(x.dim() == min_dim, layer, ": expected a ", min_dim, "-d input, got shape ", shape_str(x.shape()));
  } else if (max_dim < 0) {
    EF_CHECK(x.dim() >= min_dim, layer, ": expected an input with at least ", min_dim, " dims, got shape ",
             shape_str(x.shape()));
  } else {
    EF_CHECK(x.dim() >= min_dim && x.dim() <= max_dim, layer, ": expected a ", min_dim, "-d to ", max_dim,
             "-d input, got shape ", shape_str(x.shape()));
  }
}

}  // namespace util

}  // namespace evenflow::nn
