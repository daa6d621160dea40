// evenflow: the whole public API in one include.
#pragma once

#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/transforms.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "layers/layers.h"
#include "optim/optim.h"
