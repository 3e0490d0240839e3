// Test kernels for gpu-mem's GPU tests. Compiled to PTX (checked in as test_kernels.ptx) with:
//   nvcc -ptx -arch=compute_80 -o test_kernels.ptx test_kernels.cu
extern "C" __global__ void iota_scaled(float* out, float scale, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = scale * (float)i;
}

extern "C" __global__ void add_one(float* data, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}
