// Test kernels for early (programmatic dependent) launches: they wait for the grid before them,
// as every rocmforge kernel does, before touching memory. Compiled to PTX (checked in as
// test_kernels_sm90.ptx) with:
//   nvcc -ptx -arch=compute_90 -o test_kernels_sm90.ptx test_kernels_sm90.cu
#include "test_kernels_coop.cu"
extern "C" __global__ void add_one_waiting(float* data, unsigned int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}

// coop_rounds (test_kernels_coop.cu) for early cooperative launches.
extern "C" __global__ void coop_rounds_waiting(unsigned int* slots, unsigned int* out,
                                               unsigned int* counter, unsigned int shared_words,
                                               unsigned int rounds) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    coop_rounds_body(slots, out, counter, shared_words, rounds);
}
