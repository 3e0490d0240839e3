// Test kernel for early (programmatic dependent) launches: it waits for the grid before it, as
// every rocmforge kernel does, before touching memory. Compiled to PTX (checked in as
// test_kernels_sm90.ptx) with:
//   nvcc -ptx -arch=compute_90 -o test_kernels_sm90.ptx test_kernels_sm90.cu
extern "C" __global__ void add_one_waiting(float* data, unsigned int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}
