// The modules of the PyTorch fixture (tests/fixtures/layers.json), by case name, built exactly as
// scripts/make_layer_fixtures.py builds them (LAYER_CASES there).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "evenflow/layers/layers.h"

namespace evenflow::testing {

using ModuleFactory = std::function<std::shared_ptr<nn::Module>(const nn::ModuleOptions&)>;

inline const std::map<std::string, ModuleFactory>& layer_factories() {
  using namespace nn;
  using O = const ModuleOptions&;
  static const std::map<std::string, ModuleFactory> factories{
      {"linear", [](O o) { return std::make_shared<Linear>(4, 3, true, o); }},
      {"linear_nobias_3d", [](O o) { return std::make_shared<Linear>(4, 3, false, o); }},
      {"linear_float32", [](O o) { return std::make_shared<Linear>(5, 2, true, o); }},
      {"conv2d", [](O o) { return std::make_shared<Conv2d>(2, 3, 3, Conv2dConfig{.padding = 1}, o); }},
      {"conv2d_strided_grouped",
       [](O o) {
         return std::make_shared<Conv2d>(
             4, 4, Size2{3, 2},
             Conv2dConfig{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2, .bias = false}, o);
       }},
      {"conv2d_float32", [](O o) { return std::make_shared<Conv2d>(3, 2, 2, Conv2dConfig{.stride = 2}, o); }},
      {"conv_transpose2d",
       [](O o) {
         return std::make_shared<ConvTranspose2d>(
             2, 3, 3, ConvTranspose2dConfig{.stride = 2, .padding = 1, .output_padding = 1}, o);
       }},
      {"conv_transpose2d_grouped",
       [](O o) {
         return std::make_shared<ConvTranspose2d>(
             4, 2, Size2{2, 3},
             ConvTranspose2dConfig{
                 .stride = {1, 2}, .padding = {0, 1}, .output_padding = {0, 1}, .dilation = {2, 1}, .groups = 2},
             o);
       }},
      {"batchnorm1d", [](O o) { return std::make_shared<BatchNorm1d>(3, BatchNormConfig{}, o); }},
      {"batchnorm1d_3d_cumulative",
       [](O o) {
         return std::make_shared<BatchNorm1d>(2, BatchNormConfig{.momentum = std::nullopt, .affine = false}, o);
       }},
      {"batchnorm2d",
       [](O o) { return std::make_shared<BatchNorm2d>(3, BatchNormConfig{.eps = 1e-3, .momentum = 0.3}, o); }},
      {"batchnorm2d_no_running_stats",
       [](O o) { return std::make_shared<BatchNorm2d>(2, BatchNormConfig{.track_running_stats = false}, o); }},
      {"batchnorm2d_float32", [](O o) { return std::make_shared<BatchNorm2d>(2, BatchNormConfig{}, o); }},
      {"layernorm",
       [](O o) {
         return std::make_shared<LayerNorm>(Shape{3, 4}, LayerNormConfig{}, o);
       }},
      {"layernorm_noaffine",
       [](O o) {
         return std::make_shared<LayerNorm>(Shape{5}, LayerNormConfig{.eps = 1e-3, .elementwise_affine = false}, o);
       }},
      {"groupnorm", [](O o) { return std::make_shared<GroupNorm>(2, 4, GroupNormConfig{}, o); }},
      {"groupnorm_noaffine_3d",
       [](O o) { return std::make_shared<GroupNorm>(3, 6, GroupNormConfig{.eps = 1e-3, .affine = false}, o); }},
      {"relu", [](O) { return std::make_shared<ReLU>(); }},
      {"leaky_relu", [](O) { return std::make_shared<LeakyReLU>(0.2); }},
      {"elu", [](O) { return std::make_shared<ELU>(0.5); }},
      {"sigmoid", [](O) { return std::make_shared<Sigmoid>(); }},
      {"tanh", [](O) { return std::make_shared<Tanh>(); }},
      {"softplus", [](O) { return std::make_shared<Softplus>(2.0, 1.5); }},
      {"maxpool2d", [](O) { return std::make_shared<MaxPool2d>(2); }},
      {"maxpool2d_padded_ceil",
       [](O) { return std::make_shared<MaxPool2d>(3, MaxPool2dConfig{.stride = 2, .padding = 1, .ceil_mode = true}); }},
      {"maxpool2d_dilated",
       [](O) { return std::make_shared<MaxPool2d>(2, MaxPool2dConfig{.stride = 1, .dilation = 2}); }},
      {"avgpool2d", [](O) { return std::make_shared<AvgPool2d>(2); }},
      {"avgpool2d_padded_ceil",
       [](O) {
         return std::make_shared<AvgPool2d>(
             3, AvgPool2dConfig{.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false});
       }},
      {"avgpool2d_ceil_count_pad",
       [](O) { return std::make_shared<AvgPool2d>(3, AvgPool2dConfig{.stride = 2, .padding = 1, .ceil_mode = true}); }},
      {"adaptive_avg_pool2d",
       [](O) {
         return std::make_shared<AdaptiveAvgPool2d>(Size2{2, 3});
       }},
      {"adaptive_avg_pool2d_global", [](O) { return std::make_shared<AdaptiveAvgPool2d>(1); }},
      {"upsample_nearest_size",
       [](O) {
         return std::make_shared<Upsample>(UpsampleConfig{.size = Size2{5, 7}});
       }},
      {"upsample_nearest_scale", [](O) { return std::make_shared<Upsample>(UpsampleConfig{.scale_factor = 2.0}); }},
      {"upsample_bilinear_align_corners",
       [](O) {
         return std::make_shared<Upsample>(
             UpsampleConfig{.size = Size2{5, 6}, .mode = UpsampleMode::Bilinear, .align_corners = true});
       }},
      {"upsample_bilinear_scale",
       [](O) {
         return std::make_shared<Upsample>(
             UpsampleConfig{.scale_factor = Scale2{2.0, 3.0}, .mode = UpsampleMode::Bilinear});
       }},
      {"flatten", [](O) { return std::make_shared<Flatten>(); }},
      {"flatten_range", [](O) { return std::make_shared<Flatten>(0, 1); }},
      {"sequential_cnn",
       [](O o) {
         return std::make_shared<Sequential>(Conv2d(1, 4, 3, {.padding = 1}, o), BatchNorm2d(4, {}, o), ReLU(),
                                             MaxPool2d(2), Flatten(), Linear(16, 3, true, o));
       }},
  };
  return factories;
}

}  // namespace evenflow::testing
