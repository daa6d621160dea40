// evenflow: the whole public API in one include.
#pragma once

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "layers/layers.h"
#include "optim/optim.h"
