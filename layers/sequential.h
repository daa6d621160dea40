/// @file
/// Sequential: a chain of modules, as torch.nn.Sequential. Children are named "0", "1", ... so a
/// state dict reads "3.weight" exactly as PyTorch's.
#pragma once

#include <concepts>
#include <initializer_list>
#include <memory>
#include <type_traits>

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// Runs its modules in order, as torch.nn.Sequential; differentiable as they are.
class Sequential : public Cloneable<Sequential> {
 public:
  /// An empty chain, whose forward returns its input.
  Sequential() = default;
  /// The modules in order, as shared_ptr (ef::Error on a null one).
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  /// Sequential(Conv2d(1, 8, 3), ReLU(), Flatten()): modules by value (moved into shared
  /// ownership) or as shared_ptr.
  template <typename... Ms>
  requires(sizeof...(Ms) > 0 && !(sizeof...(Ms) == 1 && (std::same_as<std::remove_cvref_t<Ms>, Sequential> &&
                                                         ...))) explicit Sequential(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  /// Appends a module named after its position (ef::Error when null).
  void push_back(std::shared_ptr<Module> module);
  /// Appends a layer given by value, moved or copied into shared ownership (a copy shares the
  /// original's tensors and children).
  template <typename M>
  requires std::derived_from<std::remove_cvref_t<M>, Module>
  void push_back(M&& module) { push_back(std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module))); }

  Tensor forward(const Tensor& x) override;  ///< each module's output is the next one's input
  std::string name() const override { return "Sequential"; }

  size_t size() const { return named_children().size(); }  ///< the number of modules
  /// The module at position i (named "i"); ef::Error when i >= size().
  const std::shared_ptr<Module>& operator[](size_t i) const;
};

}  // namespace evenflow::nn
