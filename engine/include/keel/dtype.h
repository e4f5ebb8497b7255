// Element types live in the shared vocabulary (keel/base/dtype.h); this header keeps the engine's
// include path.
#pragma once
#include "keel/base/dtype.h"
