/// @file
/// Every layer in one include: Module and its subclasses.
#pragma once

#include "evenflow/layers/activation.h"
#include "evenflow/layers/conv.h"
#include "evenflow/layers/dropout.h"
#include "evenflow/layers/flatten.h"
#include "evenflow/layers/init.h"
#include "evenflow/layers/linear.h"
#include "evenflow/layers/module.h"
#include "evenflow/layers/normalization.h"
#include "evenflow/layers/pooling.h"
#include "evenflow/layers/sequential.h"
