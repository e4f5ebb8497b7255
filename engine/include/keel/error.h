// keel::Error and KEEL_CHECK live in the shared vocabulary (keel/base/error.h); this header keeps
// the engine's include path.
#pragma once
#include "keel/base/error.h"
