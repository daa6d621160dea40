// Every layer in one include: Module and its subclasses.
#pragma once

#include "layers/activation.h"
#include "layers/conv.h"
#include "layers/dropout.h"
#include "layers/flatten.h"
#include "layers/init.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/normalization.h"
#include "layers/pooling.h"
#include "layers/sequential.h"
