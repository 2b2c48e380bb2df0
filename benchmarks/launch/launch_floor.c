/* The hardware floor of a launch from the host: cuLaunchKernel in a C loop on a cubin forge-aot packaged.
 * No CUDA headers or link step: the driver is opened with dlopen, as the forge-aot runtime does with ctypes.
 *   cc -O2 -o /tmp/launch_floor benchmarks/launch/launch_floor.c -ldl
 *   /tmp/launch_floor CUBIN FUNCTION NARGS CALLS [BATCH]   →  microseconds per launch (median of 5 rounds)
 * Without BATCH the CALLS launches run back to back: once the driver's queue is full the loop runs at the GPU's
 * pace for these tiny kernels. With BATCH, only bursts of BATCH launches are timed, each after a synchronize, so
 * the queue never fills and the figure is the host's own cost of one cuLaunchKernel.  * Every argument is passed as a 64-bit slot pointing into a zeroed 256 MB device buffer or holding 0, which
 * is what the benchmark kernels read with n = 0 (each program's loads and stores are masked off). */
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

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage: launch_floor CUBIN FUNCTION NARGS CALLS\n"); return 2; }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { fprintf(stderr, "no libcuda.so.1\n"); return 2; }
  fn_t cuInit = sym(lib, "cuInit"), cuDeviceGet = sym(lib, "cuDeviceGet"),
       cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain"), cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent"),
       cuModuleLoadData = sym(lib, "cuModuleLoadData"), cuModuleGetFunction = sym(lib, "cuModuleGetFunction"),
       cuMemAlloc = sym(lib, "cuMemAlloc_v2"), cuLaunchKernel = sym(lib, "cuLaunchKernel"),
       cuCtxSynchronize = sym(lib, "cuCtxSynchronize");
  FILE *f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 2; }
  fseek(f, 0, SEEK_END); long size = ftell(f); fseek(f, 0, SEEK_SET);
  char *image = malloc(size); if (fread(image, 1, size, f) != (size_t)size) return 2; fclose(f);
  int nargs = atoi(argv[3]), calls = atoi(argv[4]), batch = argc > 5 ? atoi(argv[5]) : 0, dev; void *ctx, *module, *function; uint64_t dptr;
  CHECK(cuInit(0)); CHECK(cuDeviceGet(&dev, 0)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx)); CHECK(cuModuleLoadData(&module, image));
  CHECK(cuModuleGetFunction(&function, module, argv[2])); CHECK(cuMemAlloc(&dptr, (size_t)256 << 20));
  uint64_t slots[64]; void *params[64];
  for (int i = 0; i < nargs + 2; i++) { slots[i] = (i < nargs) ? dptr : 0; params[i] = &slots[i]; }
  /* n = 0 for the benchmark kernels: argument 3 of the add kernel, 5 of args19 */
  slots[nargs == 4 ? 3 : 5] = 0;
  double us[5];
  for (int r = 0; r < 5; r++) {
    struct timespec t0, t1;
    double ns = 0;
    for (int done = 0; done < calls;) {
      int burst = batch > 0 ? batch : calls;
      if (burst > calls - done) burst = calls - done;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      for (int i = 0; i < burst; i++) CHECK(cuLaunchKernel(function, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
      clock_gettime(CLOCK_MONOTONIC, &t1);
      CHECK(cuCtxSynchronize());
      ns += (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
      done += burst;
    }
    us[r] = ns / 1e3 / calls;
  }
  qsort(us, 5, sizeof(double), cmp);
  printf("%.3f\n", us[2]);
  return 0;
}
