/* Whether the driver's host cost of one launch depends on how the parameters reach it: cuLaunchKernel with
 * kernelParams (an array of pointers, what forge-aot's C launcher and Triton's pass), with `extra`
 * (CU_LAUNCH_PARAM_BUFFER_POINTER: the packed parameter block itself), and cuLaunchKernelEx with kernelParams
 * (Triton 3.6's launcher). Bursts of BATCH launches after a synchronize (the queue never fills), so each figure is
 * the host's own cost of one launch; the modes are interleaved round by round.
 *   cc -O2 -o /tmp/probe_launch_modes benchmarks/results/session55/probe_launch_modes.c -ldl
 *   /tmp/probe_launch_modes CUBIN FUNCTION LAYOUT CALLS BATCH ROUNDS
 * LAYOUT names each parameter of the cubin's kernel in order: p (8-byte pointer), i (4-byte integer), f (4-byte
 * float), e.g. "pppipp" for the add kernel (x, y, out, n, Triton's global and profile scratch pointers). Every
 * pointer points into a zeroed buffer; integers are 0 (the benchmark kernels then mask every access off). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*fn_t)();
static fn_t sym(void *lib, const char *name) {
  fn_t f = (fn_t)dlsym(lib, name);
  if (!f) { fprintf(stderr, "missing %s\n", name); exit(2); }
  return f;
}
#define CHECK(x) do { int rc_ = (x); if (rc_) { fprintf(stderr, "%s failed: %d\n", #x, rc_); exit(1); } } while (0)
static int cmp(const void *a, const void *b) { double d = *(double *)a - *(double *)b; return (d > 0) - (d < 0); }

typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; void *stream; void *attrs; unsigned n_attrs; } LaunchConfig;

int main(int argc, char **argv) {
  if (argc < 7) { fprintf(stderr, "usage: probe_launch_modes CUBIN FUNCTION LAYOUT CALLS BATCH ROUNDS\n"); return 2; }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { fprintf(stderr, "no libcuda.so.1\n"); return 2; }
  fn_t cuInit = sym(lib, "cuInit"), cuDeviceGet = sym(lib, "cuDeviceGet"),
       cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain"), cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent"),
       cuModuleLoadData = sym(lib, "cuModuleLoadData"), cuModuleGetFunction = sym(lib, "cuModuleGetFunction"),
       cuMemAlloc = sym(lib, "cuMemAlloc_v2"), cuLaunchKernel = sym(lib, "cuLaunchKernel"),
       cuLaunchKernelEx = sym(lib, "cuLaunchKernelEx"), cuCtxSynchronize = sym(lib, "cuCtxSynchronize"),
       cuCtxGetCurrent = sym(lib, "cuCtxGetCurrent");
  FILE *f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 2; }
  fseek(f, 0, SEEK_END); long size = ftell(f); fseek(f, 0, SEEK_SET);
  char *image = malloc(size); if (fread(image, 1, size, f) != (size_t)size) return 2; fclose(f);
  const char *layout = argv[3];
  int calls = atoi(argv[4]), batch = atoi(argv[5]), rounds = atoi(argv[6]), dev;
  void *ctx, *module, *function; uint64_t dptr;
  CHECK(cuInit(0)); CHECK(cuDeviceGet(&dev, 0)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx)); CHECK(cuModuleLoadData(&module, image));
  CHECK(cuModuleGetFunction(&function, module, argv[2])); CHECK(cuMemAlloc(&dptr, (size_t)256 << 20));
  unsigned char block[512] __attribute__((aligned(16)));
  void *params[64];
  size_t off = 0;
  memset(block, 0, sizeof(block));
  for (int i = 0; layout[i]; i++) {
    size_t sz = layout[i] == 'p' ? 8 : 4;
    off = (off + sz - 1) / sz * sz;
    if (layout[i] == 'p') memcpy(block + off, &dptr, 8);
    params[i] = block + off;
    off += sz;
  }
  size_t block_size = (off + 7) / 8 * 8;
  void *extra[] = {(void *)1 /* CU_LAUNCH_PARAM_BUFFER_POINTER */, block, (void *)2 /* ..._SIZE */, &block_size,
                   (void *)0 /* CU_LAUNCH_PARAM_END */};
  const char *names[] = {"cuLaunchKernel(kernelParams)", "cuLaunchKernel(extra buffer)",
                         "cuLaunchKernelEx(kernelParams)", "cuCtxGetCurrent + cuLaunchKernel(kernelParams)"};
  enum { MODES = 4 };
  double *us = calloc((size_t)MODES * rounds, sizeof(double));
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < MODES; k++) {
      int m = (k + r) % MODES;  /* rotate the order round by round */
      double ns = 0;
      for (int done = 0; done < calls;) {
        int burst = batch < calls - done ? batch : calls - done;
        struct timespec t0, t1;
        LaunchConfig config = {4, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
        void *cur = NULL;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < burst; i++) {
          if (m == 0) CHECK(cuLaunchKernel(function, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
          else if (m == 1) CHECK(cuLaunchKernel(function, 4, 1, 1, 128, 1, 1, 0, NULL, NULL, extra));
          else if (m == 2) CHECK(cuLaunchKernelEx(&config, function, params, NULL));
          else { CHECK(cuCtxGetCurrent(&cur)); CHECK(cuLaunchKernel(function, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL)); }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        CHECK(cuCtxSynchronize());
        ns += (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
        done += burst;
      }
      us[m * rounds + r] = ns / 1e3 / calls;
    }
  }
  for (int m = 0; m < MODES; m++) {
    qsort(us + m * rounds, rounds, sizeof(double), cmp);
    printf("%-48s %.3f us  (%.3f - %.3f)\n", names[m], us[m * rounds + rounds / 2], us[m * rounds],
           us[m * rounds + rounds - 1]);
  }
  return 0;
}
