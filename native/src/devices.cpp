// lb_device_count: lets Python pick "auto" = first GPU when the build has CUDA, else the CPU.
#include "lucebox.h"

#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

extern "C" LB_API int32_t lb_device_count(void) {
#ifdef LUCEBOX_WITH_CUDA
    // ggml-cuda reports 0 when no driver or device is present, rather than failing.
    return (int32_t) ggml_backend_cuda_get_device_count();
#else
    return 0;
#endif
}
