// Optimizers, learning-rate schedules and gradient clipping in one include.
#pragma once

#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
