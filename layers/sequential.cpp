// Sequential (see sequential.h).
#include "evenflow/layers/sequential.h"

namespace evenflow::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  EF_CHECK(module != nullptr, "Sequential: module ", size(), " is null");
  register_module(std::to_string(size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  EF_CHECK(x.defined(), "Sequential: the input is undefined");
  Tensor h = x;
  for (const auto& [name, m] : named_children()) h = m->forward(h);
  return h;
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  EF_CHECK(i < size(), "Sequential: index ", i, " is out of range for ", size(), " modules");
  return named_children()[i].second;
}

}  // namespace evenflow::nn
