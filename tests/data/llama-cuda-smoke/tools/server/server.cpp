// Stands in for llama-server and llama-bench: prints the version line as they do (to stderr), then
// initialises the CUDA library, so a missing driver shows exactly as it would in the real binaries.
#include <cstdio>
#include <cstring>

extern "C" int ggml_cuda_smoke_init(void);

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fprintf(stderr, "version: %d (%s) [%s, llama-cuda-smoke]\n", BUILD_NUMBER, BUILD_COMMIT, TOOL);
    }
    return ggml_cuda_smoke_init() < 0 ? 1 : 0;
}
