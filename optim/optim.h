/// @file
/// Optimizers, learning-rate schedules and gradient clipping in one include.
#pragma once

#include "evenflow/optim/clip_grad.h"
#include "evenflow/optim/lr_scheduler.h"
#include "evenflow/optim/optimizer.h"
