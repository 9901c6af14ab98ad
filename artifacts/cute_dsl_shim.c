/* The one CuTe DSL runtime helper that TVM-FFI exports call and that only the 43 MB
 * libcute_dsl_runtime.so defines: it turns a CUDA error code into a raised TVM-FFI error.
 * Defining it here lets a bundle's library need nothing but libtvm_ffi at load time. */
#include <stdint.h>
#include <stdio.h>

typedef void (*set_raised_from_parts)(const char *kind, const char **parts, int32_t num_parts);

extern const char *cudaGetErrorName(int code);
extern const char *cudaGetErrorString(int code);

void CuteDSLRT_TVMFFISetRaisedCudaError(set_raised_from_parts set_error, int32_t code) {
  char number[16];
  snprintf(number, sizeof number, "%d", (int)code);
  const char *parts[] = {"CUDA error ", number, " (", cudaGetErrorName(code), "): ",
                         cudaGetErrorString(code)};
  set_error("RuntimeError", parts, 6);
}
